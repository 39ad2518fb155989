#include "vfs/serving_view.h"

#include <gtest/gtest.h>

namespace fleetfs::vfs {
namespace {

using std::chrono::seconds;

const MonoTime kT0{};

ServedRange Range(Slot first, Slot last, std::uint64_t epoch, std::uint64_t period,
                  MonoTime until) {
  return ServedRange{first, last, ServingToken{epoch, period}, until};
}

ServingView View(std::vector<ServedRange> ranges, bool accepting = true) {
  auto view = ServingView::Make(std::move(ranges), accepting);
  EXPECT_TRUE(view.ok()) << view.status().message();
  return view.ok() ? *view : ServingView();
}

TEST(ServingView, a_draining_range_admits_new_names_only_for_tenants_with_open_handles) {
  ServedRange draining = Range(0, 99, 3, 1, kT0 + seconds(10));
  draining.accepting = false;
  ServingView view = View({draining, Range(100, 199, 4, 1, kT0 + seconds(10))});
  EXPECT_EQ(view.ForName(5, kT0, /*tenant_open=*/false), nullptr);
  EXPECT_NE(view.ForName(5, kT0, /*tenant_open=*/true), nullptr);
  EXPECT_NE(view.ForName(150, kT0, /*tenant_open=*/false), nullptr) << "other ranges go on";
  // Its handles are admitted as before.
  EXPECT_TRUE(view.Admits(5, ServingToken{3, 1}, kT0));
}

TEST(ServingView, a_slot_is_served_by_the_range_that_contains_it_until_its_local_lease_ends) {
  ServingView view = View({Range(100, 199, 7, 1, kT0 + seconds(20)),
                           Range(0, 99, 3, 1, kT0 + seconds(10))});
  ASSERT_NE(view.Find(0, kT0), nullptr);
  EXPECT_EQ(view.Find(0, kT0)->token.epoch, 3u);
  EXPECT_EQ(view.Find(150, kT0)->token.epoch, 7u);
  EXPECT_EQ(view.Find(200, kT0), nullptr);
  EXPECT_EQ(view.Find(16383, kT0), nullptr);
  // At the local lease's end the range is no longer served, whether or not a
  // newer view was published.
  EXPECT_EQ(view.Find(50, kT0 + seconds(10)), nullptr);
  EXPECT_NE(view.Find(150, kT0 + seconds(10)), nullptr);
}

TEST(ServingView, overlapping_or_malformed_ranges_are_refused_with_both_named) {
  auto overlap = ServingView::Make({Range(0, 100, 1, 1, kT0), Range(100, 200, 2, 1, kT0)}, true);
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("0-100 and 100-200 overlap"), std::string::npos);
  auto backwards = ServingView::Make({Range(9, 1, 1, 1, kT0)}, true);
  ASSERT_FALSE(backwards.ok());
  EXPECT_NE(backwards.status().message().find("9-1"), std::string::npos);
}

TEST(ServingView, a_handle_is_admitted_only_under_the_token_it_was_opened_with) {
  ServingView view = View({Range(0, 99, 5, 2, kT0 + seconds(10))});
  EXPECT_TRUE(view.Admits(10, ServingToken{5, 2}, kT0));
  EXPECT_FALSE(view.Admits(10, ServingToken{5, 1}, kT0));  // opened before a lapse
  EXPECT_FALSE(view.Admits(10, ServingToken{4, 2}, kT0));  // an older epoch
  EXPECT_FALSE(view.Admits(100, ServingToken{5, 2}, kT0));
  EXPECT_FALSE(view.Admits(10, ServingToken{5, 2}, kT0 + seconds(10)));
}

TEST(ServingView, a_renewal_withdraws_nothing_but_a_lapse_a_loss_or_a_new_period_does) {
  ServingView before = View({Range(0, 99, 5, 1, kT0 + seconds(10)),
                             Range(100, 199, 6, 1, kT0 + seconds(10))});
  ServingView renewed = View({Range(0, 99, 5, 1, kT0 + seconds(20)),
                              Range(100, 199, 6, 1, kT0 + seconds(20))});
  EXPECT_TRUE(before.WithdrawnBy(renewed, kT0 + seconds(1)).empty());

  ServingView lost = View({Range(0, 99, 5, 1, kT0 + seconds(20))});
  auto withdrawn = before.WithdrawnBy(lost, kT0 + seconds(1));
  ASSERT_EQ(withdrawn.size(), 1u);
  EXPECT_EQ(withdrawn[0].first, 100);

  // The same epoch served again after a lapse: handles of the first period go.
  ServingView again = View({Range(0, 99, 5, 2, kT0 + seconds(20)),
                            Range(100, 199, 6, 1, kT0 + seconds(20))});
  withdrawn = before.WithdrawnBy(again, kT0 + seconds(1));
  ASSERT_EQ(withdrawn.size(), 1u);
  EXPECT_EQ(withdrawn[0].first, 0);

  // A view whose lease already ended at publication withdraws everything.
  EXPECT_EQ(before.WithdrawnBy(before, kT0 + seconds(10)).size(), 2u);
}

TEST(ServingView, a_reshaped_range_is_withdrawn_even_where_its_slots_stay_served) {
  ServingView before = View({Range(0, 199, 5, 1, kT0 + seconds(10))});
  ServingView split = View({Range(0, 99, 5, 1, kT0 + seconds(10)),
                            Range(100, 199, 9, 1, kT0 + seconds(10))});
  EXPECT_EQ(before.WithdrawnBy(split, kT0).size(), 1u);
}

TEST(ServingView, a_draining_view_admits_open_handles_but_says_it_accepts_nothing_new) {
  ServingView draining = View({Range(0, 99, 5, 1, kT0 + seconds(10))}, false);
  EXPECT_FALSE(draining.accepting());
  EXPECT_TRUE(draining.Admits(1, ServingToken{5, 1}, kT0));
  ServingView nothing;
  EXPECT_EQ(nothing.Find(1, kT0), nullptr);
}

TEST(ServingView, a_wal_index_handle_is_admitted_in_a_later_period_of_the_same_epoch) {
  ServingView again = View({Range(0, 99, 5, 2, kT0 + seconds(10))});
  // Opened in period 1, the range served again in period 2 at the same epoch.
  EXPECT_TRUE(again.Admits(10, FileRole::kShm, ServingToken{5, 1}, kT0));
  EXPECT_FALSE(again.Admits(10, FileRole::kMain, ServingToken{5, 1}, kT0));
  EXPECT_FALSE(again.Admits(10, FileRole::kWal, ServingToken{5, 1}, kT0));
  EXPECT_FALSE(again.Admits(10, FileRole::kJournal, ServingToken{5, 1}, kT0));
}

TEST(ServingView, a_wal_index_handle_is_not_admitted_under_a_new_epoch_or_after_the_lease_end) {
  ServingView newer = View({Range(0, 99, 6, 3, kT0 + seconds(10))});
  EXPECT_FALSE(newer.Admits(10, FileRole::kShm, ServingToken{5, 1}, kT0));
  ServingView same = View({Range(0, 99, 5, 2, kT0 + seconds(10))});
  EXPECT_FALSE(same.Admits(10, FileRole::kShm, ServingToken{5, 1}, kT0 + seconds(10)));
  EXPECT_FALSE(same.Admits(100, FileRole::kShm, ServingToken{5, 2}, kT0));
  EXPECT_FALSE(ServingView().Admits(10, FileRole::kShm, ServingToken{5, 2}, kT0));
}

TEST(ServingView, a_draining_view_lets_a_tenant_with_open_handles_finish_but_refuses_new_ones) {
  ServingView draining = View({Range(0, 99, 5, 1, kT0 + seconds(10))}, false);
  EXPECT_NE(draining.ForName(10, kT0, /*tenant_open=*/true), nullptr);
  EXPECT_EQ(draining.ForName(10, kT0, /*tenant_open=*/false), nullptr);
  // Not past the lease end, and not in a slot it does not serve.
  EXPECT_EQ(draining.ForName(10, kT0 + seconds(10), true), nullptr);
  EXPECT_EQ(draining.ForName(100, kT0, true), nullptr);
  ServingView accepting = View({Range(0, 99, 5, 1, kT0 + seconds(10))}, true);
  EXPECT_NE(accepting.ForName(10, kT0, false), nullptr);
}

TEST(ServingView, the_admitting_range_carries_the_lease_end_an_operation_must_finish_before) {
  ServingView view = View({Range(0, 99, 5, 2, kT0 + seconds(10))});
  const ServedRange* range = view.Admitting(10, FileRole::kShm, ServingToken{5, 1}, kT0);
  ASSERT_NE(range, nullptr);
  EXPECT_EQ(range->valid_until, kT0 + seconds(10));
  EXPECT_EQ(view.Admitting(10, FileRole::kWal, ServingToken{5, 1}, kT0), nullptr);
}

}  // namespace
}  // namespace fleetfs::vfs
