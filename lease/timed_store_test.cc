#include "lease/timed_store.h"

#include <gtest/gtest.h>

#include "lease/sqlite_store.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::FakeMonotonicClock;
using testing::FakeWallClock;
using testing::Owner;
using testing::Range;

// A store whose every call takes `took` on the test's clock, and whose
// renewals fail.
class SlowStore final : public OwnershipStore {
 public:
  SlowStore(FakeMonotonicClock& clock, Millis took) : clock_(clock), took_(took) {}
  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override {
    clock_.Advance(took_);
    return table_.Claim(range, owner, 0, ttl, floor);
  }
  Result<Decision> Renew(SlotRange, const OwnerId&, Epoch, Millis) override {
    clock_.Advance(took_);
    return Unavailable("store down");
  }
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override {
    clock_.Advance(took_);
    return table_.Release(range, owner, epoch, 0);
  }
  Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch, const OwnerId& to,
                     Millis window) override {
    clock_.Advance(took_);
    return table_.Offer(range, owner, epoch, 0, to, window);
  }
  bool keeps_offers() const override { return true; }
  Result<OwnershipTable> Read() override {
    clock_.Advance(took_);
    return table_;
  }
  Result<OwnershipTable> ReadOffers() override {
    clock_.Advance(took_);
    ++offer_reads;
    return table_;
  }
  std::int64_t NowMs() const override { return 0; }
  WallMs ToWallMs(std::int64_t store_ms) const override { return store_ms; }
  std::string url() const override { return "memory://slow"; }

  int offer_reads = 0;

 private:
  FakeMonotonicClock& clock_;
  const Millis took_;
  OwnershipTable table_;
};

TEST(TimedStore, each_call_is_timed_by_kind_failed_or_not) {
  FakeMonotonicClock clock;
  TimedStore store(std::make_shared<SlowStore>(clock, Millis(40)), clock);
  auto claimed = store.Claim(Range(0, 99), Owner("a"), Millis(30'000), 0);
  ASSERT_TRUE(claimed.ok());
  EXPECT_FALSE(store.Renew(Range(0, 99), Owner("a"), Epoch(1), Millis(30'000)).ok());
  ASSERT_TRUE(store.Read().ok());
  ASSERT_TRUE(store.ReadSlots({5}).ok());  // a read too
  auto by = store.latencies();
  auto at = [&](StoreCallKind c) { return by[static_cast<std::size_t>(c)]; };
  EXPECT_EQ(at(StoreCallKind::kClaim).count(), 1u);
  EXPECT_EQ(at(StoreCallKind::kRenew).count(), 1u);  // the failure is timed too
  EXPECT_EQ(at(StoreCallKind::kRelease).count(), 0u);
  EXPECT_EQ(at(StoreCallKind::kRead).count(), 2u);
  EXPECT_EQ(at(StoreCallKind::kClaim).sum_ns, 40'000'000u);
  EXPECT_EQ(at(StoreCallKind::kRenew).buckets[HistogramBucketOf(40'000'000)], 1u);  // le="0.05"
}

TEST(TimedStore, forwards_what_is_not_a_call) {
  testing::TempDir dir;
  FakeWallClock wall(1'000'000);
  FakeMonotonicClock clock;
  auto sqlite = SqliteStore::Open(dir.File("control.db"), wall, {});
  ASSERT_TRUE(sqlite.ok()) << sqlite.status().message();
  std::shared_ptr<OwnershipStore> inner(std::move(*sqlite));
  TimedStore store(inner, clock);
  EXPECT_EQ(store.url(), inner->url());
  EXPECT_EQ(store.ToWallMs(5), inner->ToWallMs(5));
  EXPECT_EQ(StoreCallName(StoreCallKind::kRelease), "release");
}

// A handoff asks the store whether it keeps offers and sends the offer through
// this wrapper: a wrapper answering for itself would refuse every handoff.
TEST(TimedStore, offers_go_to_the_store_and_are_timed) {
  FakeMonotonicClock clock;
  TimedStore store(std::make_shared<SlowStore>(clock, Millis(40)), clock);
  EXPECT_TRUE(store.keeps_offers());
  auto claimed = store.Claim(Range(0, 99), Owner("a"), Millis(30'000), 0);
  ASSERT_TRUE(claimed.ok());
  auto offered = store.Offer(Range(0, 99), Owner("a"), std::get<Grant>(*claimed).epoch, Owner("b"),
                             Millis(30'000));
  ASSERT_TRUE(offered.ok()) << offered.status().message();
  EXPECT_TRUE(*offered);
  EXPECT_EQ(store.latencies()[static_cast<std::size_t>(StoreCallKind::kOffer)].count(), 1u);
  EXPECT_EQ(StoreCallName(StoreCallKind::kOffer), "offer");
}

// The offer poll's cheap read must reach the store's own ReadOffers, not the
// default that reads the whole table.
TEST(TimedStore, a_read_of_the_offers_goes_to_the_store_and_is_timed_as_a_read) {
  FakeMonotonicClock clock;
  auto slow = std::make_shared<SlowStore>(clock, Millis(40));
  TimedStore store(slow, clock);
  ASSERT_TRUE(store.ReadOffers().ok());
  EXPECT_EQ(slow->offer_reads, 1);
  EXPECT_EQ(store.latencies()[static_cast<std::size_t>(StoreCallKind::kRead)].count(), 1u);
}

}  // namespace
}  // namespace fleetfs::lease
