// EtcdStore against FakeEtcd: the table's rules carried out as etcd
// operations, races between claimers, and corrupt rows.
#include "lease/etcd_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <fstream>

#include "lease/fake_etcd.h"
#include "lease/store_url.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::AsGrant;
using testing::FakeEtcd;
using testing::FakeMonotonicClock;
using testing::FakeWallClock;
using testing::Owner;
using testing::Range;

constexpr Millis kTtl{9000};  // a whole number of seconds: etcd's unit
constexpr WallMs kStart = 1'800'000'000'000;

class EtcdStoreTest : public ::testing::Test {
 protected:
  EtcdStoreTest() {
    auto transport = std::make_unique<FakeEtcd>();
    etcd_ = transport.get();
    auto client = std::make_unique<EtcdClient>(std::vector<std::string>{"127.0.0.1:2379"},
                                               std::move(transport), mono_);
    store_ = std::make_unique<EtcdStore>(std::move(client), "fleet/a", "etcd://127.0.0.1:2379/fleet/a",
                                         wall_, mono_, EtcdStore::Options{});
  }

  std::int64_t LeaseOf(SlotRange range) const { return etcd_->Get(store_->RowKey(range))->lease; }
  std::vector<std::string> Paths() const {
    std::vector<std::string> paths;
    for (const auto& seen : etcd_->seen()) paths.push_back(seen.path);
    return paths;
  }

  FakeWallClock wall_{kStart};
  FakeMonotonicClock mono_;
  FakeEtcd* etcd_ = nullptr;
  std::unique_ptr<EtcdStore> store_;
};

TEST_F(EtcdStoreTest, a_first_claim_writes_its_row_on_its_own_lease_and_the_counter) {
  const Grant grant = AsGrant(store_->Claim(Range(0, 8191), Owner("a"), kTtl, 0));
  EXPECT_EQ(grant.epoch, Epoch(1));
  EXPECT_TRUE(grant.fresh);
  EXPECT_EQ(grant.lease_expires_ms, kStart + 9000);
  const auto row = etcd_->Get("fleet/a/rows/00000-08191");
  ASSERT_TRUE(row);
  EXPECT_EQ(nlohmann::json::parse(row->value),
            (nlohmann::json{{"owner", "a"}, {"epoch", 1}, {"ttl_ms", 9000}}));
  EXPECT_NE(row->lease, 0);
  EXPECT_TRUE(etcd_->LeaseExists(row->lease));
  const auto counter = etcd_->Get("fleet/a/counter");
  ASSERT_TRUE(counter);
  EXPECT_EQ(counter->value, "1");
  EXPECT_EQ(counter->lease, 0);
}

TEST_F(EtcdStoreTest, a_fresh_grant_is_one_txn_that_compares_what_the_decision_read) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(5000, 5099), Owner("c"), kTtl, 0));
  etcd_->Expire(LeaseOf(Range(0, 99)));
  etcd_->ClearSeen();
  const std::int64_t counter_rev = etcd_->Get("fleet/a/counter")->mod_revision;
  AsGrant(store_->Claim(Range(0, 199), Owner("b"), kTtl, 0));
  const auto seen = etcd_->seen();
  ASSERT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/grant", "/v3/kv/txn"}));
  const auto& compare = seen[2].request["compare"];
  // The new row's key (absent) and the counter (at the revision read); the
  // disjoint row 5000-5099 cannot change the decision and is not compared.
  ASSERT_EQ(compare.size(), 2u);
  EXPECT_EQ(*Base64Decode(compare[0]["key"].get<std::string>()), "fleet/a/rows/00000-00199");
  EXPECT_EQ(compare[0]["target"], "CREATE");
  EXPECT_EQ(*Base64Decode(compare[1]["key"].get<std::string>()), "fleet/a/counter");
  EXPECT_EQ(compare[1]["mod_revision"], std::to_string(counter_rev));
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "3");
}

TEST_F(EtcdStoreTest, an_absent_counter_is_compared_by_create_revision_zero) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const auto seen = etcd_->seen();
  const auto& compare = seen.back().request["compare"];
  ASSERT_EQ(compare.size(), 2u);
  EXPECT_EQ(*Base64Decode(compare[1]["key"].get<std::string>()), "fleet/a/counter");
  EXPECT_EQ(compare[1]["target"], "CREATE");
  EXPECT_EQ(compare[1]["create_revision"], "0");
}

TEST_F(EtcdStoreTest, another_owners_live_row_is_held_until_its_etcd_lease_ends) {
  AsGrant(store_->Claim(Range(0, 8191), Owner("a"), kTtl, 0));
  wall_.Advance(Millis(2000));
  const auto decision = store_->Claim(Range(100, 200), Owner("b"), kTtl, 0);
  ASSERT_TRUE(decision.ok()) << decision.status().message();
  const auto* held = std::get_if<Held>(&*decision);
  ASSERT_NE(held, nullptr) << DescribeDecision(*decision);
  EXPECT_EQ(held->owner, "a");
  EXPECT_EQ(held->range, Range(0, 8191));
  // The fake's leases do not run down: etcd says 9 s are left.
  EXPECT_EQ(held->lease_expires_ms, kStart + 2000 + 9000);
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "1");
}

