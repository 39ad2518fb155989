// Handoffs: the planned handovers of this agent's ranges (`fleetfs handoff`,
// `fleetfs drain`), as a pure step function on time passed in, in the style
// of Lifecycle: it decides, the libuv shell in agent.cc carries it out.
//
// One range travels:
//
//   draining ──no open handle in it, or the shutdown grace ended──► stop work
//      (served; no new opens)                       (withdrawn: hidden and
//                                                    fenced, then the final
//                                                    flush of its tenants)
//   stop work ──every commit shipped──► releasing ──store answered──► done
//             └─ not all shipped in time ──► abandoned (served again)
//
// While draining and during the stop work the lease is renewed as usual: an
// unshipped commit must not become another host's to restore over. Releasing
// asks HostOwnership::StartHandoff (which waits while a store call of the
// range may still land), then the store's Offer (to the target) or Release
// (a drain with no target). Done: the range is parked, claimed again only
// after `fleetfs drain --undo`, a restart, or (handed off alone, not by a
// drain) an offer back to this agent.
//
// Thread-safety: none; the loop thread owns it.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/lifecycle.h"
#include "fleet/clock.h"
#include "fleet/status.h"
#include "lease/host_ownership.h"
#include "lease/owner_id.h"
#include "lease/ownership_table.h"
#include "lease/slot_range.h"

namespace fleetfs::agent {

// A request written to MOUNT/.fleetfs/control, one line:
//   handoff RANGE to OWNER  hand one configured range to OWNER
//   drain to OWNER          hand every served range to OWNER
//   drain release           release every range (no target)
//   undo                    let drained ranges be claimed again
// OWNER is the rest of the line (an owner id may hold inner spaces, or be
// "release" or "-"); no target is the keyword, never an owner value.
struct ControlRequest {
  enum class Verb { kHandoff, kDrain, kUndo };
  Verb verb = Verb::kHandoff;
  std::optional<lease::SlotRange> range;  // kHandoff
  std::optional<lease::OwnerId> to;       // kHandoff; kDrain unless released
};

// Strict: at most kMaxControlRequestBytes, one line (a final newline
// allowed), the words before " to " split by single spaces, the range by
// SlotRange::Parse and the owner by OwnerId::Make.
// InvalidArgument naming the word and the rule otherwise.
inline constexpr std::size_t kMaxControlRequestBytes = 512;
Result<ControlRequest> ParseControlRequest(std::string_view text);
std::string FormatControlRequest(const ControlRequest& request);

// Whether this agent can carry out `request` at all. A handoff to an owner
// needs a store that keeps offers and a replica: without replication the
// target would restore nothing, so "handed off" would move no data. A drain
// with no target (release only) is allowed without a replica.
Status CheckControl(const ControlRequest& request, bool keeps_offers, bool replicating);

struct HandoffOptions {
  Millis shutdown_grace{5000};
  // The stop work (fences and flush) gets this long; then the handoff is
  // abandoned and the range served again. Two refresh intervals by default.
  Millis flush_limit{20000};
  // How long an offer stands (the lease ttl).
  Millis offer_window{30000};
};

struct HandoffActions {
  std::vector<LogLine> log;
  bool publish = false;                   // the draining or withheld ranges changed
  std::vector<lease::SlotRange> stop_work;  // fence, then flush these; then StopWorkDone
  // HostOwnership::StartHandoff, then Offer or Release; then Released.
  std::vector<lease::SlotRange> release;
  // Given back by an undo that came while their offer or release was out:
  // unpark (HostOwnership already did, at the answer) and claim them now.
  std::vector<lease::SlotRange> claim;
  MonoTime wake = MonoTime::max();
};

struct HandoffStatus {
  lease::SlotRange range = lease::SlotRange::All();
  std::string to;     // empty: released with no target
  std::string state;  // draining, fencing, releasing, done, abandoned
  std::string note;   // why abandoned, or what the release answered
};

class Handoffs {
 public:
  explicit Handoffs(HandoffOptions options) : options_(options) {}

  // Starts handing `range` to `to` (nullopt: release it) at `now`. Refused
  // (InvalidArgument) when the range is not exactly a configured one, not
  // served now, already being handed off, or `to` is this agent itself.
  Status Request(MonoTime now, lease::SlotRange range, const std::optional<lease::OwnerId>& to,
                 const std::vector<lease::RangeStatus>& status, const lease::OwnerId& self);

