#include "lease/host_ownership.h"

#include <gtest/gtest.h>

#include <set>

#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::Owner;
using testing::Range;

constexpr Millis kTtl{30'000};
constexpr Millis kStep{10'000};  // ttl/3: the refresh interval and call limit

// The shared table, one wall clock and one monotonic clock that move together,
// and a store that can be cut off (partitioned) or made to hang per range.
class Fleet {
 public:
  Result<Decision> Decide(const OwnerId& owner, const StoreCall& call) {
    if (partitioned) return Unavailable("ownership store unreachable (partitioned)");
    if (call.kind == StoreCall::Kind::kClaim) {
      return table.Claim(call.range, owner, wall, kTtl, call.floor);
    }
    return table.Renew(call.range, owner, call.epoch, wall, kTtl);
  }

  // Answers every call except those of hanging ranges, which are kept for
  // later; then ends the refresh at its time limit.
  RefreshReport Refresh(HostOwnership& host) {
    for (const StoreCall& call : host.BeginRefresh(now)) {
      if (hanging.count(call.range)) {
        held_back.push_back({&host, call});
      } else {
        host.Answer(call.id, Decide(host.owner(), call));
      }
    }
    return host.EndRefresh();
  }

  // Answers the calls held back (they land late).
  void Unhang() {
    hanging.clear();
    for (auto& [host, call] : held_back) host->Answer(call.id, Decide(host->owner(), call));
    held_back.clear();
  }

  void Advance(Millis by) {
    now += by;
    wall += by.count();
  }

  OwnershipTable table;
  MonoTime now{Millis(5'000'000)};
  WallMs wall = 1'700'000'000'000;
  bool partitioned = false;
  std::set<SlotRange> hanging;
  std::vector<std::pair<HostOwnership*, StoreCall>> held_back;
};

HostOwnership Host(const std::string& owner, std::vector<SlotRange> ranges) {
  auto host = HostOwnership::Make(Owner(owner), std::move(ranges), kTtl);
  EXPECT_TRUE(host.ok()) << host.status().message();
  return std::move(host).value();
}

TEST(HostOwnership, refuses_no_range_overlapping_ranges_and_a_bad_ttl) {
  EXPECT_EQ(HostOwnership::Make(Owner("a"), {}, kTtl).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(HostOwnership::Make(Owner("a"), {Range(0, 9), Range(9, 20)}, kTtl).status().message(),
            "slot ranges 0-9 and 9-20 overlap; a host's configured ranges must not share a slot");
  EXPECT_EQ(HostOwnership::Make(Owner("a"), {Range(0, 9)}, Millis(1'000)).status().code(),
            Code::kInvalidArgument);
}

TEST(HostOwnership, claims_then_serves_until_two_thirds_of_the_ttl_after_sending) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 99)});
  const MonoTime sent = fleet.now;
  const RefreshReport report = fleet.Refresh(a);
  ASSERT_EQ(report.claimed.size(), 1u);
  EXPECT_EQ(report.claimed[0], std::pair(Range(0, 99), Epoch(1)));
  EXPECT_EQ(a.EpochFor(5, fleet.now), Epoch(1));
  EXPECT_EQ(a.EpochFor(100, fleet.now), std::nullopt);
  EXPECT_EQ(a.NextLapse(fleet.now), sent + Millis(20'000));
  EXPECT_EQ(a.EpochFor(5, sent + Millis(19'999)), Epoch(1));
  EXPECT_EQ(a.EpochFor(5, sent + Millis(20'000)), std::nullopt);
}

TEST(HostOwnership, waits_naming_the_holder_then_claims_after_the_lapse) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 99)});
  HostOwnership b = Host("b", {Range(0, 99)});
  fleet.Refresh(a);
  RefreshReport report = fleet.Refresh(b);
  ASSERT_EQ(report.waiting.size(), 1u);
  EXPECT_EQ(report.waiting[0].holder.owner, "a");
  EXPECT_EQ(report.waiting[0].holder.lease_expires_ms, fleet.wall + kTtl.count());
  EXPECT_EQ(b.Status(fleet.now)[0].last, RangeOutcome::kWaiting);
  // A stops renewing; once the store lease ends, B claims at epoch 2.
  fleet.Advance(kTtl);
  EXPECT_EQ(a.EpochFor(5, fleet.now), std::nullopt) << "A's local lease ended first";
  report = fleet.Refresh(b);
  EXPECT_EQ(report.claimed, (std::vector{std::pair(Range(0, 99), Epoch(2))}));
  // A comes back: its renew is refused and it drops the range, then waits.
  report = fleet.Refresh(a);
  EXPECT_EQ(report.lost, std::vector{Range(0, 99)});
  EXPECT_FALSE(a.Status(fleet.now)[0].epoch.has_value());
  EXPECT_EQ(fleet.Refresh(a).waiting.size(), 1u);
}

TEST(HostOwnership, a_waiting_range_shows_waiting_while_its_next_call_is_out) {
  // A standby host's status (and /health) must not flap to "not claimed yet"
  // during every refresh while the store call runs.
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 99)});
  HostOwnership b = Host("b", {Range(0, 99)});
  fleet.Refresh(a);
  ASSERT_EQ(fleet.Refresh(b).waiting.size(), 1u);
  fleet.Advance(Millis(1'000));
  auto calls = b.BeginRefresh(fleet.now);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(b.Status(fleet.now)[0].last, RangeOutcome::kWaiting);
  EXPECT_TRUE(b.Status(fleet.now)[0].call_running);
  b.Answer(calls[0].id, fleet.Decide(b.owner(), calls[0]));
  EXPECT_EQ(b.EndRefresh().waiting.size(), 1u);
  EXPECT_EQ(b.Status(fleet.now)[0].last, RangeOutcome::kWaiting);
}

TEST(HostOwnership, a_stuck_range_does_not_lapse_the_other) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9), Range(10, 19)});
  ASSERT_EQ(fleet.Refresh(a).claimed.size(), 2u);
  fleet.hanging.insert(Range(0, 9));
  RefreshReport report;
  for (int cycle = 0; cycle < 3; ++cycle) {  // more than one local lease
    fleet.Advance(kStep);
    report = fleet.Refresh(a);
    EXPECT_EQ(report.renewed, std::vector{Range(10, 19)});
  }
  ASSERT_EQ(report.failed.size(), 1u);
  EXPECT_EQ(report.failed[0].first, Range(0, 9));
  EXPECT_EQ(report.failed[0].second, kStillRunningText);
  EXPECT_TRUE(a.EpochFor(15, fleet.now).has_value()) << "the live range serves";
  EXPECT_EQ(a.EpochFor(3, fleet.now), std::nullopt) << "the stuck range lapsed";
  EXPECT_TRUE(a.AnyLapsed(fleet.now));
  EXPECT_TRUE(a.Unsettled()) << "a timed out call may still land";
  EXPECT_EQ(fleet.held_back.size(), 1u) << "the stuck range made no new call";
}