TEST_F(EtcdStoreTest, a_renewal_touches_only_its_own_row) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(100, 199), Owner("b"), kTtl, 0));
  etcd_->ClearSeen();
  const std::int64_t lease = LeaseOf(Range(0, 99));
  const Grant grant = AsGrant(store_->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl));
  EXPECT_EQ(grant.epoch, Epoch(1));
  EXPECT_FALSE(grant.fresh);
  const auto seen = etcd_->seen();
  ASSERT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/keepalive"}));
  EXPECT_EQ(*Base64Decode(seen[0].request["key"].get<std::string>()), "fleet/a/rows/00000-00099");
  EXPECT_FALSE(seen[0].request.contains("range_end"));
  EXPECT_EQ(seen[1].request["ID"], std::to_string(lease));
}

TEST_F(EtcdStoreTest, a_renewal_of_another_owner_or_epoch_is_lost) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(*store_->Renew(Range(0, 99), Owner("b"), Epoch(1), kTtl), Decision(Lost{Range(0, 99)}));
  EXPECT_EQ(*store_->Renew(Range(0, 99), Owner("a"), Epoch(2), kTtl), Decision(Lost{Range(0, 99)}));
  EXPECT_EQ(*store_->Renew(Range(0, 98), Owner("a"), Epoch(1), kTtl), Decision(Lost{Range(0, 98)}));
}

TEST_F(EtcdStoreTest, a_renewal_after_etcd_expired_the_row_is_lost) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  etcd_->Expire(LeaseOf(Range(0, 99)));
  EXPECT_EQ(*store_->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl), Decision(Lost{Range(0, 99)}));
}

TEST_F(EtcdStoreTest, a_lease_that_ends_between_the_read_and_the_keepalive_is_lost) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t lease = LeaseOf(Range(0, 99));
  etcd_->before = [&](const std::string& path) {
    if (path == "/v3/lease/keepalive") etcd_->Expire(lease);
  };
  EXPECT_EQ(*store_->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl), Decision(Lost{Range(0, 99)}));
}

TEST_F(EtcdStoreTest, an_expired_row_lets_another_owner_claim_at_a_higher_epoch) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  etcd_->Expire(LeaseOf(Range(0, 99)));
  const Grant grant = AsGrant(store_->Claim(Range(50, 150), Owner("b"), kTtl, 0));
  EXPECT_EQ(grant.epoch, Epoch(2));
  EXPECT_TRUE(grant.fresh);
}

TEST_F(EtcdStoreTest, the_owners_own_claim_keeps_its_epoch_by_a_keepalive) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  etcd_->ClearSeen();
  const Grant again = AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(again.epoch, Epoch(1));
  EXPECT_FALSE(again.fresh);
  EXPECT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/keepalive"}));
}

TEST_F(EtcdStoreTest, a_claim_at_or_above_the_floor_replaces_the_owners_row_with_a_new_epoch) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t old_lease = LeaseOf(Range(0, 99));
  const Grant grant = AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 5));
  EXPECT_EQ(grant.epoch, Epoch(6));
  EXPECT_TRUE(grant.fresh);
  EXPECT_NE(LeaseOf(Range(0, 99)), old_lease);
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "6");
}