  // A wake. `open_in(range)` counts the open handles of a range.
  template <typename OpenIn>
  HandoffActions Step(MonoTime now, OpenIn&& open_in) {
    HandoffActions out;
    for (auto& [range, h] : handoffs_) {
      if (h.step == StepKind::kDraining) {
        const std::size_t open = open_in(range);
        if (open == 0 || now >= h.drain_deadline) {
          StartStopWork(now, range, h, open, out);
        } else {
          Wake(out, std::min(now + Millis(20), h.drain_deadline));
        }
      } else if (h.step == StepKind::kStopWork && now >= h.stop_deadline) {
        Abandon(range, h, "the fences and the final flush did not end within " +
                              FormatMs(options_.flush_limit), out);
      } else if (h.step == StepKind::kStopWork) {
        Wake(out, h.stop_deadline);
      } else if (h.step == StepKind::kReleaseWait) {
        // A store call of the range was running: ask again.
        h.step = StepKind::kReleasing;
        out.release.push_back(range);
      }
    }
    return out;
  }

  // What `fleetfs drain` does, decided before anything starts (all or
  // nothing): the served ranges are handed off, the ranges not held are
  // parked. Refused when any range is held but not served (its renewals
  // fail): its commits cannot be flushed now, and releasing it unshipped
  // would lose them; it is handed off once served again, or left to lapse.
  struct DrainPlan {
    std::vector<lease::SlotRange> hand_off;
    std::vector<lease::SlotRange> park;
  };
  Result<DrainPlan> PlanDrain(const std::optional<lease::OwnerId>& to,
                              const std::vector<lease::RangeStatus>& status,
                              const lease::OwnerId& self) const;
  // Starts `plan` (from PlanDrain; the caller parked plan.park already).
  // Every range of the plan is drained until Undo: see Forget.
  Status Drain(MonoTime now, const DrainPlan& plan, const std::optional<lease::OwnerId>& to,
               const std::vector<lease::RangeStatus>& status, const lease::OwnerId& self);

  // The fences and the flush of `range` ended. At most one stop-work job
  // per range exists (Request refuses while an abandoned handoff's job
  // still runs), so the result is the current handoff's.
  // `may_call_store` is Lifecycle::renews(). A shutdown (SIGTERM) does not
  // stop a handoff while it still renews (draining, its own fences and
  // flush): the range is fenced with every commit shipped, so the offer
  // loses nothing and the target claims at once, not a refresh after the
  // shutdown's plain release. Once it renews no more, the shutdown waits
  // for running store calls before its release rule and starts none, so
  // no offer starts either (one outliving ttl/3 would make every range
  // lapse): the handoff ends done, and the held range goes with the
  // shutdown's release.
  HandoffActions StopWorkDone(MonoTime now, lease::SlotRange range, bool all_shipped,
                              bool may_call_store);
  // HostOwnership::StartHandoff said wait: ask again at the next step.
  HandoffActions ReleaseWaits(MonoTime now, lease::SlotRange range);
  // The store answered the offer or release (or none was needed: `sent` false).
  HandoffActions Released(MonoTime now, lease::SlotRange range, bool sent,
                          const Result<bool>& answer);