TEST(HostOwnership, a_timed_out_call_reports_apart_from_a_still_running_one) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9), Range(10, 19)});
  fleet.hanging.insert(Range(0, 9));
  RefreshReport report = fleet.Refresh(a);
  EXPECT_EQ(report.failed, (std::vector{std::pair(Range(0, 9), std::string(kTimedOutText))}));
  EXPECT_EQ(report.claimed.size(), 1u);
  report = fleet.Refresh(a);
  EXPECT_EQ(report.failed,
            (std::vector{std::pair(Range(0, 9), std::string(kStillRunningText))}));
  // The store answers late: the claim it made is not served, but the range
  // calls again and gets the same epoch (its own row, same bounds).
  fleet.Unhang();
  EXPECT_FALSE(a.Unsettled());
  EXPECT_EQ(a.EpochFor(3, fleet.now), std::nullopt) << "a late grant is not served";
  report = fleet.Refresh(a);
  ASSERT_EQ(report.claimed.size(), 1u);
  EXPECT_EQ(report.claimed[0].first, Range(0, 9));
  EXPECT_TRUE(report.failed.empty());
  EXPECT_EQ(report.renewed, std::vector{Range(10, 19)});
}

TEST(HostOwnership, a_partitioned_host_stops_serving_before_another_can_claim) {
  Fleet fleet;
  HostOwnership a = Host("a", {SlotRange::All()});
  fleet.Refresh(a);
  ASSERT_TRUE(a.EpochFor(7, fleet.now).has_value());
  fleet.partitioned = true;
  for (int cycle = 0; cycle < 2; ++cycle) {
    fleet.Advance(kStep);
    const RefreshReport report = fleet.Refresh(a);
    ASSERT_EQ(report.failed.size(), 1u);
    EXPECT_NE(report.failed[0].second.find("unreachable"), std::string::npos);
  }
  // 20 s after the last renew was sent: A stops serving ...
  EXPECT_EQ(a.EpochFor(7, fleet.now), std::nullopt);
  // ... while the store still holds A's lease for 10 s more: nobody serves.
  fleet.partitioned = false;
  HostOwnership b = Host("b", {SlotRange::All()});
  EXPECT_EQ(fleet.Refresh(b).waiting.size(), 1u);
  EXPECT_EQ(b.EpochFor(7, fleet.now), std::nullopt);
  // Only after the store lease ends may B claim.
  fleet.Advance(kStep);
  EXPECT_EQ(fleet.Refresh(b).claimed.size(), 1u);
}

