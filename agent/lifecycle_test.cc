#include "agent/lifecycle.h"

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

using lease::Epoch;
using lease::RangeStatus;
using lease::SlotRange;

constexpr Millis kTtl{3000};
constexpr Millis kGrace{1000};

class LifecycleTest : public ::testing::Test {
 protected:
  Lifecycle life_{LifecycleOptions{kTtl, kGrace}};
  MonoTime now_{std::chrono::seconds(1000)};
  Observed seen_;

  // Starting → serving with one held range.
  void Serve() {
    seen_.refreshes_ended = 1;
    seen_.held_ranges = 1;
    Actions a = life_.Step(now_, seen_);
    ASSERT_TRUE(a.mount);
    a = life_.Mounted(now_, Status::Ok(), seen_);
    ASSERT_TRUE(a.publish);
    ASSERT_EQ(life_.phase(), Phase::kServing);
  }
  // Serving → stopping: a SIGTERM with no open handle.
  Actions Stop() {
    Serve();
    Actions a = life_.Signal(now_, "SIGTERM", seen_);
    EXPECT_EQ(life_.phase(), Phase::kStopping);
    EXPECT_TRUE(a.stop_work);
    return a;
  }
  void Advance(Millis by) { now_ += by; }
};

TEST_F(LifecycleTest, mounts_only_once_the_first_refresh_has_ended) {
  EXPECT_FALSE(life_.Step(now_, seen_).mount);
  EXPECT_EQ(life_.phase(), Phase::kStarting);
  EXPECT_TRUE(life_.renews());
  seen_.refreshes_ended = 1;
  EXPECT_TRUE(life_.Step(now_, seen_).mount);
}

TEST_F(LifecycleTest, a_refused_mount_stops_with_exit_1_naming_why) {
  seen_.refreshes_ended = 1;
  life_.Step(now_, seen_);
  Actions a = life_.Mounted(now_, Status(Code::kInternal, "mounting /mnt: refused"), seen_);
  EXPECT_EQ(life_.phase(), Phase::kStopping);
  EXPECT_TRUE(a.stop_work);
  EXPECT_EQ(life_.exit_code(), 1);
  EXPECT_NE(life_.exit_reason().find("refused"), std::string::npos);
}

TEST_F(LifecycleTest, sigterm_gives_open_handles_the_shutdown_grace_then_fences_them) {
  Serve();
  seen_.open_handles = 2;
  Actions a = life_.Signal(now_, "SIGTERM", seen_);
  EXPECT_EQ(life_.phase(), Phase::kDraining);
  EXPECT_TRUE(a.publish);  // new opens are refused from now on
  EXPECT_FALSE(life_.admits_new_opens());
  EXPECT_TRUE(life_.serves());  // open handles keep working
  EXPECT_FALSE(a.stop_work);
  EXPECT_LE(a.wake, now_ + kGrace);
  Advance(kGrace - Millis(1));
  EXPECT_FALSE(life_.Step(now_, seen_).stop_work);
  Advance(Millis(1));
  a = life_.Step(now_, seen_);
  EXPECT_TRUE(a.stop_work);
  EXPECT_TRUE(a.publish);
  EXPECT_EQ(life_.phase(), Phase::kStopping);
  EXPECT_FALSE(life_.serves());
  ASSERT_FALSE(a.log.empty());
  EXPECT_NE(a.log.front().text.find("2 handles still open"), std::string::npos);
}

TEST_F(LifecycleTest, the_drain_ends_as_soon_as_the_last_handle_closes) {
  Serve();
  seen_.open_handles = 1;
  life_.Signal(now_, "SIGTERM", seen_);
  Advance(Millis(100));
  seen_.open_handles = 0;
  EXPECT_TRUE(life_.Step(now_, seen_).stop_work);
}

TEST_F(LifecycleTest, a_second_signal_skips_the_grace) {
  Serve();
  seen_.open_handles = 1;
  life_.Signal(now_, "SIGTERM", seen_);
  Actions a = life_.Signal(now_, "SIGINT", seen_);
  EXPECT_TRUE(a.stop_work);
  EXPECT_EQ(life_.phase(), Phase::kStopping);
}