TEST_F(EtcdStoreTest, a_longer_ttl_moves_the_row_to_a_longer_lease_and_a_shorter_one_never_shortens) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t first = LeaseOf(Range(0, 99));
  const Grant shorter = AsGrant(store_->Renew(Range(0, 99), Owner("a"), Epoch(1), Millis(3000)));
  EXPECT_EQ(shorter.lease_expires_ms, kStart + 9000);
  EXPECT_EQ(LeaseOf(Range(0, 99)), first);
  const Grant longer = AsGrant(store_->Renew(Range(0, 99), Owner("a"), Epoch(1), Millis(20'000)));
  EXPECT_EQ(longer.lease_expires_ms, kStart + 20'000);
  EXPECT_NE(LeaseOf(Range(0, 99)), first);
  EXPECT_FALSE(etcd_->LeaseExists(first));
  EXPECT_EQ(nlohmann::json::parse(etcd_->Get("fleet/a/rows/00000-00099")->value)["ttl_ms"], 20000);
}

TEST_F(EtcdStoreTest, a_claim_that_loses_the_race_revokes_its_lease_and_decides_again) {
  // Between this claim's read and its txn, another host takes 50-150.
  std::int64_t rival = 0;
  std::int64_t ours = 0;
  etcd_->before = [&](const std::string& path) {
    if (path == "/v3/kv/txn" && rival == 0) {
      rival = etcd_->GrantLease(9);
      etcd_->Put("fleet/a/rows/00050-00150", R"({"owner":"b","epoch":1,"ttl_ms":9000})", rival);
      etcd_->Put("fleet/a/counter", "1");
    }
    if (path == "/v3/lease/revoke") ours = -1;
  };
  const auto decision = store_->Claim(Range(0, 99), Owner("a"), kTtl, 0);
  ASSERT_TRUE(decision.ok()) << decision.status().message();
  const auto* held = std::get_if<Held>(&*decision);
  ASSERT_NE(held, nullptr) << DescribeDecision(*decision);
  EXPECT_EQ(held->owner, "b");
  EXPECT_EQ(ours, -1);  // the lease granted for the lost txn was revoked
  EXPECT_FALSE(etcd_->Get("fleet/a/rows/00000-00099"));
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "1");
}

TEST_F(EtcdStoreTest, a_claim_that_lost_to_a_disjoint_claim_is_granted_above_it) {
  bool raced = false;
  etcd_->before = [&](const std::string& path) {
    if (path == "/v3/kv/txn" && !raced) {
      raced = true;
      etcd_->Put("fleet/a/rows/09000-09999", R"({"owner":"b","epoch":1,"ttl_ms":9000})",
                 etcd_->GrantLease(9));
      etcd_->Put("fleet/a/counter", "1");
    }
  };
  const Grant grant = AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(grant.epoch, Epoch(2));
  const auto paths = Paths();
  const auto txns = std::count(paths.begin(), paths.end(), "/v3/kv/txn");
  EXPECT_EQ(txns, 2);
}

TEST_F(EtcdStoreTest, a_claim_that_keeps_losing_ends_at_its_time_limit) {
  int bumps = 0;
  etcd_->before = [&](const std::string& path) {
    if (path == "/v3/kv/txn") {
      etcd_->Put("fleet/a/counter", std::to_string(++bumps));
      mono_.Advance(Millis(1000));
    }
  };
  const auto decision = store_->Claim(Range(0, 99), Owner("a"), kTtl, 0);
  ASSERT_FALSE(decision.ok());
  EXPECT_EQ(decision.status().code(), Code::kDeadlineExceeded);
  EXPECT_NE(decision.status().message().find("lost 3 races"), std::string::npos)
      << decision.status().message();
}

TEST_F(EtcdStoreTest, an_offer_deletes_the_row_and_lets_only_its_target_claim_until_it_ends) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t lease = LeaseOf(Range(0, 99));
  EXPECT_FALSE(*store_->Offer(Range(0, 99), Owner("a"), Epoch(2), Owner("b"), kTtl));
  ASSERT_TRUE(*store_->Offer(Range(0, 99), Owner("a"), Epoch(1), Owner("b"), kTtl));
  EXPECT_FALSE(etcd_->Get("fleet/a/rows/00000-00099"));
  EXPECT_FALSE(etcd_->LeaseExists(lease));
  const auto offer = etcd_->Get("fleet/a/offers/00000-00099");
  ASSERT_TRUE(offer);
  EXPECT_NE(offer->lease, 0);
  // Read shows a lapsed row offered to b for the time etcd says is left.
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 1u);
  EXPECT_EQ(table->rows()[0].offered_to, Owner("b"));
  EXPECT_EQ(table->rows()[0].offer_expires_ms, kStart + 9000);
  EXPECT_LE(table->rows()[0].lease_expires_ms, kStart);
  // Another owner, and the one that offered it, are refused naming b.
  for (const char* who : {"c", "a"}) {
    const auto refused = store_->Claim(Range(50, 60), Owner(who), kTtl, 0);
    ASSERT_TRUE(refused.ok()) << refused.status().message();
    EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "b", kStart + 9000, true})) << who;
  }
  // b claims at once at a new epoch; the offer goes in the same txn.
  const Grant grant = AsGrant(store_->Claim(Range(0, 99), Owner("b"), kTtl, 0));
  EXPECT_TRUE(grant.fresh);
  EXPECT_EQ(grant.epoch, Epoch(2));
  EXPECT_FALSE(etcd_->Get("fleet/a/offers/00000-00099"));
  EXPECT_EQ(store_->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl)->index(), 2u);  // Lost
}

TEST_F(EtcdStoreTest, an_offer_that_etcd_ended_lets_anyone_claim) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  ASSERT_TRUE(*store_->Offer(Range(0, 99), Owner("a"), Epoch(1), Owner("b"), kTtl));
  etcd_->Expire(etcd_->Get("fleet/a/offers/00000-00099")->lease);
  EXPECT_TRUE(AsGrant(store_->Claim(Range(0, 99), Owner("c"), kTtl, 0)).fresh);
}

