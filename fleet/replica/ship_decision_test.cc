#include "fleet/replica/ship_decision.h"

#include <gtest/gtest.h>

namespace fleetfs::replica {
namespace {

// A key served at epoch 2 whose log this host took at 2, file checked at 2,
// the file the tail's state, nothing waiting.
ShipInputs Steady() {
  ShipInputs in;
  in.serving_epoch = 2;
  in.log_epoch = 2;
  in.checked_epoch = 2;
  in.matches_tail = true;
  return in;
}

ShipAction Act(const ShipInputs& in) { return Decide(in).action; }

TEST(Decide, a_steady_key_with_nothing_waiting_ships_nothing) {
  EXPECT_EQ(Act(Steady()), ShipAction::kNothing);
}

TEST(Decide, commits_waiting_ship_as_a_segment) {
  ShipInputs in = Steady();
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kSegment);
}

TEST(Decide, a_fenced_writer_stops_whatever_else_is_waiting) {
  ShipInputs in = Steady();
  in.commits_waiting = in.deleted = in.gap = true;
  in.fenced = true;
  EXPECT_EQ(Act(in), ShipAction::kStop);
}

TEST(Decide, a_key_not_served_here_ships_nothing) {
  ShipInputs in = Steady();
  in.commits_waiting = true;
  in.serving_epoch.reset();
  EXPECT_EQ(Act(in), ShipAction::kNothing);
}

TEST(Decide, a_serving_view_older_than_the_log_ships_nothing) {
  ShipInputs in = Steady();
  in.commits_waiting = true;
  in.serving_epoch = 1;
  EXPECT_EQ(Act(in), ShipAction::kNothing);
}

TEST(Decide, a_new_epoch_checks_the_file_before_anything_else) {
  ShipInputs in = Steady();
  in.serving_epoch = 3;
  in.commits_waiting = in.deleted = in.gap = true;
  EXPECT_EQ(Act(in), ShipAction::kCheck);
}

TEST(Decide, a_file_checked_at_an_older_epoch_is_checked_again) {
  ShipInputs in = Steady();
  in.serving_epoch = 3;
  in.checked_epoch = 2;
  EXPECT_EQ(Act(in), ShipAction::kCheck);
}

TEST(Decide, a_file_checked_at_the_new_epoch_takes_the_log_with_a_marker) {
  ShipInputs in = Steady();
  in.serving_epoch = 3;
  in.checked_epoch = 3;
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kMarker);
}

TEST(Decide, a_first_takeover_with_no_log_position_checks_then_writes_its_marker) {
  ShipInputs in;
  in.serving_epoch = 1;
  EXPECT_EQ(Act(in), ShipAction::kCheck);
  in.checked_epoch = 1;
  EXPECT_EQ(Act(in), ShipAction::kMarker);
}

// Issue 10 item 1: under a new epoch, the order is check, marker, and only
// then the file's state; no step is skipped.
TEST(Decide, nothing_ships_under_a_new_epoch_before_the_check_and_the_marker) {
  ShipInputs in = Steady();
  in.commits_waiting = true;
  in.serving_epoch = 3;  // the key came back at a new epoch
  ASSERT_EQ(Act(in), ShipAction::kCheck);
  in.checked_epoch = 3;  // checked: the file is the log tail's state
  ASSERT_EQ(Act(in), ShipAction::kMarker);
  in.log_epoch = 3;  // the marker landed
  EXPECT_EQ(Act(in), ShipAction::kSegment);
}

TEST(Decide, a_deleted_file_ships_a_tombstone) {
  ShipInputs in = Steady();
  in.deleted = true;
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kTombstone);
}

TEST(Decide, a_deleted_file_at_a_new_epoch_takes_the_log_before_its_tombstone) {
  ShipInputs in = Steady();
  in.deleted = true;
  in.serving_epoch = 3;
  in.checked_epoch = 3;
  EXPECT_EQ(Act(in), ShipAction::kMarker);
}

TEST(Decide, an_unshippable_journal_mode_ships_nothing) {
  ShipInputs in = Steady();
  in.unshippable = true;
  in.commits_waiting = in.gap = in.snapshot_due = true;
  in.matches_tail = false;
  EXPECT_EQ(Act(in), ShipAction::kNothing);
}