TEST_F(LifecycleTest, renewals_go_on_while_the_fences_and_the_flush_run) {
  Stop();
  EXPECT_TRUE(life_.renews());
  // However long the flush takes (within its bound), the loop steps on.
  Advance(kTtl / 2);
  Actions a = life_.Step(now_, seen_);
  EXPECT_FALSE(a.release.has_value());
  EXPECT_FALSE(a.finish);
  EXPECT_TRUE(life_.renews());
}

TEST_F(LifecycleTest, the_flush_gets_two_refresh_intervals_so_a_renewal_lands_while_it_runs) {
  EXPECT_EQ(life_.flush_limit(), kTtl * 2 / 3);
  EXPECT_GT(life_.flush_limit(), kTtl / 3);
  Stop();
  // The fences and the flush may take up to a ttl before the ranges lapse.
  Advance(kTtl - Millis(1));
  EXPECT_TRUE(life_.renews());
  EXPECT_FALSE(life_.Step(now_, seen_).release.has_value());
}

TEST_F(LifecycleTest, the_release_waits_for_the_flush_result) {
  Stop();
  for (int i = 0; i < 5; ++i) {
    Advance(Millis(100));
    EXPECT_FALSE(life_.Step(now_, seen_).release.has_value());
  }
  Actions a = life_.StopWorkDone(now_, /*all_shipped=*/true, seen_);
  ASSERT_TRUE(a.release.has_value());
  EXPECT_TRUE(a.release->release);
  EXPECT_FALSE(life_.renews());
}

TEST_F(LifecycleTest, releases_when_all_is_shipped_no_call_runs_and_the_store_confirms) {
  Stop();
  Actions a = life_.StopWorkDone(now_, true, seen_);
  ASSERT_TRUE(a.release && a.release->release);
  a = life_.ReleaseSent(now_, 1, seen_);
  EXPECT_FALSE(a.finish);
  Advance(Millis(50));
  seen_.released = 1;
  a = life_.Step(now_, seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.phase(), Phase::kStopped);
  EXPECT_EQ(life_.exit_code(), 0);
}

TEST_F(LifecycleTest, commits_left_unshipped_make_the_ranges_lapse_and_the_exit_non_zero) {
  Stop();
  Actions a = life_.StopWorkDone(now_, /*all_shipped=*/false, seen_);
  ASSERT_TRUE(a.release.has_value());
  EXPECT_FALSE(a.release->release);
  EXPECT_NE(a.release->lapse_reason.find("not all shipped"), std::string::npos);
  a = life_.ReleaseSent(now_, 0, seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.exit_code(), kExitLapsed);
  EXPECT_NE(life_.exit_reason().find("not all shipped"), std::string::npos);
}

TEST_F(LifecycleTest, a_store_call_still_running_is_waited_for_up_to_ttl_over_3) {
  Stop();
  seen_.store_call_running = true;
  Actions a = life_.StopWorkDone(now_, true, seen_);
  EXPECT_FALSE(a.release.has_value());  // a renewal in flight: wait for it to land
  EXPECT_FALSE(life_.renews());         // and start no new one
  Advance(Millis(200));
  seen_.store_call_running = false;
  a = life_.Step(now_, seen_);
  ASSERT_TRUE(a.release.has_value());
  EXPECT_TRUE(a.release->release);
}

TEST_F(LifecycleTest, a_store_call_that_does_not_land_within_ttl_over_3_makes_the_ranges_lapse) {
  Stop();
  seen_.store_call_running = true;
  life_.StopWorkDone(now_, true, seen_);
  Advance(kTtl / 3 - Millis(1));
  EXPECT_FALSE(life_.Step(now_, seen_).release.has_value());
  Advance(Millis(1));
  Actions a = life_.Step(now_, seen_);
  ASSERT_TRUE(a.release.has_value());
  EXPECT_FALSE(a.release->release);
  EXPECT_NE(a.release->lapse_reason.find("may still land"), std::string::npos);
  a = life_.ReleaseSent(now_, 0, seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.exit_code(), kExitLapsed);
}