TEST_F(EtcdStoreTest, a_read_of_the_offers_reads_only_the_offer_keys_and_their_time_left) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(200, 299), Owner("c"), kTtl, 0));
  ASSERT_TRUE(*store_->Offer(Range(0, 99), Owner("a"), Epoch(1), Owner("b"), kTtl));
  // Not offers of this fleet: a malformed one, and a fleet nested under it.
  etcd_->Put("fleet/a/offers/00300-00399", "not json", etcd_->GrantLease(9));
  etcd_->Put("fleet/a/offers/b/rows/00000-00099", "{}", etcd_->GrantLease(9));
  etcd_->ClearSeen();
  const auto offers = store_->ReadOffers();
  ASSERT_TRUE(offers.ok()) << offers.status().message();
  EXPECT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/timetolive"}));
  const auto range = etcd_->seen().front().request;
  EXPECT_EQ(*Base64Decode(range["key"].get<std::string>()), "fleet/a/offers/");
  EXPECT_EQ(*Base64Decode(range["range_end"].get<std::string>()), "fleet/a/offers0");
  OwnershipRow offered{Range(0, 99), Owner("a"), Epoch(1), 0};
  offered.offered_to = Owner("b");
  offered.offer_expires_ms = kStart + 9000;
  EXPECT_EQ(offers->rows(), (std::vector<OwnershipRow>{offered}));
  // etcd ended it: no offer stands.
  etcd_->Expire(etcd_->Get("fleet/a/offers/00000-00099")->lease);
  EXPECT_TRUE(store_->ReadOffers()->rows().empty());
}

// An offer key nobody's grant wrote (stale, or planted), on its own lease.
void PlantOffer(FakeEtcd& etcd, const std::string& key, std::uint64_t epoch) {
  etcd.Put(key,
           nlohmann::json{{"owner", "x"}, {"epoch", epoch}, {"to", "b"}, {"ttl_ms", 9000}}.dump(),
           etcd.GrantLease(9));
}

// The offers Read keeps, which must be exactly those the offer poll reads.
std::vector<OwnershipRow> OffersReadAndPolled(OwnershipStore& store) {
  std::vector<OwnershipRow> offers;
  const auto table = store.Read();
  EXPECT_TRUE(table.ok()) << table.status().message();
  if (!table.ok()) return offers;
  for (const OwnershipRow& row : table->rows()) {
    if (row.offered_to) offers.push_back(row);
  }
  const auto polled = store.ReadOffers();
  EXPECT_TRUE(polled.ok()) << polled.status().message();
  if (polled.ok()) {
    EXPECT_EQ(polled->rows(), offers);
  }
  return offers;
}

// A stale (or planted) offer key that sorts before a real offer and
// overlaps it must not hide it: the read of the offers keeps the offers that
// Read keeps, which knows the stale one lies over a live row.
TEST_F(EtcdStoreTest, a_stale_offer_that_sorts_first_does_not_hide_a_real_one_from_the_offer_read) {
  AsGrant(store_->Claim(Range(0, 49), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(50, 99), Owner("a"), kTtl, 0));
  ASSERT_TRUE(*store_->Offer(Range(50, 99), Owner("a"), Epoch(2), Owner("b"), kTtl));
  PlantOffer(*etcd_, "fleet/a/offers/00000-00099", 1);
  const std::vector<OwnershipRow> read_offers = OffersReadAndPolled(*store_);
  ASSERT_EQ(read_offers.size(), 1u);
  EXPECT_EQ(read_offers[0].range, Range(50, 99));
  // Without a clash the offer read stays the cheap one.
  etcd_->Expire(etcd_->Get("fleet/a/offers/00000-00099")->lease);
  etcd_->ClearSeen();
  ASSERT_EQ(store_->ReadOffers()->rows(), read_offers);
  EXPECT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/timetolive"}));
}

// No grant leaves two offers, or an offer and a row, at one epoch: a stale
// or planted key that does is ignored, never a failure of every read and
// claim of the fleet (nor of the poll for offers).
TEST_F(EtcdStoreTest, an_offer_at_the_epoch_of_another_row_or_offer_is_ignored) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(100, 199), Owner("a"), kTtl, 0));
  ASSERT_TRUE(*store_->Offer(Range(100, 199), Owner("a"), Epoch(2), Owner("b"), kTtl));
  PlantOffer(*etcd_, "fleet/a/offers/00200-00299", 1);
  PlantOffer(*etcd_, "fleet/a/offers/00300-00399", 1);
  PlantOffer(*etcd_, "fleet/a/offers/00400-00499", 2);
  const std::vector<OwnershipRow> offers = OffersReadAndPolled(*store_);
  ASSERT_EQ(offers.size(), 1u);
  EXPECT_EQ(offers[0].range, Range(100, 199));
  EXPECT_EQ(AsGrant(store_->Claim(Range(500, 599), Owner("c"), kTtl, 0)).epoch, Epoch(3));
}

TEST_F(EtcdStoreTest, release_deletes_the_row_then_revokes_its_lease) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t lease = LeaseOf(Range(0, 99));
  EXPECT_FALSE(*store_->Release(Range(0, 99), Owner("b"), Epoch(1)));
  EXPECT_FALSE(*store_->Release(Range(0, 99), Owner("a"), Epoch(2)));
  etcd_->ClearSeen();
  EXPECT_TRUE(*store_->Release(Range(0, 99), Owner("a"), Epoch(1)));
  EXPECT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/kv/txn", "/v3/lease/revoke"}));
  EXPECT_FALSE(etcd_->Get("fleet/a/rows/00000-00099"));
  EXPECT_FALSE(etcd_->LeaseExists(lease));
  EXPECT_FALSE(*store_->Release(Range(0, 99), Owner("a"), Epoch(1)));
  // The counter stays: the next grant is above every epoch ever granted.
  EXPECT_EQ(AsGrant(store_->Claim(Range(0, 99), Owner("b"), kTtl, 0)).epoch, Epoch(2));
}

