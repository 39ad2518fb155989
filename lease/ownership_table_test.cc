#include "lease/ownership_table.h"

#include <gtest/gtest.h>

#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::AsGrant;
using testing::Owner;
using testing::Range;

constexpr Millis kTtl{30'000};

TEST(OwnershipTable, a_claim_on_an_empty_table_grants_epoch_one) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 1'000, kTtl));
  EXPECT_EQ(grant.epoch, Epoch(1));
  EXPECT_TRUE(grant.fresh);
  EXPECT_EQ(grant.lease_expires_ms, 31'000);
  EXPECT_TRUE(table.Admits(50, Owner("a"), Epoch(1)));
  EXPECT_FALSE(table.Admits(100, Owner("a"), Epoch(1)));
  EXPECT_FALSE(table.Admits(50, Owner("b"), Epoch(1)));
}

TEST(OwnershipTable, a_live_lease_refuses_another_owner_naming_holder_and_expiry) {
  OwnershipTable table;
  AsGrant(table.Claim(Range(0, 99), Owner("a"), 1'000, kTtl));
  const auto refused = table.Claim(Range(0, 99), Owner("b"), 1'001, kTtl);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "a", 31'000}));
  EXPECT_EQ(DescribeDecision(*refused),
            "slot range 0-99 is held by 'a' until 1970-01-01 00:00:31 UTC");
  // Part of the range is enough to refuse.
  EXPECT_TRUE(std::holds_alternative<Held>(*table.Claim(Range(50, 200), Owner("b"), 1'001, kTtl)));
  EXPECT_EQ(table.rows().size(), 1u);
  EXPECT_EQ(table.last_epoch(), Epoch(1));
}

TEST(OwnershipTable, a_lease_that_ends_exactly_now_is_lapsed) {
  OwnershipTable table;
  AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  EXPECT_EQ(AsGrant(table.Claim(Range(0, 99), Owner("b"), 30'000, kTtl)).epoch, Epoch(2));
}

TEST(OwnershipTable, a_lapsed_lease_is_claimed_at_a_new_epoch_and_fences_the_old_owner) {
  OwnershipTable table;
  const Grant old = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  const Grant next = AsGrant(table.Claim(Range(0, 99), Owner("b"), 30'001, kTtl));
  EXPECT_GT(next.epoch, old.epoch);
  EXPECT_TRUE(next.fresh);
  EXPECT_EQ(table.Renew(Range(0, 99), Owner("a"), old.epoch, 30'002, kTtl),
            Decision(Lost{Range(0, 99)}));
  EXPECT_FALSE(table.Release(Range(0, 99), Owner("a"), old.epoch, 30'002));
  EXPECT_FALSE(table.Admits(5, Owner("a"), old.epoch));
  EXPECT_TRUE(table.Admits(5, Owner("b"), next.epoch));
}

TEST(OwnershipTable, the_same_owner_reclaims_without_a_new_epoch) {
  OwnershipTable table;
  const Grant first = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  // A restart of the owner, or a second process on the same volume.
  const Grant again = AsGrant(table.Claim(Range(0, 99), Owner("a"), 60'000, kTtl));
  EXPECT_EQ(again.epoch, first.epoch);
  EXPECT_FALSE(again.fresh);
  EXPECT_EQ(again.lease_expires_ms, 90'000);
}

TEST(OwnershipTable, renew_extends_the_lease_and_works_after_a_lapse_nobody_used) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  const Grant renewed = AsGrant(table.Renew(Range(0, 99), Owner("a"), grant.epoch, 40'000, kTtl));
  EXPECT_EQ(renewed.epoch, grant.epoch);
  EXPECT_EQ(renewed.lease_expires_ms, 70'000);
  EXPECT_FALSE(renewed.fresh);
}

TEST(OwnershipTable, renew_needs_the_exact_bounds_owner_and_epoch) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  EXPECT_EQ(table.Renew(Range(0, 98), Owner("a"), grant.epoch, 1, kTtl),
            Decision(Lost{Range(0, 98)}));
  EXPECT_EQ(table.Renew(Range(0, 99), Owner("b"), grant.epoch, 1, kTtl),
            Decision(Lost{Range(0, 99)}));
  EXPECT_EQ(table.Renew(Range(0, 99), Owner("a"), Epoch(2), 1, kTtl),
            Decision(Lost{Range(0, 99)}));
}

TEST(OwnershipTable, a_late_renew_does_not_shorten_a_newer_lease) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  AsGrant(table.Renew(Range(0, 99), Owner("a"), grant.epoch, 40'000, kTtl));
  // An older call, sent at 10 s, lands after the one sent at 40 s.
  const Grant late = AsGrant(table.Renew(Range(0, 99), Owner("a"), grant.epoch, 10'000, kTtl));
  EXPECT_EQ(late.lease_expires_ms, 70'000);
  EXPECT_EQ(table.rows()[0].lease_expires_ms, 70'000);
}

TEST(OwnershipTable, a_late_reclaim_and_a_shorter_ttl_do_not_shorten_a_lease) {
  OwnershipTable table;
  AsGrant(table.Claim(Range(0, 99), Owner("a"), 40'000, kTtl));
  EXPECT_EQ(AsGrant(table.Claim(Range(0, 99), Owner("a"), 10'000, kTtl)).lease_expires_ms, 70'000);
  EXPECT_EQ(AsGrant(table.Claim(Range(0, 99), Owner("a"), 41'000, Millis(3'000))).lease_expires_ms,
            70'000);
}

TEST(OwnershipTable, release_lets_another_owner_claim_at_once) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  EXPECT_TRUE(table.Release(Range(0, 99), Owner("a"), grant.epoch, 1'000));
  EXPECT_EQ(table.rows()[0].lease_expires_ms, 1'000);
  const Grant next = AsGrant(table.Claim(Range(0, 99), Owner("b"), 1'000, kTtl));
  EXPECT_EQ(next.epoch, Epoch(2));
}

TEST(OwnershipTable, a_late_release_does_not_lengthen_an_ended_lease) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  EXPECT_TRUE(table.Release(Range(0, 99), Owner("a"), grant.epoch, 1'000));
  EXPECT_TRUE(table.Release(Range(0, 99), Owner("a"), grant.epoch, 5'000));
  EXPECT_EQ(table.rows()[0].lease_expires_ms, 1'000);
}

TEST(OwnershipTable, a_live_range_of_another_shape_is_refused_even_to_its_owner) {
  OwnershipTable table;
  AsGrant(table.Claim(Range(0, 199), Owner("a"), 0, kTtl));
  // An old process of owner "a" may still serve 100-199.
  EXPECT_TRUE(std::holds_alternative<Held>(*table.Claim(Range(0, 99), Owner("a"), 1'000, kTtl)));
  EXPECT_EQ(table.last_epoch(), Epoch(1));
}

TEST(OwnershipTable, a_reshaped_range_takes_a_new_epoch_and_frees_the_rest) {
  OwnershipTable table;
  const Grant wide = AsGrant(table.Claim(Range(0, 199), Owner("a"), 0, kTtl));
  ASSERT_TRUE(table.Release(Range(0, 199), Owner("a"), wide.epoch, 1'000));
  const Grant narrow = AsGrant(table.Claim(Range(0, 99), Owner("a"), 1'000, kTtl));
  EXPECT_TRUE(narrow.fresh);
  EXPECT_EQ(narrow.epoch, Epoch(2));
  EXPECT_EQ(table.RowFor(150), nullptr);
  EXPECT_EQ(AsGrant(table.Claim(Range(100, 199), Owner("b"), 1'000, kTtl)).epoch, Epoch(3));
}

TEST(OwnershipTable, lapsed_ranges_of_other_shapes_are_absorbed) {
  OwnershipTable table;
  AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  AsGrant(table.Claim(Range(100, 199), Owner("c"), 0, kTtl));
  const Grant grant = AsGrant(table.Claim(Range(0, 199), Owner("b"), 30'000, kTtl));
  EXPECT_EQ(grant.epoch, Epoch(3));
  ASSERT_EQ(table.rows().size(), 1u);
  EXPECT_EQ(table.rows()[0].range, Range(0, 199));
}

TEST(OwnershipTable, a_claim_goes_above_the_epoch_a_replicator_saw) {
  OwnershipTable table;
  EXPECT_EQ(AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl)).epoch, Epoch(1));
  // The counter went back (a restored control database) and a replica shows
  // epoch 7: the owner's own row does not keep its epoch.
  const Grant grant = AsGrant(table.Claim(Range(0, 99), Owner("a"), 1'000, kTtl, 7));
  EXPECT_TRUE(grant.fresh);
  EXPECT_EQ(grant.epoch, Epoch(8));
  EXPECT_EQ(table.last_epoch(), Epoch(8));
  const Grant again = AsGrant(table.Claim(Range(0, 99), Owner("a"), 2'000, kTtl, 7));
  EXPECT_EQ(again.epoch, Epoch(8));
  EXPECT_FALSE(again.fresh);
}

TEST(OwnershipTable, epochs_are_never_reused_after_rows_are_removed) {
  OwnershipTable table;
  const Grant first = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  table.Release(Range(0, 99), Owner("a"), first.epoch, 0);
  AsGrant(table.Claim(Range(0, 49), Owner("a"), 0, kTtl));
  auto rebuilt = OwnershipTable::FromParts(table.rows(), table.last_epoch().value());
  ASSERT_TRUE(rebuilt.ok());
  EXPECT_EQ(AsGrant(rebuilt->Claim(Range(50, 99), Owner("b"), 0, kTtl)).epoch, Epoch(3));
  // A counter below the rows is raised to them.
  EXPECT_EQ(OwnershipTable::FromParts(table.rows(), 0)->last_epoch(), Epoch(2));
}

TEST(OwnershipTable, rebuilding_refuses_rows_that_break_an_invariant) {
  const OwnershipRow a{Range(0, 99), Owner("a"), Epoch(1), 0};
  const OwnershipRow b{Range(50, 150), Owner("b"), Epoch(2), 0};
  const OwnershipRow c{Range(200, 300), Owner("c"), Epoch(1), 0};
  const OwnershipRow zero{Range(400, 401), Owner("c"), Epoch(0), 0};
  EXPECT_EQ(OwnershipTable::FromParts({a, b}, 2).status().code(), Code::kDataLoss);
  EXPECT_NE(OwnershipTable::FromParts({a, b}, 2).status().message().find("overlap"),
            std::string::npos);
  EXPECT_EQ(OwnershipTable::FromParts({a, c}, 2).status().code(), Code::kDataLoss);
  EXPECT_EQ(OwnershipTable::FromParts({zero}, 2).status().code(), Code::kDataLoss);
}

TEST(OwnershipTable, an_exhausted_counter_refuses_a_new_epoch) {
  auto table = OwnershipTable::FromParts({}, Epoch::kMax);
  ASSERT_TRUE(table.ok());
  const auto claim = table->Claim(Range(0, 1), Owner("a"), 0, kTtl);
  EXPECT_EQ(claim.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(table->rows().empty());
}

TEST(OwnershipTable, a_lease_end_saturates_instead_of_wrapping) {
  OwnershipTable table;
  const Grant grant = AsGrant(table.Claim(Range(0, 1), Owner("a"), INT64_MAX - 5, kTtl));
  EXPECT_EQ(grant.lease_expires_ms, INT64_MAX);
}

TEST(OwnershipTable, an_offered_range_is_claimed_by_its_target_at_once_at_a_new_epoch) {
  OwnershipTable table;
  const Grant old = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("a"), old.epoch, 1'000, Owner("b"), kTtl));
  const Grant next = AsGrant(table.Claim(Range(0, 99), Owner("b"), 1'001, kTtl));
  EXPECT_TRUE(next.fresh);
  EXPECT_GT(next.epoch, old.epoch);
  EXPECT_FALSE(table.rows().front().offered_to.has_value());
  EXPECT_EQ(table.Renew(Range(0, 99), Owner("a"), old.epoch, 1'002, kTtl),
            Decision(Lost{Range(0, 99)}));
}

TEST(OwnershipTable, an_offered_range_refuses_everyone_else_naming_the_target_until_the_window_ends) {
  OwnershipTable table;
  const Grant old = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("a"), old.epoch, 1'000, Owner("b"), kTtl));
  const auto refused = table.Claim(Range(50, 60), Owner("c"), 1'001, kTtl);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "b", 31'000, true}));
  EXPECT_EQ(DescribeDecision(*refused),
            "slot range 0-99 is offered to 'b' until 1970-01-01 00:00:31 UTC");
  // The owner that offered it gave it away: no reclaim, no renewal.
  EXPECT_TRUE(std::holds_alternative<Held>(*table.Claim(Range(0, 99), Owner("a"), 1'001, kTtl)));
  EXPECT_EQ(table.Renew(Range(0, 99), Owner("a"), old.epoch, 1'001, kTtl),
            Decision(Lost{Range(0, 99)}));
  // The window passes unclaimed: anyone may claim, as after a release.
  EXPECT_TRUE(AsGrant(table.Claim(Range(0, 99), Owner("c"), 31'000, kTtl)).fresh);
}

TEST(OwnershipTable, a_target_claim_of_part_of_an_offered_range_is_refused_and_the_offer_stays_whole) {
  OwnershipTable table;
  const Grant old = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("a"), old.epoch, 1'000, Owner("b"), kTtl));
  const OwnershipTable offered = table;
  for (const SlotRange part : {Range(0, 49), Range(50, 150)}) {
    const auto refused = table.Claim(part, Owner("b"), 1'001, kTtl);
    ASSERT_TRUE(refused.ok());
    EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "b", 31'000, true})) << part.ToString();
  }
  EXPECT_EQ(table, offered);
  // A range that covers the offer takes it whole.
  EXPECT_TRUE(AsGrant(table.Claim(Range(0, 150), Owner("b"), 1'002, kTtl)).fresh);
  ASSERT_EQ(table.rows().size(), 1u);
  EXPECT_EQ(table.rows().front().range, Range(0, 150));
}

TEST(OwnershipTable, an_offer_ends_the_lease_now_and_needs_the_exact_row) {
  OwnershipTable table;
  const Grant old = AsGrant(table.Claim(Range(0, 99), Owner("a"), 0, kTtl));
  EXPECT_FALSE(table.Offer(Range(0, 99), Owner("a"), Epoch(old.epoch.value() + 1), 1'000,
                           Owner("b"), kTtl));
  EXPECT_FALSE(table.Offer(Range(0, 99), Owner("c"), old.epoch, 1'000, Owner("b"), kTtl));
  EXPECT_FALSE(table.rows().front().offered_to.has_value());
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("a"), old.epoch, 1'000, Owner("b"), kTtl));
  EXPECT_EQ(table.rows().front().lease_expires_ms, 1'000);
  EXPECT_EQ(table.rows().front().offer_expires_ms, 31'000);
}

}  // namespace
}  // namespace fleetfs::lease