TEST_F(LifecycleTest, a_release_the_store_does_not_confirm_within_ttl_over_3_lapses) {
  Stop();
  life_.StopWorkDone(now_, true, seen_);
  life_.ReleaseSent(now_, 2, seen_);
  seen_.released = 1;
  Advance(kTtl / 3 - Millis(1));
  EXPECT_FALSE(life_.Step(now_, seen_).finish);
  Advance(Millis(1));
  Actions a = life_.Step(now_, seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.exit_code(), kExitLapsed);
  EXPECT_NE(life_.exit_reason().find("1 of 2"), std::string::npos);
}

TEST_F(LifecycleTest, stop_work_that_never_ends_lapses_after_a_ttl) {
  Stop();
  Advance(kTtl - Millis(1));
  EXPECT_FALSE(life_.Step(now_, seen_).release.has_value());
  Advance(Millis(1));
  Actions a = life_.Step(now_, seen_);
  ASSERT_TRUE(a.release.has_value());
  EXPECT_FALSE(a.release->release);
  // A late answer changes nothing.
  EXPECT_FALSE(life_.StopWorkDone(now_, true, seen_).release.has_value());
  life_.ReleaseSent(now_, 0, seen_);
  EXPECT_EQ(life_.exit_code(), kExitLapsed);
}

TEST_F(LifecycleTest, nothing_held_nothing_lapses_and_the_exit_is_clean) {
  Stop();
  seen_.held_ranges = 0;
  life_.StopWorkDone(now_, false, seen_);
  Actions a = life_.ReleaseSent(now_, 0, seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.exit_code(), 0);
}

TEST_F(LifecycleTest, a_mount_removed_from_outside_stops_with_exit_1) {
  Serve();
  Actions a = life_.SessionEnded(now_, seen_);
  EXPECT_TRUE(a.stop_work);
  life_.StopWorkDone(now_, true, seen_);
  life_.ReleaseSent(now_, 1, seen_);
  seen_.released = 1;
  EXPECT_TRUE(life_.Step(now_, seen_).finish);
  EXPECT_EQ(life_.exit_code(), 1);  // released, but the agent did not stop by request
}

TEST_F(LifecycleTest, a_failed_backing_volume_releases_and_stands_by_until_a_signal) {
  Serve();
  Actions a = life_.BackingFailed(now_, "backing volume /v is read-only (EROFS)", seen_);
  EXPECT_TRUE(a.stop_work);
  EXPECT_FALSE(life_.serves());
  life_.StopWorkDone(now_, true, seen_);
  life_.ReleaseSent(now_, 1, seen_);
  seen_.released = 1;
  a = life_.Step(now_, seen_);
  EXPECT_FALSE(a.finish);  // stays up to say why, claims nothing
  EXPECT_EQ(life_.phase(), Phase::kFailed);
  EXPECT_FALSE(life_.renews());
  EXPECT_FALSE(life_.serves());
  EXPECT_NE(life_.failure().find("EROFS"), std::string::npos);
  a = life_.Signal(now_, "SIGTERM", seen_);
  EXPECT_TRUE(a.finish);
  EXPECT_EQ(life_.exit_code(), 1);
}

// ---- the serving plan ----

RangeStatus Held(const char* range, std::uint64_t epoch, MonoTime valid_until, bool serving) {
  RangeStatus st;
  st.range = *SlotRange::Parse(range);
  st.epoch = Epoch(epoch);
  st.serving = serving;
  st.valid_until = valid_until;
  return st;
}

TEST(ServingPlan, a_draining_range_stays_served_without_new_opens_and_a_withheld_one_is_withdrawn) {
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  const auto range = *lease::SlotRange::Parse("0-99");
  auto first = plan.Update({Held("0-99", 3, t + Millis(5000), true)}, true, t);
  auto draining = plan.Update({Held("0-99", 3, t + Millis(5000), true)}, true, t + Millis(100),
                              {range}, {});
  ASSERT_EQ(draining.served.size(), 1u);
  EXPECT_FALSE(draining.served[0].accepting);
  EXPECT_EQ(draining.served[0].period, first.served[0].period) << "open handles go on";
  EXPECT_TRUE(draining.withdrawn.empty());
  auto withheld = plan.Update({Held("0-99", 3, t + Millis(5000), true)}, true, t + Millis(200),
                              {}, {range});
  EXPECT_TRUE(withheld.served.empty());
  ASSERT_EQ(withheld.withdrawn.size(), 1u);
  EXPECT_EQ(withheld.withdrawn[0].why, "it is being handed off");
  // Abandoned: served again, under a new period (the fenced handles stay fenced).
  auto again = plan.Update({Held("0-99", 3, t + Millis(5000), true)}, true, t + Millis(300));
  ASSERT_EQ(again.served.size(), 1u);
  EXPECT_TRUE(again.served[0].accepting);
  EXPECT_NE(again.served[0].period, first.served[0].period);
}