TEST_F(EtcdStoreTest, read_gives_rows_with_the_time_etcd_says_they_have_left_and_the_counter) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(100, 199), Owner("b"), Millis(3000), 0));
  wall_.Advance(Millis(500));
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 2u);
  EXPECT_EQ(table->rows()[0].owner, Owner("a"));
  EXPECT_EQ(table->rows()[0].lease_expires_ms, kStart + 500 + 9000);
  EXPECT_EQ(table->rows()[1].lease_expires_ms, kStart + 500 + 3000);
  EXPECT_EQ(table->last_epoch(), Epoch(2));
}

TEST_F(EtcdStoreTest, read_slots_asks_etcd_the_time_left_only_of_the_rows_that_hold_them) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store_->Claim(Range(100, 199), Owner("b"), Millis(3000), 0));
  AsGrant(store_->Claim(Range(200, 299), Owner("c"), kTtl, 0));
  const std::int64_t b_lease = LeaseOf(Range(100, 199));
  etcd_->ClearSeen();
  const auto table = store_->ReadSlots({150, 155, 5000});
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 1u);
  EXPECT_EQ(table->rows()[0].owner, Owner("b"));
  EXPECT_EQ(table->rows()[0].lease_expires_ms, kStart + 3000);
  EXPECT_EQ(table->last_epoch(), Epoch(3));
  const auto seen = etcd_->seen();
  ASSERT_EQ(Paths(), (std::vector<std::string>{"/v3/kv/range", "/v3/lease/timetolive"}));
  EXPECT_EQ(seen[1].request["ID"], std::to_string(b_lease));
}

TEST_F(EtcdStoreTest, read_asks_the_time_left_of_many_rows_at_once) {
  for (int i = 0; i < 40; ++i) AsGrant(store_->Claim(Range(i, i), Owner("a"), kTtl, 0));
  std::mutex mu;
  std::condition_variable met;
  int in_flight = 0;
  int most = 0;
  etcd_->before = [&](const std::string& path) {
    if (path != "/v3/lease/timetolive") return;
    std::unique_lock lock(mu);
    most = std::max(most, ++in_flight);
    met.notify_all();
    // Serial calls would never meet: the wait ends by its limit, most stays 1.
    met.wait_for(lock, std::chrono::seconds(2), [&] { return most >= 4; });
    --in_flight;
  };
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 40u);
  for (const auto& row : table->rows()) EXPECT_EQ(row.lease_expires_ms, kStart + 9000);
  EXPECT_GE(most, 4);
}

TEST_F(EtcdStoreTest, the_counter_never_goes_down) {
  etcd_->Put("fleet/a/counter", "41");
  EXPECT_EQ(AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0)).epoch, Epoch(42));
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "42");
}

TEST_F(EtcdStoreTest, an_exhausted_counter_grants_nothing) {
  etcd_->Put("fleet/a/counter", std::to_string(Epoch::kMax));
  const auto decision = store_->Claim(Range(0, 99), Owner("a"), kTtl, 0);
  ASSERT_FALSE(decision.ok());
  EXPECT_EQ(decision.status().code(), Code::kFailedPrecondition);
  EXPECT_FALSE(etcd_->Get("fleet/a/rows/00000-00099"));
}

struct Corrupt {
  const char* key;
  const char* value;
  bool leased;
  const char* names;
};

TEST_F(EtcdStoreTest, a_corrupt_row_or_counter_is_data_loss_naming_the_key_and_field) {
  const Corrupt cases[] = {
      {"fleet/a/rows/00000-00099", "not json", true, "its value is not a JSON object"},
      {"fleet/a/rows/00000-00099", R"(["a",1])", true, "its value is not a JSON object"},
      {"fleet/a/rows/00000-00099", R"({"owner":7,"epoch":1,"ttl_ms":9000})", true, "'owner'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"","epoch":1,"ttl_ms":9000})", true, "'owner'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":0,"ttl_ms":9000})", true, "'epoch'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":-1,"ttl_ms":9000})", true, "'epoch'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":9223372036854775808,"ttl_ms":9000})",
       true, "'epoch'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":"1","ttl_ms":9000})", true, "'epoch'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":1.5,"ttl_ms":9000})", true, "'epoch'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":1,"ttl_ms":10})", true, "'ttl_ms'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":1})", true, "'ttl_ms'"},
      {"fleet/a/rows/00000-00099", R"({"owner":"a","epoch":1,"ttl_ms":9000})", false, "no etcd lease"},
      {"fleet/a/rows/00099-00000", R"({"owner":"a","epoch":1,"ttl_ms":9000})", true, "neither a row"},
      {"fleet/a/rows/0-99", R"({"owner":"a","epoch":1,"ttl_ms":9000})", true, "neither a row"},
      {"fleet/a/rows/00000-16384", R"({"owner":"a","epoch":1,"ttl_ms":9000})", true, "neither a row"},
      {"fleet/a/rows/stray", "x", false, "neither a row"},
      {"fleet/a/counter", "12x", false, "the epoch counter"},
      {"fleet/a/counter", "", false, "the epoch counter"},
      {"fleet/a/counter", "99999999999999999999", false, "the epoch counter"},
  };
  for (const Corrupt& c : cases) {
    auto transport = std::make_unique<FakeEtcd>();
    FakeEtcd& etcd = *transport;
    EtcdStore store(std::make_unique<EtcdClient>(std::vector<std::string>{"127.0.0.1:2379"},
                                                 std::move(transport), mono_),
                    "fleet/a", "etcd://127.0.0.1:2379/fleet/a", wall_, mono_, EtcdStore::Options{});
    etcd.Put(c.key, c.value, c.leased ? etcd.GrantLease(9) : 0);
    const auto table = store.Read();
    ASSERT_FALSE(table.ok()) << c.key << " = " << c.value;
    EXPECT_EQ(table.status().code(), Code::kDataLoss);
    EXPECT_NE(table.status().message().find(c.names), std::string::npos)
        << c.value << " -> " << table.status().message();
    EXPECT_NE(table.status().message().find(c.key), std::string::npos) << table.status().message();
    const auto claim = store.Claim(Range(0, 99), Owner("a"), kTtl, 0);
    ASSERT_FALSE(claim.ok());
    EXPECT_EQ(claim.status().code(), Code::kDataLoss);
  }
}

