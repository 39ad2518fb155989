#include "lease/timed_store.h"

namespace fleetfs::lease {

std::string_view StoreCallName(StoreCallKind call) {
  switch (call) {
    case StoreCallKind::kClaim: return "claim";
    case StoreCallKind::kRenew: return "renew";
    case StoreCallKind::kRelease: return "release";
    case StoreCallKind::kOffer: return "offer";
    case StoreCallKind::kRead: return "read";
    case StoreCallKind::kCount: break;
  }
  return "unknown";
}

TimedStore::TimedStore(std::shared_ptr<OwnershipStore> inner, const MonotonicClock& clock)
    : inner_(std::move(inner)), clock_(clock) {}

std::array<HistogramSnapshot, kStoreCallKinds> TimedStore::latencies() const {
  std::array<HistogramSnapshot, kStoreCallKinds> out;
  for (std::size_t i = 0; i < kStoreCallKinds; ++i) out[i] = latency_[i].Snapshot();
  return out;
}

template <typename Call>
auto TimedStore::Timed(StoreCallKind kind, Call&& call) {
  const MonoTime started = clock_.Now();
  auto outcome = call();
  latency_[static_cast<std::size_t>(kind)].Observe(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.Now() - started));
  return outcome;
}

Result<Decision> TimedStore::Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                                   std::uint64_t floor) {
  return Timed(StoreCallKind::kClaim, [&] { return inner_->Claim(range, owner, ttl, floor); });
}
Result<Decision> TimedStore::Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                                   Millis ttl) {
  return Timed(StoreCallKind::kRenew, [&] { return inner_->Renew(range, owner, epoch, ttl); });
}
Result<bool> TimedStore::Release(SlotRange range, const OwnerId& owner, Epoch epoch) {
  return Timed(StoreCallKind::kRelease, [&] { return inner_->Release(range, owner, epoch); });
}
Result<bool> TimedStore::Offer(SlotRange range, const OwnerId& owner, Epoch epoch,
                               const OwnerId& to, Millis window) {
  return Timed(StoreCallKind::kOffer,
               [&] { return inner_->Offer(range, owner, epoch, to, window); });
}
Result<OwnershipTable> TimedStore::Read() {
  return Timed(StoreCallKind::kRead, [&] { return inner_->Read(); });
}
Result<OwnershipTable> TimedStore::ReadSlots(const std::vector<Slot>& slots) {
  return Timed(StoreCallKind::kRead, [&] { return inner_->ReadSlots(slots); });
}
Result<OwnershipTable> TimedStore::ReadOffers() {
  return Timed(StoreCallKind::kRead, [&] { return inner_->ReadOffers(); });
}

}  // namespace fleetfs::lease
