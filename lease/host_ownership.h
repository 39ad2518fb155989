// HostOwnership: this host's side of the ownership table, as a pure state
// machine. It decides which store calls to make, takes their answers, and
// says which ranges this host may serve now. The caller owns threads, timers
// and the store (see Refresher, and the agent's libuv loop).
//
// A refresh (every ttl/3) sends one call per configured range at once: a
// claim for a range not held, a renew for a held one. Each call has ttl/3 to
// answer. A call that times out keeps running in the store; its range makes
// no new call until it ends ("still running"), and its late answer never
// extends a lease (a late "lost" still drops the range: the safe side).
//
// The local lease of a range is valid until the monotonic time its claim or
// renew was sent + ttl - ttl/3. So this host stops serving at least ttl/3
// before any other host can claim the range, if clocks agree within ttl/3.
//
// Fence floor: when a replicator sees a newer epoch for a slot (Lose), the
// range holding it is dropped at once, and its next claim goes above that
// epoch; a grant below the floor counts as lost.
//
// Thread-safety: none; one thread (or a caller's mutex) owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "lease/ownership_table.h"

namespace fleetfs::lease {

// One call to the store that the caller must make and answer.
struct StoreCall {
  enum class Kind { kClaim, kRenew };
  std::uint64_t id = 0;
  SlotRange range = SlotRange::All();
  Kind kind = Kind::kClaim;
  Epoch epoch;              // kRenew: the held epoch
  std::uint64_t floor = 0;  // kClaim: claim above this epoch
};

struct ReleaseCall {
  SlotRange range;
  Epoch epoch;
};

// What a range did in a refresh.
enum class RangeOutcome {
  kNotYet,        // no refresh has answered for it yet
  kClaimed,
  kRenewed,
  kLost,          // another host holds it now, or a newer epoch fenced it
  kWaiting,       // another host holds a live lease on it
  kFailed,        // the store call failed
  kTimedOut,      // the store call did not answer within ttl/3
  kStillRunning,  // an earlier call has not answered yet
  kHandedOff,     // released by a handoff or a drain; not claimed until unparked
};

std::string_view OutcomeName(RangeOutcome outcome);

inline constexpr std::string_view kTimedOutText = "the store call timed out";
inline constexpr std::string_view kStillRunningText = "the last store call is still running";

struct Waiting {
  SlotRange range;  // the configured range
  Held holder;      // who holds (part of) it, and until when

  bool operator==(const Waiting&) const = default;
};

// What one refresh did, in the configured order of ranges.
struct RefreshReport {
  std::vector<std::pair<SlotRange, Epoch>> claimed;
  std::vector<SlotRange> renewed;
  std::vector<SlotRange> lost;
  std::vector<Waiting> waiting;
  std::vector<std::pair<SlotRange, std::string>> failed;  // with the reason
};

// One configured range, as operators see it.
struct RangeStatus {
  SlotRange range = SlotRange::All();
  std::optional<Epoch> epoch;  // the held epoch, serving or not
  bool serving = false;
  Millis lease_left{0};        // of the local lease; 0 when not serving
  MonoTime valid_until{};      // the local lease's end, when serving
  RangeOutcome last = RangeOutcome::kNotYet;
  std::optional<Held> holder;  // when waiting
  std::string failure;         // when failed, timed out or still running
  bool call_running = false;
  std::uint64_t fence_floor = 0;
};

// Why ranges are released, or why they are left to lapse.
struct ReleasePlan {
  std::vector<ReleaseCall> calls;  // empty when the ranges lapse instead
  std::string lapse_reason;        // why not released; empty when released
};

class HostOwnership {
 public:
  // InvalidArgument for no range, overlapping ranges, or a ttl out of 3-3600 s.
  static Result<HostOwnership> Make(OwnerId owner, std::vector<SlotRange> ranges, Millis ttl);

  const OwnerId& owner() const { return owner_; }
  Millis ttl() const { return ttl_; }
  // How often to refresh, and each call's time limit: ttl/3.
  Millis refresh_interval() const { return ttl_ / 3; }
  std::vector<SlotRange> ranges() const;

  // Starts a refresh at `now`: the calls to send, one per range that has no
  // call running. Precondition: no refresh is open.
  std::vector<StoreCall> BeginRefresh(MonoTime now);
  bool refresh_open() const { return refresh_open_; }
  // Whether every call of the open refresh has answered.
  bool AllAnswered() const;
  // The answer to call `id`, arriving at `now`. Unknown ids are ignored.
  void Answer(std::uint64_t id, const Result<Decision>& answer);
  // Ends the open refresh (at its time limit, or once all answered): calls
  // still out count as timed out and keep running. Returns the report.
  RefreshReport EndRefresh();
  const RefreshReport& last_report() const { return last_report_; }