TEST_F(EtcdStoreTest, a_malformed_or_absurd_offer_is_ignored_and_the_fleet_reads_on) {
  AsGrant(store_->Claim(Range(200, 299), Owner("a"), kTtl, 0));
  etcd_->Put("fleet/a/offers/00000-00099", "not json", etcd_->GrantLease(9));
  etcd_->Put("fleet/a/offers/00100-00199",
             R"({"owner":"a","epoch":9223372036854775807,"to":"b","ttl_ms":9000})",
             etcd_->GrantLease(9));
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 1u);
  EXPECT_EQ(table->rows()[0].range, Range(200, 299));
  // The next epoch comes from the counter, not the absurd offer.
  const auto claim = store_->Claim(Range(100, 199), Owner("c"), kTtl, 0);
  ASSERT_TRUE(claim.ok()) << claim.status().message();
  EXPECT_EQ(AsGrant(claim).epoch, Epoch(2));
}

TEST_F(EtcdStoreTest, a_row_value_nested_deep_is_data_loss_without_building_it) {
  etcd_->Put("fleet/a/rows/00000-00099", std::string(4u << 20, '['), etcd_->GrantLease(9));
  const auto table = store_->Read();
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), Code::kDataLoss);
  EXPECT_NE(table.status().message().find("fleet/a/rows/00000-00099"), std::string::npos);
  // Refused by the row's bounded parse (depth 2) before nlohmann builds
  // anything; a timed check here failed under ASan, where the fake's base64
  // of 4 MiB alone takes seconds.
  EXPECT_NE(table.status().message().find("is not a JSON object"), std::string::npos)
      << table.status().message();
}

TEST_F(EtcdStoreTest, overlapping_rows_are_data_loss) {
  etcd_->Put("fleet/a/rows/00000-00099", R"({"owner":"a","epoch":1,"ttl_ms":9000})",
             etcd_->GrantLease(9));
  etcd_->Put("fleet/a/rows/00050-00150", R"({"owner":"b","epoch":2,"ttl_ms":9000})",
             etcd_->GrantLease(9));
  const auto table = store_->Read();
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), Code::kDataLoss);
  EXPECT_NE(table.status().message().find("overlap"), std::string::npos);
}

TEST_F(EtcdStoreTest, keys_of_a_longer_prefix_are_not_read) {
  etcd_->Put("fleet/ab/counter", "junk");
  etcd_->Put("fleet/a0", "junk");
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  EXPECT_TRUE(table->rows().empty());
}

// Two endpoints in front of one FakeEtcd; `mangle` may replace the answer the
// first endpoint gives after the fake has carried the call out (a txn that
// landed, whose answer a proxy garbled).
class MangledFirstEndpoint final : public EtcdTransport {
 public:
  explicit MangledFirstEndpoint(FakeEtcd* etcd) : etcd_(etcd) {}
  std::function<std::optional<EtcdHttpAnswer>(const EtcdHttpCall&)> mangle;
  Result<EtcdHttpAnswer> Post(const EtcdHttpCall& call) override {
    auto answer = etcd_->Post(call);
    if (call.endpoint == "10.0.0.1:2379" && mangle) {
      if (auto replaced = mangle(call)) return *replaced;
    }
    return answer;
  }

 private:
  FakeEtcd* etcd_;
};

class EtcdStoreFailoverTest : public EtcdStoreTest {
 protected:
  EtcdStoreFailoverTest() {
    auto transport = std::make_unique<MangledFirstEndpoint>(&fake_);
    proxy_ = transport.get();
    etcd_ = &fake_;
    auto client = std::make_unique<EtcdClient>(
        std::vector<std::string>{"10.0.0.1:2379", "10.0.0.2:2379"}, std::move(transport), mono_);
    store_ = std::make_unique<EtcdStore>(std::move(client), "fleet/a", "etcd://10.0.0.1:2379/fleet/a",
                                         wall_, mono_, EtcdStore::Options{});
  }
  FakeEtcd fake_;
  MangledFirstEndpoint* proxy_ = nullptr;
};

