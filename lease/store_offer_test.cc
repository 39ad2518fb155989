// Offers on every OwnershipStore, with the same expectations: the SQLite
// store and the etcd store (against FakeEtcd) must carry out the table's
// offer rules alike, though one keeps a lapsed row and the other deletes it.
#include <gtest/gtest.h>

#include <memory>

#include "lease/etcd_store.h"
#include "lease/fake_etcd.h"
#include "lease/sqlite_store.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::AsGrant;
using testing::FakeBootClock;
using testing::FakeEtcd;
using testing::FakeMonotonicClock;
using testing::FakeWallClock;
using testing::Owner;
using testing::Range;
using testing::TempDir;

constexpr Millis kTtl{60'000};
// Whole seconds: etcd's unit for the offer's lease.
constexpr Millis kWindow{10'000};

// A SQLite control database on clocks that move only when the test says.
class SqliteEnv {
 public:
  SqliteEnv() {
    auto opened = SqliteStore::Open(dir_.File("control.db"), wall_, {.boot = &boot_});
    EXPECT_TRUE(opened.ok()) << opened.status().message();
    if (opened.ok()) store_ = std::move(opened).value();
  }
  OwnershipStore& store() { return *store_; }
  // The offer's window runs out on the store's (boot) clock.
  void EndWindow(SlotRange) {
    boot_.Advance(kWindow);
    wall_.Advance(kWindow);
  }

 private:
  TempDir dir_;
  FakeWallClock wall_{1'700'000'000'000};
  FakeBootClock boot_{5'000, "boot-1"};
  std::unique_ptr<SqliteStore> store_;
};

// An etcd store on FakeEtcd, whose leases end only when the test says:
// etcd's clock, not the host's, ends an offer.
class EtcdEnv {
 public:
  EtcdEnv() {
    auto transport = std::make_unique<FakeEtcd>();
    etcd_ = transport.get();
    auto client = std::make_unique<EtcdClient>(std::vector<std::string>{"127.0.0.1:2379"},
                                               std::move(transport), mono_);
    store_ =
        std::make_unique<EtcdStore>(std::move(client), "fleet/a", "etcd://127.0.0.1:2379/fleet/a",
                                    wall_, mono_, EtcdStore::Options{});
  }
  OwnershipStore& store() { return *store_; }
  void EndWindow(SlotRange range) {
    const auto offer = etcd_->Get(store_->OfferKey(range));
    ASSERT_TRUE(offer) << "no offer of " << range.ToString() << " to end";
    etcd_->Expire(offer->lease);
    wall_.Advance(kWindow);
  }

 private:
  FakeWallClock wall_{1'800'000'000'000};
  FakeMonotonicClock mono_;
  FakeEtcd* etcd_ = nullptr;
  std::unique_ptr<EtcdStore> store_;
};

template <typename Env>
class StoreOfferTest : public ::testing::Test {
 protected:
  OwnershipStore& store() { return env_.store(); }

  // The refusal of `who`'s claim of `range`, or a failure when it was not one.
  Held Refused(SlotRange range, const char* who) {
    const auto decision = store().Claim(range, Owner(who), kTtl, 0);
    EXPECT_TRUE(decision.ok()) << decision.status().message();
    if (!decision.ok()) return Held{SlotRange::All(), "", 0, false};
    const auto* held = std::get_if<Held>(&*decision);
    EXPECT_NE(held, nullptr) << who << " claiming " << range.ToString() << ": "
                             << DescribeDecision(*decision);
    return held ? *held : Held{SlotRange::All(), "", 0, false};
  }
  // The rows as (range, owner), without the stores' different expiries.
  std::vector<std::pair<SlotRange, std::string>> Rows() {
    const auto table = store().Read();
    EXPECT_TRUE(table.ok()) << table.status().message();
    std::vector<std::pair<SlotRange, std::string>> rows;
    if (table.ok()) {
      for (const auto& row : table->rows()) rows.emplace_back(row.range, row.owner.str());
    }
    return rows;
  }
  // Whether `range` is offered to `to` in a read of the table.
  bool Offered(SlotRange range, const char* to) {
    const auto table = store().Read();
    EXPECT_TRUE(table.ok()) << table.status().message();
    if (!table.ok()) return false;
    for (const auto& row : table->rows()) {
      if (row.range == range && row.offered_to == Owner(to)) return true;
    }
    return false;
  }

  Env env_;
};

using Stores = ::testing::Types<SqliteEnv, EtcdEnv>;
class StoreNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, SqliteEnv> ? "sqlite" : "etcd";
  }
};
TYPED_TEST_SUITE(StoreOfferTest, Stores, StoreNames);

TYPED_TEST(StoreOfferTest, an_offer_not_taken_in_its_window_frees_the_range_above_every_epoch) {
  const Grant a = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const Grant c = AsGrant(this->store().Claim(Range(200, 299), Owner("c"), kTtl, 0));
  ASSERT_TRUE(*this->store().Offer(Range(0, 99), Owner("a"), a.epoch, Owner("b"), kWindow));
  EXPECT_EQ(this->Refused(Range(0, 99), "c").owner, "b");
  this->env_.EndWindow(Range(0, 99));
  const Grant next = AsGrant(this->store().Claim(Range(0, 99), Owner("c"), kTtl, 0));
  EXPECT_TRUE(next.fresh);
  EXPECT_GT(next.epoch, std::max(a.epoch, c.epoch));
  EXPECT_EQ(this->store().Read()->last_epoch(), next.epoch);
  EXPECT_EQ(std::get<Lost>(*this->store().Renew(Range(0, 99), Owner("a"), a.epoch, kTtl)),
            Lost{Range(0, 99)});
}

TYPED_TEST(StoreOfferTest, an_offer_not_taken_lets_its_offerer_claim_again_after_the_window) {
  const Grant a = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(this->store().Claim(Range(200, 299), Owner("c"), kTtl, 0));
  ASSERT_TRUE(*this->store().Offer(Range(0, 99), Owner("a"), a.epoch, Owner("b"), kWindow));
  EXPECT_EQ(this->Refused(Range(0, 99), "a").owner, "b");
  this->env_.EndWindow(Range(0, 99));
  const Grant again = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  // The table's rule for its own row of the same bounds (SQLite keeps the
  // lapsed row, so the epoch; etcd deleted it, so a new one): nobody else
  // held the range between, so either is safe; an older epoch never is.
  if (again.fresh) {
    EXPECT_GT(again.epoch, Epoch(2));
  } else {
    EXPECT_EQ(again.epoch, a.epoch);
  }
  EXPECT_EQ(this->Rows(), (std::vector<std::pair<SlotRange, std::string>>{{Range(0, 99), "a"},
                                                                          {Range(200, 299), "c"}}));
}

TYPED_TEST(StoreOfferTest, a_claim_of_part_of_an_offer_is_refused_and_leaves_the_offer_whole) {
  const Grant a = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  ASSERT_TRUE(*this->store().Offer(Range(0, 99), Owner("a"), a.epoch, Owner("b"), kWindow));
  // The target may not take a part of it (the rest would lose its offer),
  // nor a range that overlaps it partly; the refusal names the whole offer.
  for (const SlotRange part : {Range(0, 49), Range(50, 150)}) {
    const Held held = this->Refused(part, "b");
    EXPECT_EQ(held.range, Range(0, 99)) << part.ToString();
    EXPECT_EQ(held.owner, "b") << part.ToString();
    EXPECT_TRUE(held.offered) << part.ToString();
  }
  EXPECT_TRUE(this->Offered(Range(0, 99), "b"));
  EXPECT_EQ(this->Refused(Range(50, 99), "c").owner, "b");
  // A range that covers it takes it whole, and nothing outside that range.
  AsGrant(this->store().Claim(Range(300, 399), Owner("c"), kTtl, 0));
  const Grant b = AsGrant(this->store().Claim(Range(0, 199), Owner("b"), kTtl, 0));
  EXPECT_TRUE(b.fresh);
  EXPECT_EQ(this->Rows(), (std::vector<std::pair<SlotRange, std::string>>{{Range(0, 199), "b"},
                                                                          {Range(300, 399), "c"}}));
}

TYPED_TEST(StoreOfferTest,
           after_the_window_a_part_of_a_lapsed_offer_is_claimed_by_the_usual_rules) {
  const Grant a = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  ASSERT_TRUE(*this->store().Offer(Range(0, 99), Owner("a"), a.epoch, Owner("b"), kWindow));
  this->env_.EndWindow(Range(0, 99));
  const Grant b = AsGrant(this->store().Claim(Range(0, 49), Owner("b"), kTtl, 0));
  EXPECT_TRUE(b.fresh);
  EXPECT_GT(b.epoch, a.epoch);
  EXPECT_EQ(this->Rows(), (std::vector<std::pair<SlotRange, std::string>>{{Range(0, 49), "b"}}));
  EXPECT_TRUE(AsGrant(this->store().Claim(Range(50, 99), Owner("c"), kTtl, 0)).fresh);
}

TYPED_TEST(StoreOfferTest, a_read_of_the_offers_shows_each_standing_offer_to_its_target) {
  const Grant a = AsGrant(this->store().Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(this->store().Claim(Range(200, 299), Owner("c"), kTtl, 0));
  ASSERT_TRUE(*this->store().Offer(Range(0, 99), Owner("a"), a.epoch, Owner("b"), kWindow));
  auto standing = [&] {
    const auto table = this->store().ReadOffers();
    EXPECT_TRUE(table.ok()) << table.status().message();
    std::vector<std::pair<SlotRange, std::string>> offers;
    const std::int64_t now = this->store().NowMs();
    for (const auto& row : table.ok() ? table->rows() : std::vector<OwnershipRow>{}) {
      if (row.offered_to && row.offer_expires_ms > now && row.lease_expires_ms <= now) {
        offers.emplace_back(row.range, row.offered_to->str());
      }
    }
    return offers;
  };
  EXPECT_EQ(standing(), (std::vector<std::pair<SlotRange, std::string>>{{Range(0, 99), "b"}}));
  this->env_.EndWindow(Range(0, 99));
  EXPECT_TRUE(standing().empty());
}

}  // namespace
}  // namespace fleetfs::lease