TEST(HostOwnership, a_renewal_that_returns_after_a_fence_does_not_bring_the_range_back) {
  Fleet fleet;
  HostOwnership a = Host("a", {SlotRange::All()});
  fleet.Refresh(a);
  fleet.Advance(kStep);
  const auto calls = a.BeginRefresh(fleet.now);
  ASSERT_EQ(calls.size(), 1u);
  // A replicator sees epoch 5 while the renewal is in flight.
  EXPECT_EQ(a.Lose(7, Epoch(5)), SlotRange::All());
  a.Answer(calls[0].id, fleet.Decide(a.owner(), calls[0]));
  EXPECT_EQ(a.EndRefresh().lost, std::vector{SlotRange::All()});
  EXPECT_EQ(a.EpochFor(7, fleet.now), std::nullopt) << "the renewed epoch is under the floor";
  // The next claim goes above the floor.
  EXPECT_EQ(fleet.Refresh(a).claimed, (std::vector{std::pair(SlotRange::All(), Epoch(6))}));
  EXPECT_EQ(a.Status(fleet.now)[0].fence_floor, 5u);
}

TEST(HostOwnership, lose_drops_only_an_older_epoch_and_only_its_range) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9), Range(10, 19)});
  fleet.Refresh(a);
  const Epoch first = *a.EpochFor(3, fleet.now);
  EXPECT_EQ(a.Lose(3, first), std::nullopt) << "the same epoch is not newer";
  EXPECT_EQ(a.Lose(3, Epoch(9)), Range(0, 9));
  EXPECT_EQ(a.EpochFor(3, fleet.now), std::nullopt);
  EXPECT_TRUE(a.EpochFor(15, fleet.now).has_value());
  EXPECT_EQ(a.Lose(500, Epoch(99)), std::nullopt) << "a slot this host does not claim";
  const RefreshReport report = fleet.Refresh(a);
  EXPECT_EQ(report.claimed, (std::vector{std::pair(Range(0, 9), Epoch(10))}));
  EXPECT_EQ(report.renewed, std::vector{Range(10, 19)});
}

