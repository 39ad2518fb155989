#include "lease/refresher.h"

namespace fleetfs::lease {

Refresher::Refresher(HostOwnership host, std::shared_ptr<OwnershipStore> store,
                     const MonotonicClock& clock, Executor executor)
    : shared_(std::make_shared<Shared>(std::move(store), clock, std::move(executor),
                                       std::move(host))) {}

void Refresher::SetReportListener(ReportListener listener) {
  std::lock_guard lock(shared_->mu);
  shared_->listener = std::move(listener);
}

RefreshReport Refresher::Finish(Shared& shared, std::unique_lock<std::mutex>& lock) {
  RefreshReport report = shared.host.EndRefresh();
  ReportListener listener = shared.listener;
  lock.unlock();
  if (listener) listener(report);
  return report;
}

bool Refresher::Start() {
  std::vector<StoreCall> calls;
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->host.refresh_open() || shared_->host.stopping()) return false;
    const MonoTime now = shared_->clock.Now();
    shared_->started = now;
    calls = shared_->host.BeginRefresh(now);
  }
  const OwnerId& owner = shared_->host.owner();  // never changes
  const Millis ttl = shared_->host.ttl();
  for (const StoreCall& call : calls) {
    shared_->executor([shared = shared_, call, owner, ttl] {
      Result<Decision> answer =
          call.kind == StoreCall::Kind::kClaim
              ? shared->store->Claim(call.range, owner, ttl, call.floor)
              : shared->store->Renew(call.range, owner, call.epoch, ttl);
      std::unique_lock lock(shared->mu);
      ++shared->answered;
      const bool was_open = shared->host.refresh_open();
      shared->host.Answer(call.id, answer);
      if (was_open && shared->host.AllAnswered()) Finish(*shared, lock);
    });
  }
  // A refresh with no call to wait for (every range still running) ends now.
  std::unique_lock lock(shared_->mu);
  if (shared_->host.refresh_open() && shared_->host.AllAnswered()) Finish(*shared_, lock);
  return true;
}

std::uint64_t Refresher::answered() const {
  std::lock_guard lock(shared_->mu);
  return shared_->answered;
}

std::optional<RefreshReport> Refresher::Tick() {
  std::unique_lock lock(shared_->mu);
  const MonoTime deadline = shared_->started + shared_->host.refresh_interval();
  if (!shared_->host.refresh_open() || shared_->clock.Now() < deadline) {
    return std::nullopt;
  }
  return Finish(*shared_, lock);
}

MonoTime Refresher::NextWake() const {
  std::lock_guard lock(shared_->mu);
  const MonoTime now = shared_->clock.Now();
  // NextWake already counts the next refresh from `started`, which is also
  // the open refresh's time limit.
  return shared_->host.NextWake(shared_->started, now);
}

std::optional<Epoch> Refresher::EpochFor(Slot slot) const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.EpochFor(slot, shared_->clock.Now());
}

std::vector<std::pair<SlotRange, Epoch>> Refresher::Serving() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.Serving(shared_->clock.Now());
}

std::vector<RangeStatus> Refresher::Status() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.Status(shared_->clock.Now());
}

RefreshReport Refresher::last_report() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.last_report();
}

std::optional<SlotRange> Refresher::Lose(Slot slot, Epoch newer) {
  std::lock_guard lock(shared_->mu);
  return shared_->host.Lose(slot, newer);
}

bool Refresher::Unsettled() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.Unsettled();
}

bool Refresher::refresh_open() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.refresh_open();
}

ReleasePlan Refresher::StartRelease(bool all_shipped) {
  ReleasePlan plan;
  {
    std::unique_lock lock(shared_->mu);
    if (shared_->host.refresh_open()) shared_->host.EndRefresh();
    plan = shared_->host.PlanRelease(all_shipped);
  }
  const OwnerId& owner = shared_->host.owner();
  for (const ReleaseCall& call : plan.calls) {
    shared_->executor([shared = shared_, call, owner] {
      Result<bool> released = shared->store->Release(call.range, owner, call.epoch);
      std::lock_guard lock(shared->mu);
      if (released.ok() && *released) ++shared->released;
    });
  }
  return plan;
}

Result<Refresher::HandoffSend> Refresher::StartHandoff(SlotRange range,
                                                       const std::optional<OwnerId>& to,
                                                       std::function<void(Result<bool>)> done) {
  HostOwnership::HandoffStart start;
  {
    std::lock_guard lock(shared_->mu);
    FLEETFS_ASSIGN_OR_RETURN(start, shared_->host.StartHandoff(range));
  }
  if (start.wait) return HandoffSend::kWait;
  if (!start.release) return HandoffSend::kNothingHeld;
  const OwnerId& owner = shared_->host.owner();
  const Millis window = shared_->host.ttl();
  shared_->executor([shared = shared_, call = *start.release, owner, to, window,
                     done = std::move(done)] {
    Result<bool> answer = to ? shared->store->Offer(call.range, owner, call.epoch, *to, window)
                             : shared->store->Release(call.range, owner, call.epoch);
    {
      std::lock_guard lock(shared->mu);
      shared->host.HandoffAnswered(call.range);
    }
    done(std::move(answer));
  });
  return HandoffSend::kSent;
}

void Refresher::Unpark(SlotRange range) {
  std::lock_guard lock(shared_->mu);
  shared_->host.Unpark(range);
}

bool Refresher::ParkUnheld(SlotRange range) {
  std::lock_guard lock(shared_->mu);
  return shared_->host.ParkUnheld(range);
}

bool Refresher::parked(SlotRange range) const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.parked(range);
}

std::vector<SlotRange> Refresher::UnheldRanges() const {
  std::lock_guard lock(shared_->mu);
  return shared_->host.UnheldRanges();
}

int Refresher::released() const {
  std::lock_guard lock(shared_->mu);
  return shared_->released;
}

}  // namespace fleetfs::lease