  // The epoch this host may serve `slot` under at `now`; nullopt when it
  // does not hold the slot or the local lease has run out.
  std::optional<Epoch> EpochFor(Slot slot, MonoTime now) const;
  // The ranges served at `now`, with their epochs.
  std::vector<std::pair<SlotRange, Epoch>> Serving(MonoTime now) const;
  // A replicator saw `newer` for `slot`: raise the floor of its range and drop
  // the range when it holds an older epoch. Returns the dropped range.
  std::optional<SlotRange> Lose(Slot slot, Epoch newer);

  // When the first local lease that still runs will end.
  std::optional<MonoTime> NextLapse(MonoTime now) const;
  // When to wake: the next refresh (ttl/3 after `refresh_started`, so a slow
  // range does not delay the others) or the next lapse, if sooner.
  MonoTime NextWake(MonoTime refresh_started, MonoTime now) const;
  // Whether a held range is past its local lease (it could not renew in time).
  bool AnyLapsed(MonoTime now) const;

  // Planned handover of one configured range (exactly its bounds). While the
  // caller drains it, the range is renewed as usual. Once nothing committed
  // is left unshipped, StartHandoff parks it: it is not served, claimed nor
  // renewed any more until Unpark, and the held epoch (if any) is returned
  // for the release (or offer) to send. nullopt with `wait` set while a call
  // of the range is running: it may still land and extend the lease, so the
  // caller asks again. InvalidArgument when the range is not configured.
  struct HandoffStart {
    bool wait = false;
    std::optional<ReleaseCall> release;  // none: the range was not held
  };
  // The release (or offer) StartHandoff returned counts as the range's
  // call until HandoffAnswered: a claim sent before it lands could be
  // granted the old epoch, and then the offer would hand that same lease
  // to the target (two hosts serving one slot).
  Result<HandoffStart> StartHandoff(SlotRange range);
  void HandoffAnswered(SlotRange range);
  // Parks a range that is not held and has no call out (a drain of a range
  // served elsewhere); false, changing nothing, otherwise.
  bool ParkUnheld(SlotRange range);
  // Lets a parked range be claimed again (a drain undone). While its
  // release or offer is out, it stays parked until that answers.
  void Unpark(SlotRange range);
  void UnparkAll();
  bool parked(SlotRange range) const;
  // The configured ranges this host does not hold (another owner holds
  // them, or they are parked): where an offer to this host may appear.
  std::vector<SlotRange> UnheldRanges() const;

  // Whether a store call may still land: any call running, or marked.
  bool Unsettled() const;
  // A call outlived the shutdown wait: never release after this.
  void MarkUnsettled() { marked_unsettled_ = true; }

  // Shutdown: stop serving everything now, and release the held ranges when
  // nothing committed is left unshipped and no store call may still land.
  // Later answers never bring a range back.
  ReleasePlan PlanRelease(bool all_shipped);
  bool stopping() const { return stopping_; }

  std::vector<RangeStatus> Status(MonoTime now) const;

 private:
  struct RangeState {
    explicit RangeState(SlotRange r) : range(r) {}
    SlotRange range;
    std::optional<Epoch> held;
    MonoTime valid_until{};
    std::uint64_t floor = 0;
    // The call that has not answered yet. It may belong to an ended refresh
    // (it timed out); a range never has two calls out.
    std::optional<StoreCall> pending;
    MonoTime pending_sent{};
    bool pending_in_refresh = false;
    RangeOutcome outcome = RangeOutcome::kNotYet;
    std::optional<Held> holder;
    std::string failure;
    bool parked = false;  // handed off: no claim until unparked
    bool handoff_call = false;  // its release or offer has not answered
    bool unpark_when_answered = false;
  };

  HostOwnership(OwnerId owner, std::vector<SlotRange> ranges, Millis ttl);
  void Apply(RangeState& state, const StoreCall& call, const Result<Decision>& answer);

  OwnerId owner_;
  Millis ttl_;
  std::vector<RangeState> states_;  // in configured order
  std::uint64_t next_call_id_ = 1;
  bool refresh_open_ = false;
  bool stopping_ = false;
  bool marked_unsettled_ = false;
  RefreshReport last_report_;
};

}  // namespace fleetfs::lease