TEST(HostOwnership, a_late_renew_neither_shortens_nor_extends_the_local_lease) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9)});
  fleet.Refresh(a);
  fleet.Advance(kStep);
  const MonoTime second_sent = fleet.now;
  fleet.Refresh(a);
  ASSERT_EQ(a.NextLapse(fleet.now), second_sent + Millis(20'000));
  // A renew sent earlier that lands now (the store extends by its own time,
  // but the local lease counts from the send): it is late and ignored.
  fleet.hanging.insert(Range(0, 9));
  fleet.Advance(kStep);
  fleet.Refresh(a);  // times out
  fleet.Advance(Millis(5'000));
  fleet.Unhang();
  EXPECT_EQ(a.NextLapse(fleet.now), second_sent + Millis(20'000));
  EXPECT_EQ(a.EpochFor(3, second_sent + Millis(19'999)), Epoch(1));
  EXPECT_EQ(a.EpochFor(3, second_sent + Millis(20'000)), std::nullopt);
}

TEST(HostOwnership, a_reshaped_range_takes_a_new_epoch) {
  Fleet fleet;
  HostOwnership wide = Host("a", {Range(0, 199)});
  fleet.Refresh(wide);
  // The host restarts with a narrower range: while the old shape is live, the
  // new one waits (an old process may still serve 100-199).
  HostOwnership narrow = Host("a", {Range(0, 99)});
  EXPECT_EQ(fleet.Refresh(narrow).waiting.size(), 1u);
  fleet.Advance(kTtl);
  const RefreshReport report = fleet.Refresh(narrow);
  EXPECT_EQ(report.claimed, (std::vector{std::pair(Range(0, 99), Epoch(2))}));
  EXPECT_EQ(fleet.table.RowFor(150), nullptr) << "the rest of the old shape is free";
}

TEST(HostOwnership, a_restart_with_the_same_ranges_keeps_its_epoch) {
  Fleet fleet;
  HostOwnership first = Host("a", {Range(0, 99)});
  fleet.Refresh(first);
  HostOwnership again = Host("a", {Range(0, 99)});
  EXPECT_EQ(fleet.Refresh(again).claimed, (std::vector{std::pair(Range(0, 99), Epoch(1))}));
}

TEST(HostOwnership, the_report_keeps_the_configured_order_whatever_the_answer_order) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(100, 199), Range(0, 99)});
  auto calls = a.BeginRefresh(fleet.now);
  ASSERT_EQ(calls.size(), 2u);
  a.Answer(calls[1].id, fleet.Decide(a.owner(), calls[1]));
  EXPECT_FALSE(a.AllAnswered());
  a.Answer(calls[0].id, fleet.Decide(a.owner(), calls[0]));
  EXPECT_TRUE(a.AllAnswered());
  const RefreshReport report = a.EndRefresh();
  ASSERT_EQ(report.claimed.size(), 2u);
  EXPECT_EQ(report.claimed[0].first, Range(100, 199));
  EXPECT_EQ(report.claimed[0].second, Epoch(2)) << "answered second, so epoch 2";
  EXPECT_EQ(report.claimed[1].first, Range(0, 99));
}

TEST(HostOwnership, a_failed_call_keeps_serving_until_the_local_lease_ends) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9)});
  fleet.Refresh(a);
  fleet.partitioned = true;
  fleet.Advance(kStep);
  const RefreshReport report = fleet.Refresh(a);
  EXPECT_EQ(report.failed.size(), 1u);
  EXPECT_EQ(a.EpochFor(3, fleet.now), Epoch(1)) << "10 s of the local lease are left";
  const auto status = a.Status(fleet.now)[0];
  EXPECT_TRUE(status.serving);
  EXPECT_EQ(status.lease_left, Millis(10'000));
  EXPECT_EQ(status.last, RangeOutcome::kFailed);
}

TEST(HostOwnership, the_next_wake_is_the_sooner_of_the_next_refresh_and_the_next_lapse) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 9), Range(10, 19)});
  const MonoTime first = fleet.now;
  fleet.Refresh(a);
  EXPECT_EQ(a.NextWake(first, fleet.now), first + kStep);
  // Range 0-9 hangs, so its lease is not renewed and lapses at first + 20 s.
  fleet.hanging.insert(Range(0, 9));
  fleet.Advance(kStep);
  const MonoTime second = fleet.now;
  fleet.Refresh(a);
  EXPECT_EQ(a.NextWake(second, fleet.now), second + kStep);
  fleet.Advance(Millis(5'000));
  // A refresh that started late still wakes on the lapse first.
  EXPECT_EQ(a.NextWake(fleet.now, fleet.now), first + Millis(20'000));
}

TEST(HostOwnership, release_at_shutdown_only_when_clean_and_settled) {
  Fleet fleet;
  {
    HostOwnership a = Host("a", {Range(0, 9), Range(10, 19)});
    fleet.Refresh(a);
    const ReleasePlan plan = a.PlanRelease(/*all_shipped=*/true);
    EXPECT_EQ(plan.calls.size(), 2u);
    EXPECT_TRUE(plan.lapse_reason.empty());
    EXPECT_TRUE(a.Serving(fleet.now).empty()) << "stopping serves nothing";
  }
  fleet.Advance(kTtl);
  {
    HostOwnership a = Host("a", {Range(0, 9)});
    fleet.Refresh(a);
    const ReleasePlan plan = a.PlanRelease(/*all_shipped=*/false);
    EXPECT_TRUE(plan.calls.empty());
    EXPECT_NE(plan.lapse_reason.find("not all shipped"), std::string::npos);
  }
  fleet.Advance(kTtl);
  {
    HostOwnership a = Host("a", {Range(0, 9)});
    fleet.Refresh(a);
    fleet.hanging.insert(Range(0, 9));
    fleet.Advance(kStep);
    fleet.Refresh(a);
    const ReleasePlan plan = a.PlanRelease(/*all_shipped=*/true);
    EXPECT_TRUE(plan.calls.empty()) << "a call may still land and extend the lease";
    EXPECT_NE(plan.lapse_reason.find("may still land"), std::string::npos);
    fleet.Unhang();
    EXPECT_TRUE(a.Serving(fleet.now).empty()) << "a late answer never brings a range back";
  }
  {
    HostOwnership a = Host("c", {Range(50, 59)});
    fleet.Refresh(a);
    a.MarkUnsettled();
    EXPECT_TRUE(a.PlanRelease(true).calls.empty());
  }
}

TEST(HostOwnership, a_handoff_waits_for_a_running_call_then_parks_the_range_with_its_epoch) {
  Fleet fleet;
  HostOwnership a = Host("a", {Range(0, 99), Range(100, 199)});
  fleet.Refresh(a);
  fleet.hanging.insert(Range(0, 99));
  fleet.Refresh(a);  // the renew of 0-99 hangs
  auto start = a.StartHandoff(Range(0, 99));
  ASSERT_TRUE(start.ok());
  EXPECT_TRUE(start->wait) << "a renew that may still land must not follow the release";
  fleet.Unhang();
  start = a.StartHandoff(Range(0, 99));
  ASSERT_TRUE(start.ok());
  EXPECT_FALSE(start->wait);
  ASSERT_TRUE(start->release.has_value());
  EXPECT_EQ(start->release->epoch, Epoch(1));
  EXPECT_TRUE(a.parked(Range(0, 99)));
  EXPECT_EQ(a.EpochFor(5, fleet.now), std::nullopt);
  EXPECT_EQ(a.Status(fleet.now)[0].last, RangeOutcome::kHandedOff);
  EXPECT_EQ(a.UnheldRanges(), std::vector{Range(0, 99)});
  // No call for a parked range, however long; the other range goes on.
  fleet.Advance(kTtl);
  const auto calls = a.BeginRefresh(fleet.now);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].range, Range(100, 199));
  a.Answer(calls[0].id, fleet.Decide(a.owner(), calls[0]));
  a.EndRefresh();
  EXPECT_EQ(a.StartHandoff(Range(0, 50)).status().code(), Code::kInvalidArgument);
  // Unparked (an offer back, an undo) while the release is still out: it
  // stays parked, no claim, until the release answers.
  a.Unpark(Range(0, 99));
  EXPECT_TRUE(a.parked(Range(0, 99)));
  EXPECT_TRUE(a.Unsettled());
  EXPECT_EQ(a.StartHandoff(Range(0, 99))->wait, true);
  a.HandoffAnswered(Range(0, 99));
  // Then claimed again at the next refresh.
  EXPECT_FALSE(a.parked(Range(0, 99)));
  EXPECT_EQ(a.BeginRefresh(fleet.now).size(), 2u);
}

}  // namespace
}  // namespace fleetfs::lease
