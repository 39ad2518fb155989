// Refresher: runs HostOwnership's store calls, each on an executor (a thread
// pool), and feeds their answers back. The caller drives time: Start() every
// refresh interval, Tick() at the call time limit and at each wake.
//
// A call that hangs keeps its task (and the store) alive after the refresh
// ends: its range reports "still running" and makes no new call until the
// answer comes. Tasks hold a shared reference to the state, so the Refresher
// may be destroyed while a call still hangs.
//
// Thread-safety: all methods are safe from any thread; one mutex guards the
// HostOwnership. A store call never runs under it, so a slow store never
// blocks a reader of EpochFor or Serving.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "fleet/clock.h"
#include "lease/host_ownership.h"
#include "lease/ownership_store.h"

namespace fleetfs::lease {

class Refresher {
 public:
  using Task = std::function<void()>;
  using Executor = std::function<void(Task)>;
  using ReportListener = std::function<void(const RefreshReport&)>;

  // `clock` must outlive every task; `store` lives as long as any task.
  Refresher(HostOwnership host, std::shared_ptr<OwnershipStore> store,
            const MonotonicClock& clock, Executor executor);

  // Called with each refresh's report, on the thread that ended it, without
  // the lock held.
  void SetReportListener(ReportListener listener);

  // Sends the calls of a new refresh; false when one is still open.
  bool Start();
  // Ends the open refresh once its time limit has passed; returns its report.
  std::optional<RefreshReport> Tick();
  // When Start (ttl/3 after the last start) or Tick (a lapse, a time limit)
  // is due next.
  MonoTime NextWake() const;

  std::optional<Epoch> EpochFor(Slot slot) const;
  std::vector<std::pair<SlotRange, Epoch>> Serving() const;
  std::vector<RangeStatus> Status() const;
  RefreshReport last_report() const;
  std::optional<SlotRange> Lose(Slot slot, Epoch newer);
  bool Unsettled() const;
  bool refresh_open() const;
  // Store calls that returned, errors included. A round ends at its time
  // limit whether or not any call ran, so only this shows that the executor
  // and the store still get through (the agent's watchdog health).
  std::uint64_t answered() const;

  // Shutdown: stops serving, and sends the releases the plan allows. Each
  // release answers later; `released()` counts the ones that went through.
  // The caller bounds the wait (ttl/3): a release that has not answered by
  // then leaves its range to lapse, which is safe.
  ReleasePlan StartRelease(bool all_shipped);
  int released() const;

  // Planned handover of `range` (HostOwnership::StartHandoff): parks it and
  // sends the store's Offer to `to`, or Release when `to` is empty. `done`
  // gets the answer on the executor's thread. kWait: a call of the range is
  // running; ask again later. kNothingHeld: parked, no call needed.
  enum class HandoffSend { kWait, kSent, kNothingHeld };
  Result<HandoffSend> StartHandoff(SlotRange range, const std::optional<OwnerId>& to,
                                   std::function<void(Result<bool>)> done);
  void Unpark(SlotRange range);
  bool parked(SlotRange range) const;
  bool ParkUnheld(SlotRange range);
  std::vector<SlotRange> UnheldRanges() const;
  const OwnerId& owner() const { return shared_->host.owner(); }
  OwnershipStore& store() const { return *shared_->store; }

 private:
  struct Shared {
    Shared(std::shared_ptr<OwnershipStore> s, const MonotonicClock& c, Executor e, HostOwnership h)
        : store(std::move(s)), clock(c), executor(std::move(e)), host(std::move(h)) {}
    std::shared_ptr<OwnershipStore> store;
    const MonotonicClock& clock;
    Executor executor;
    mutable std::mutex mu;  // guards everything below
    HostOwnership host;
    MonoTime started{};  // of the last refresh; its calls' time limit is started + ttl/3
    ReportListener listener;
    int released = 0;
    std::uint64_t answered = 0;
  };

  // Ends the refresh under `lock` and tells the listener after unlocking.
  static RefreshReport Finish(Shared& shared, std::unique_lock<std::mutex>& lock);

  std::shared_ptr<Shared> shared_;
};

}  // namespace fleetfs::lease