TEST_F(EtcdStoreFailoverTest, a_claim_whose_txn_landed_but_whose_answer_was_lost_keeps_its_row_and_epoch) {
  proxy_->mangle = [](const EtcdHttpCall& call) -> std::optional<EtcdHttpAnswer> {
    if (call.path == "/v3/kv/txn") return EtcdHttpAnswer{200, "<html>ok</html>"};
    return std::nullopt;
  };
  const Grant grant = AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(grant.epoch, Epoch(1));
  EXPECT_TRUE(grant.fresh);
  const auto row = etcd_->Get("fleet/a/rows/00000-00099");
  ASSERT_TRUE(row) << "the row that landed was revoked away";
  EXPECT_TRUE(etcd_->LeaseExists(row->lease));
  EXPECT_EQ(nlohmann::json::parse(row->value)["epoch"], 1);
  EXPECT_EQ(etcd_->Get("fleet/a/counter")->value, "1");
}

TEST_F(EtcdStoreFailoverTest, a_move_to_a_longer_lease_that_landed_but_whose_answer_was_lost_is_kept) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const std::int64_t first = LeaseOf(Range(0, 99));
  proxy_->mangle = [](const EtcdHttpCall& call) -> std::optional<EtcdHttpAnswer> {
    if (call.path == "/v3/kv/txn") return EtcdHttpAnswer{500, "<html>oops</html>"};
    return std::nullopt;
  };
  const Grant longer = AsGrant(store_->Renew(Range(0, 99), Owner("a"), Epoch(1), Millis(20'000)));
  EXPECT_EQ(longer.epoch, Epoch(1));
  EXPECT_EQ(longer.lease_expires_ms, kStart + 20'000);
  const auto row = etcd_->Get("fleet/a/rows/00000-00099");
  ASSERT_TRUE(row);
  EXPECT_NE(row->lease, first);
  EXPECT_TRUE(etcd_->LeaseExists(row->lease));
  EXPECT_FALSE(etcd_->LeaseExists(first));
}

TEST_F(EtcdStoreTest, keys_of_a_fleet_nested_under_the_prefix_are_not_ours_and_are_left_alone) {
  // The fleet at fleet/a/b, and something else's key beside it.
  etcd_->Put("fleet/a/b/rows/00000-00099", R"({"owner":"z","epoch":7,"ttl_ms":9000})",
             etcd_->GrantLease(9));
  etcd_->Put("fleet/a/b/counter", "7");
  etcd_->Put("fleet/a/notes", "not fleetfs");
  const auto table = store_->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  EXPECT_TRUE(table->rows().empty());
  EXPECT_EQ(table->last_epoch(), Epoch(0));
  const Grant grant = AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(grant.epoch, Epoch(1));
  EXPECT_EQ(etcd_->Get("fleet/a/b/counter")->value, "7");
  EXPECT_TRUE(etcd_->Get("fleet/a/b/rows/00000-00099"));
}

TEST_F(EtcdStoreFailoverTest, a_row_read_back_under_another_key_is_data_loss) {
  AsGrant(store_->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const auto row = etcd_->Get("fleet/a/rows/00000-00099");
  etcd_->Put("fleet/a/decoy", row->value, row->lease);
  // The member answers the read of the row with another key's value.
  proxy_->mangle = [this](const EtcdHttpCall& call) -> std::optional<EtcdHttpAnswer> {
    const auto request = nlohmann::json::parse(call.body);
    if (call.path != "/v3/kv/range" || request.contains("range_end")) return std::nullopt;
    EtcdHttpCall other = call;
    other.body = nlohmann::json{{"key", Base64Encode("fleet/a/decoy")}}.dump();
    return *fake_.Post(other);
  };
  const auto renewed = store_->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl);
  ASSERT_FALSE(renewed.ok()) << DescribeDecision(*renewed);
  EXPECT_EQ(renewed.status().code(), Code::kDataLoss);
  EXPECT_NE(renewed.status().message().find("fleet/a/decoy"), std::string::npos)
      << renewed.status().message();
  const auto released = store_->Release(Range(0, 99), Owner("a"), Epoch(1));
  ASSERT_FALSE(released.ok());
  EXPECT_EQ(released.status().code(), Code::kDataLoss);
  EXPECT_TRUE(etcd_->Get("fleet/a/rows/00000-00099"));
}

TEST(EtcdStoreUrl, names_endpoints_in_order_and_a_prefix) {
  const auto url = ParseStoreUrl("etcd://10.0.0.1:2379,etcd-b.example:2380,[::1]:2381/fleet/prod_1");
  ASSERT_TRUE(url.ok()) << url.status().message();
  EXPECT_EQ(url->scheme, StoreUrl::Scheme::kEtcd);
  EXPECT_EQ(url->endpoints,
            (std::vector<std::string>{"10.0.0.1:2379", "etcd-b.example:2380", "[::1]:2381"}));
  EXPECT_EQ(url->prefix, "fleet/prod_1");
  EXPECT_EQ(ParseStoreUrl("etcds://h:1/p")->scheme, StoreUrl::Scheme::kEtcds);
}

TEST(EtcdStoreUrl, a_bad_url_is_refused_naming_the_part_and_the_rule) {
  const std::pair<const char*, const char*> cases[] = {
      {"etcd:///fleet", "no endpoint"},
      {"etcd://:2379/fleet", "empty host"},
      {"etcd://h/fleet", "no port"},
      {"etcd://h:0/fleet", "port '0' must be 1-65535"},
      {"etcd://h:65536/fleet", "port '65536' must be 1-65535"},
      {"etcd://h:12ab/fleet", "port '12ab'"},
      {"etcd://h:1,,h:2/fleet", "endpoint '': empty"},
      {"etcd://h:1,h:1/fleet", "named twice"},
      {"etcd://h_x:1/fleet", "host 'h_x'"},
      {"etcd://h:1", "no key prefix"},
      {"etcd://h:1/", "no key prefix"},
      {"etcd://h:1/fleet/", "empty segment"},
      {"etcd://h:1/a//b", "empty segment"},
      {"etcd://h:1/a/../b", "'..' segment"},
      {"etcd://h:1/fleet prod", "character outside"},
      {"etcd://h:1/fleet%41", "character outside"},
      {"etcd://h:1/fleet?x=1", "character outside"},
  };
  for (const auto& [text, names] : cases) {
    const auto url = ParseStoreUrl(text);
    ASSERT_FALSE(url.ok()) << text;
    EXPECT_EQ(url.status().code(), Code::kInvalidArgument);
    EXPECT_NE(url.status().message().find(names), std::string::npos)
        << text << " -> " << url.status().message();
  }
  const auto long_prefix = ParseStoreUrl("etcd://h:1/" + std::string(129, 'a'));
  ASSERT_FALSE(long_prefix.ok());
  EXPECT_NE(long_prefix.status().message().find("longer than 128"), std::string::npos);
}

TEST(EtcdStoreUrl, tls_files_are_for_etcds_only_and_a_certificate_comes_with_its_key) {
  const StoreUrl plain = *ParseStoreUrl("etcd://h:1/p");
  const StoreUrl tls = *ParseStoreUrl("etcds://h:1/p");
  EXPECT_TRUE(CheckStoreTls(plain, {}).ok());
  EXPECT_NE(CheckStoreTls(plain, {"/ca.pem", "", ""}).message().find("store_ca: TLS files are for an etcds://"),
            std::string::npos);
  EXPECT_TRUE(CheckStoreTls(tls, {"/ca.pem", "/c.pem", "/k.pem"}).ok());
  EXPECT_NE(CheckStoreTls(tls, {"", "/c.pem", ""}).message().find("store_key"), std::string::npos);
  EXPECT_NE(CheckStoreTls(tls, {"ca.pem", "", ""}).message().find("absolute"), std::string::npos);
}

TEST(EtcdStoreUrl, a_tls_file_that_is_a_directory_or_a_key_under_a_passphrase_is_refused_naming_it) {
  char dir_template[] = "/tmp/fleetfs-tls-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string plain = dir + "/key.pem";
  const std::string locked = dir + "/locked.pem";
  const std::string old_style = dir + "/old.pem";
  std::ofstream(plain) << "-----BEGIN PRIVATE KEY-----\nMC4CAQ==\n-----END PRIVATE KEY-----\n";
  std::ofstream(locked) << "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMC4CAQ==\n"
                           "-----END ENCRYPTED PRIVATE KEY-----\n";
  std::ofstream(old_style) << "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
                              "DEK-Info: AES-256-CBC,00\n\nMC4CAQ==\n-----END RSA PRIVATE KEY-----\n";
  EXPECT_TRUE(CheckStoreTlsFiles({plain, plain, plain}).ok());
  const Status directory = CheckStoreTlsFiles({dir, "", ""});
  EXPECT_EQ(directory.code(), Code::kInvalidArgument);
  EXPECT_NE(directory.message().find("store_ca: " + dir + " is not a regular file"),
            std::string::npos)
      << directory.message();
  for (const std::string& key : {locked, old_style}) {
    const Status refused = CheckStoreTlsFiles({"", plain, key});
    EXPECT_NE(refused.message().find("store_key: " + key + " is protected by a passphrase"),
              std::string::npos)
        << refused.message();
  }
  const Status missing = CheckStoreTlsFiles({"", dir + "/nope.pem", plain});
  EXPECT_NE(missing.message().find("store_cert: " + dir + "/nope.pem: No such file"),
            std::string::npos)
      << missing.message();
  // The store refuses them before any call.
  SystemWallClock wall;
  const auto store = OpenStore("etcds://127.0.0.1:1/p", wall, SqliteStore::Access::kExisting,
                               {dir, "", ""});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("not a regular file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fleetfs::lease