  // Served, but taking no new opens.
  std::set<lease::SlotRange> draining() const;
  // Not served at all (fenced, flushing, releasing, handed off).
  std::set<lease::SlotRange> withheld() const;
  // Whether any handoff still runs (not done, not abandoned).
  bool running() const;
  std::vector<HandoffStatus> Report() const;
  // `fleetfs drain --undo`: forget the finished handoffs (the caller
  // unparks their ranges). Running ones go on, except one whose offer or
  // release is out: HostOwnership::Unpark lets that range be claimed once
  // the store answers, so Released forgets the handoff then, whatever the
  // answer, and the range is claimed and served again (not left parked
  // here while held). One still waiting to send (StartHandoff said wait)
  // is not parked yet, so it goes on and ends parked.
  std::vector<lease::SlotRange> Undo();
  // Whether a handoff's offer window ended by `now` and OffersNotTaken
  // needs a read of the rows (the offer poll reads only the offers else).
  bool AwaitsOfferEnd(MonoTime now) const;
  // The offer windows that ended unclaimed, per a read of the store at
  // store time `store_now`: every row in the range is this agent's, lapsed,
  // with no offer standing, or there is none (etcd deletes the offering row,
  // and the offer goes with its window). Their handoffs are forgotten
  // (logged); the caller unparks the ranges and claims them the normal way
  // (the store decides: a row the read missed refuses the claim). Another
  // owner's row in the range means taken: the range stays parked, and that
  // handoff awaits its offer's end no more (AwaitsOfferEnd).
  // `table` must hold the rows of the range (ReadSlots of its ends), not
  // only the offers.
  std::vector<lease::SlotRange> OffersNotTaken(MonoTime now, const lease::OwnershipTable& table,
                                               const lease::OwnerId& self,
                                               std::int64_t store_now,
                                               std::vector<LogLine>& log);
  // The range was offered to this agent while parked here: forget its
  // finished handoff (the caller unparks it and claims). A range handed off
  // alone is taken back so (a handoff back). False while one still runs,
  // and for a drained range until Undo: a drain is the operator's promise
  // that this host takes nothing (maintenance), whether it gave the range
  // up or never held it, so the offer is left to its window; then the
  // offering host, seeing it not taken, claims the range again.
  bool Forget(lease::SlotRange range);
  // Whether `range` is part of a drain not undone yet.
  bool drained(lease::SlotRange range) const { return drained_.contains(range); }

 private:
  enum class StepKind { kDraining, kStopWork, kReleasing, kReleaseWait, kDone, kAbandoned };
  struct One {
    std::optional<lease::OwnerId> to;
    StepKind step = StepKind::kDraining;
    MonoTime drain_deadline{};
    MonoTime stop_deadline{};
    std::string note;
    // The fences-and-flush job on the pool has not reported yet; it may
    // outlive an abandoned handoff.
    bool job_running = false;
    // Set when the store took the offer: the window ends then.
    std::optional<MonoTime> offer_end;
    // An undo came while the offer or release was out (see Undo).
    bool undone = false;
  };

  Status Check(lease::SlotRange range, const std::optional<lease::OwnerId>& to,
               const std::vector<lease::RangeStatus>& status, const lease::OwnerId& self) const;
  void StartStopWork(MonoTime now, lease::SlotRange range, One& h, std::size_t open,
                     HandoffActions& out);
  void Abandon(lease::SlotRange range, One& h, std::string why, HandoffActions& out);
  static void Wake(HandoffActions& out, MonoTime at) { out.wake = std::min(out.wake, at); }
  static std::string FormatMs(Millis ms);
  static std::string Describe(lease::SlotRange range, const One& h);

  HandoffOptions options_;
  std::map<lease::SlotRange, One> handoffs_;
  std::set<lease::SlotRange> drained_;  // every range of a drain, until Undo
};

// OfferWatch: while a configured range is not held here (another owner
// holds it, or this agent handed it off), reads the store every `interval`
// for an offer to this agent (ReadSlots of those ranges: one cheap read), so
// a handoff's target claims at once instead of at its next refresh. One read
// at a time.
class OfferWatch {
 public:
  explicit OfferWatch(Millis interval) : interval_(interval) {}

  // Whether to send a read now; `unheld` are the ranges not held here.
  bool Due(MonoTime now, const std::vector<lease::SlotRange>& unheld);
  // When Due may next say yes (max when nothing is watched).
  MonoTime next(const std::vector<lease::SlotRange>& unheld) const;
  // The read sent at Due answered: the ranges of `unheld` with an offer to
  // `self` standing at store time `store_now`, whose row is exactly that
  // range (or inside it with no other live row or offer in the range; a
  // claim of a bigger range would be refused by that row, every poll).
  // Each offer (row range and epoch) is reported once.
  std::vector<lease::SlotRange> Answered(const Result<lease::OwnershipTable>& table,
                                         const std::vector<lease::SlotRange>& unheld,
                                         const lease::OwnerId& self, std::int64_t store_now);

 private:
  Millis interval_;
  bool reading_ = false;
  MonoTime last_{};
  std::set<std::pair<lease::SlotRange, lease::Epoch>> reported_;
};

}  // namespace fleetfs::agent
