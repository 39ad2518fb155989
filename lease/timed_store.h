// TimedStore: an OwnershipStore that forwards every call to another and
// times it by kind (claim, renew, release, offer, read), for the store call latency
// histogram of /metrics: the store is what a lease's safety margin waits on,
// and a slow one shows here before ranges start to lapse.
//
// A call is timed when it returns, failed or not; a call that hangs past its
// time limit is timed when it finally returns.
//
// Thread-safety: as the store it wraps; the histograms are lock-free.
#pragma once

#include <array>
#include <memory>
#include <string_view>

#include "fleet/clock.h"
#include "fleet/histogram.h"
#include "lease/ownership_store.h"

namespace fleetfs::lease {

enum class StoreCallKind { kClaim, kRenew, kRelease, kOffer, kRead, kCount };
inline constexpr std::size_t kStoreCallKinds = static_cast<std::size_t>(StoreCallKind::kCount);
// "claim", "renew", "release", "offer", "read": for metrics labels.
std::string_view StoreCallName(StoreCallKind call);

class TimedStore final : public OwnershipStore {
 public:
  // `clock` must outlive this.
  TimedStore(std::shared_ptr<OwnershipStore> inner, const MonotonicClock& clock);

  // How long the calls took, by kind (index: StoreCallKind).
  std::array<HistogramSnapshot, kStoreCallKinds> latencies() const;

  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override;
  Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                         Millis ttl) override;
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override;
  Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch, const OwnerId& to,
                     Millis window) override;
  bool keeps_offers() const override { return inner_->keeps_offers(); }
  // Read, ReadSlots and ReadOffers are all reads.
  Result<OwnershipTable> Read() override;
  Result<OwnershipTable> ReadSlots(const std::vector<Slot>& slots) override;
  Result<OwnershipTable> ReadOffers() override;
  std::int64_t NowMs() const override { return inner_->NowMs(); }
  WallMs ToWallMs(std::int64_t store_ms) const override { return inner_->ToWallMs(store_ms); }
  std::string url() const override { return inner_->url(); }

 private:
  template <typename Call>
  auto Timed(StoreCallKind kind, Call&& call);

  const std::shared_ptr<OwnershipStore> inner_;
  const MonotonicClock& clock_;
  std::array<CallHistogram, kStoreCallKinds> latency_{};
};

}  // namespace fleetfs::lease