TEST(ServingPlan, a_range_keeps_its_period_while_it_is_served_without_a_gap) {
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  auto first = plan.Update({Held("0-99", 3, t + Millis(2000), true)}, true, t);
  ASSERT_EQ(first.served.size(), 1u);
  EXPECT_EQ(first.started.size(), 1u);
  EXPECT_EQ(first.warm.size(), 1u);
  auto renewed = plan.Update({Held("0-99", 3, t + Millis(3000), true)}, true, t + Millis(1000));
  ASSERT_EQ(renewed.served.size(), 1u);
  EXPECT_EQ(renewed.served[0].period, first.served[0].period);
  EXPECT_TRUE(renewed.started.empty());
  EXPECT_TRUE(renewed.withdrawn.empty());
}

TEST(ServingPlan, a_range_served_again_after_a_gap_gets_a_new_period_at_the_same_epoch) {
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  auto first = plan.Update({Held("0-99", 3, t + Millis(2000), true)}, true, t);
  auto gap = plan.Update({Held("0-99", 3, {}, false)}, true, t + Millis(2500));
  EXPECT_TRUE(gap.served.empty());
  ASSERT_EQ(gap.withdrawn.size(), 1u);
  EXPECT_EQ(gap.withdrawn[0].why, "its local lease ended");
  auto again = plan.Update({Held("0-99", 3, t + Millis(5000), true)}, true, t + Millis(3000));
  ASSERT_EQ(again.served.size(), 1u);
  EXPECT_EQ(again.served[0].epoch, Epoch(3));
  EXPECT_NE(again.served[0].period, first.served[0].period);
  EXPECT_EQ(again.started.size(), 1u);
}

TEST(ServingPlan, a_lapse_between_two_updates_still_starts_a_new_period) {
  // The loop missed the lapse: the range was renewed after its lease ended.
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  auto first = plan.Update({Held("0-99", 3, t + Millis(2000), true)}, true, t);
  auto later = plan.Update({Held("0-99", 3, t + Millis(6000), true)}, true, t + Millis(4000));
  ASSERT_EQ(later.served.size(), 1u);
  EXPECT_NE(later.served[0].period, first.served[0].period);
  ASSERT_EQ(later.withdrawn.size(), 1u);  // the old period's handles are fenced
  EXPECT_TRUE(later.warm.empty());        // same epoch, published without a gap in the map
}

TEST(ServingPlan, a_new_epoch_is_a_new_period_and_is_warmed) {
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  plan.Update({Held("0-99", 3, t + Millis(2000), true)}, true, t);
  auto next = plan.Update({Held("0-99", 4, t + Millis(3000), true)}, true, t + Millis(500));
  ASSERT_EQ(next.warm.size(), 1u);
  EXPECT_EQ(next.warm[0].epoch, Epoch(4));
  ASSERT_EQ(next.withdrawn.size(), 1u);
  EXPECT_EQ(next.withdrawn[0].why, "it was lost");
}

TEST(ServingPlan, stopping_withdraws_everything_saying_why) {
  ServingPlan plan;
  MonoTime t{std::chrono::seconds(10)};
  plan.Update({Held("0-99", 3, t + Millis(2000), true), Held("100-199", 5, t + Millis(2000), true)},
              true, t);
  auto stop = plan.Update({Held("0-99", 3, t + Millis(2000), true)}, false, t);
  EXPECT_TRUE(stop.served.empty());
  ASSERT_EQ(stop.withdrawn.size(), 2u);
  EXPECT_EQ(stop.withdrawn[0].why, "the agent is stopping");
}

}  // namespace
}  // namespace fleetfs::agent