TEST(Decide, an_unshippable_file_still_fences_the_old_owner_with_its_marker) {
  ShipInputs in = Steady();
  in.unshippable = true;
  in.serving_epoch = 3;
  in.checked_epoch = 3;
  EXPECT_EQ(Act(in), ShipAction::kMarker);
}

TEST(Decide, a_failed_capture_ships_a_snapshot_instead_of_a_segment) {
  ShipInputs in = Steady();
  in.gap = true;
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kSnapshot);
}

// Issue 10 item 12: a restart continues the log where the file is its
// tail's state, and snapshots only when it is not.
TEST(Decide, a_restart_whose_file_is_the_tails_state_continues_with_segments) {
  ShipInputs in = Steady();
  in.commits_waiting = true;
  in.matches_tail = true;
  EXPECT_EQ(Act(in), ShipAction::kSegment);
}

TEST(Decide, a_file_that_is_not_the_tails_state_ships_a_snapshot) {
  ShipInputs in = Steady();
  in.matches_tail = false;
  EXPECT_EQ(Act(in), ShipAction::kSnapshot);
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kSnapshot);
}

TEST(Decide, a_due_snapshot_is_shipped_before_waiting_commits) {
  ShipInputs in = Steady();
  in.snapshot_due = true;
  in.commits_waiting = true;
  EXPECT_EQ(Act(in), ShipAction::kSnapshot);
}

TEST(Decide, commits_of_the_logs_epoch_ship_under_it_after_the_lease_ended) {
  ShipInputs in = Steady();
  in.commits_waiting = in.appendable = true;
  in.serving_epoch.reset();
  EXPECT_EQ(Act(in), ShipAction::kSegment);
  in.appendable = false;  // behind a gap: only a snapshot could ship them, and only while served
  EXPECT_EQ(Act(in), ShipAction::kNothing);
}

TEST(Decide, commits_of_the_old_epoch_ship_before_the_new_epochs_check) {
  ShipInputs in = Steady();
  in.commits_waiting = in.appendable = true;
  in.serving_epoch = 3;
  EXPECT_EQ(Act(in), ShipAction::kSegment);
  in.appendable = false;
  EXPECT_EQ(Act(in), ShipAction::kCheck);
}

TEST(Decide, appendable_commits_need_the_file_to_follow_the_tail) {
  ShipInputs in = Steady();
  in.commits_waiting = in.appendable = true;
  in.serving_epoch.reset();
  in.matches_tail = false;
  EXPECT_EQ(Act(in), ShipAction::kNothing);
  in.log_epoch.reset();
  in.matches_tail = true;
  EXPECT_EQ(Act(in), ShipAction::kNothing);
}

TEST(Decide, commits_from_before_a_gap_ship_as_a_segment_then_the_snapshot) {
  ShipInputs in = Steady();
  in.gap = in.commits_waiting = in.appendable = true;
  EXPECT_EQ(Act(in), ShipAction::kSegment);
  in.appendable = false;
  EXPECT_EQ(Act(in), ShipAction::kSnapshot);
}

TEST(Decide, commits_from_before_a_switch_to_journal_mode_off_still_ship) {
  ShipInputs in = Steady();
  in.unshippable = in.commits_waiting = in.appendable = true;
  EXPECT_EQ(Act(in), ShipAction::kSegment);
}

TEST(Decide, a_file_not_yet_checked_ships_nothing_though_the_marker_is_written) {
  // A restore writes its marker before the download: the stale file it
  // replaces must not ship under that marker meanwhile.
  ShipInputs in = Steady();
  in.serving_epoch = in.log_epoch = 3;
  in.checked_epoch = 2;
  in.gap = in.commits_waiting = true;
  in.matches_tail = false;
  EXPECT_EQ(Act(in), ShipAction::kCheck);
}

TEST(Decide, every_decision_says_why) {
  ShipInputs in = Steady();
  EXPECT_FALSE(Decide(in).why.empty());
  in.fenced = true;
  EXPECT_NE(Decide(in).why.find("newer epoch"), std::string_view::npos);
  EXPECT_EQ(ShipActionName(ShipAction::kMarker), "marker");
}

}  // namespace
}  // namespace fleetfs::replica
