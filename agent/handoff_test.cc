#include "agent/handoff.h"

#include <gtest/gtest.h>

#include "lease/test_support.h"

namespace fleetfs::agent {
namespace {

using lease::testing::Owner;
using lease::testing::Range;
using std::chrono::milliseconds;

constexpr Millis kGrace{5000};
constexpr Millis kFlush{20000};

MonoTime At(std::int64_t ms) { return MonoTime(milliseconds(ms)); }

lease::RangeStatus Served(lease::SlotRange range, bool serving = true) {
  lease::RangeStatus st;
  st.range = range;
  st.serving = serving;
  if (serving) st.epoch = lease::Epoch(3);
  return st;
}

class HandoffsTest : public ::testing::Test {
 protected:
  Handoffs handoffs_{HandoffOptions{kGrace, kFlush, Millis(30'000)}};
  std::vector<lease::RangeStatus> status_{Served(Range(0, 99)), Served(Range(100, 199))};
  std::size_t open_ = 0;
  HandoffActions Step(std::int64_t ms) {
    return handoffs_.Step(At(ms), [&](lease::SlotRange) { return open_; });
  }
};

TEST_F(HandoffsTest, a_range_with_no_open_handle_is_fenced_flushed_and_released_in_turn) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  EXPECT_EQ(handoffs_.draining(), (std::set{Range(0, 99)}));
  HandoffActions step = Step(0);
  EXPECT_TRUE(step.publish);
  EXPECT_EQ(step.stop_work, (std::vector{Range(0, 99)}));
  EXPECT_TRUE(handoffs_.draining().empty());
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)}));
  HandoffActions done = handoffs_.StopWorkDone(At(30), Range(0, 99), /*all_shipped=*/true,
                                               /*may_call_store=*/true);
  EXPECT_EQ(done.release, (std::vector{Range(0, 99)}));
  HandoffActions released = handoffs_.Released(At(40), Range(0, 99), true, true);
  EXPECT_EQ(handoffs_.Report().front().state, "done");
  EXPECT_EQ(handoffs_.Report().front().note, "offered to 'b'");
  // Done: still withheld (the range is parked), and no handoff runs.
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)}));
  EXPECT_FALSE(handoffs_.running());
}

TEST_F(HandoffsTest, open_handles_get_the_grace_then_are_fenced) {
  open_ = 2;
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  HandoffActions early = Step(1000);
  EXPECT_TRUE(early.stop_work.empty());
  EXPECT_EQ(early.wake, At(1020));
  EXPECT_EQ(handoffs_.draining(), (std::set{Range(0, 99)}));
  HandoffActions late = Step(5000);
  EXPECT_EQ(late.stop_work, (std::vector{Range(0, 99)}));
  ASSERT_EQ(late.log.size(), 1u);
  EXPECT_NE(late.log[0].text.find("2 handles still open after the shutdown grace"),
            std::string::npos);
}

TEST_F(HandoffsTest, a_handoff_whose_commits_are_not_all_shipped_is_abandoned_and_served_again) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  HandoffActions done = handoffs_.StopWorkDone(At(30), Range(0, 99), /*all_shipped=*/false,
                                               /*may_call_store=*/true);
  EXPECT_TRUE(done.release.empty());
  EXPECT_TRUE(done.publish);
  EXPECT_TRUE(handoffs_.withheld().empty());
  EXPECT_EQ(handoffs_.Report().front().state, "abandoned");
  // It may be asked again.
  EXPECT_TRUE(handoffs_.Request(At(40), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
}

TEST_F(HandoffsTest, stop_work_past_its_limit_abandons_the_handoff) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  EXPECT_TRUE(Step(19'999).log.empty());
  HandoffActions late = Step(20'000);
  EXPECT_TRUE(late.publish);
  EXPECT_EQ(handoffs_.Report().front().state, "abandoned");
  // The late answer changes nothing.
  EXPECT_TRUE(handoffs_.StopWorkDone(At(20'001), Range(0, 99), true, true).release.empty());
}

TEST_F(HandoffsTest, a_stale_stop_work_of_an_abandoned_handoff_never_releases_a_later_one) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  ASSERT_EQ(Step(0).stop_work, (std::vector{Range(0, 99)}));
  Step(20'000);  // abandoned; its job still runs on the pool
  // A new handoff waits for the old job: one job per range at a time.
  const Status again = handoffs_.Request(At(20'001), Range(0, 99), Owner("b"), status_, Owner("a"));
  EXPECT_NE(again.message().find("the previous handoff is still finishing"), std::string::npos)
      << again.message();
  EXPECT_TRUE(Step(20'001).stop_work.empty());
  // The old job's late result: nothing is released, before any new fence.
  EXPECT_TRUE(handoffs_.StopWorkDone(At(20'002), Range(0, 99), true, true).release.empty());
  EXPECT_TRUE(handoffs_.Undo().size() == 1);
  // Now a new handoff runs its own fence and flush before any release.
  ASSERT_TRUE(handoffs_.Request(At(20'003), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  EXPECT_EQ(Step(20'003).stop_work, (std::vector{Range(0, 99)}));
  EXPECT_EQ(handoffs_.StopWorkDone(At(20'010), Range(0, 99), true, true).release,
            (std::vector{Range(0, 99)}));
}

TEST_F(HandoffsTest, undo_keeps_an_abandoned_handoff_whose_job_still_runs) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  Step(20'000);
  handoffs_.Undo();
  EXPECT_FALSE(handoffs_.Request(At(20'001), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  EXPECT_FALSE(handoffs_.Forget(Range(0, 99)));
}

TEST_F(HandoffsTest, a_drain_never_releases_a_held_range_that_is_not_served) {
  lease::RangeStatus held_not_serving = Served(Range(100, 199), false);
  held_not_serving.epoch = lease::Epoch(3);  // renewals fail: held, not served
  status_[1] = held_not_serving;
  auto plan = handoffs_.PlanDrain(Owner("b"), status_, Owner("a"));
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("held but not served now"), std::string::npos);
  EXPECT_TRUE(handoffs_.draining().empty()) << "nothing started";
  // Not held at all: parked, nothing to release.
  status_[1] = Served(Range(100, 199), false);
  plan = handoffs_.PlanDrain(std::nullopt, status_, Owner("a"));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->hand_off, (std::vector{Range(0, 99)}));
  EXPECT_EQ(plan->park, (std::vector{Range(100, 199)}));
}

// 0-99 offered to b at 20 ms, for a window of 30 s.
class OfferedTest : public HandoffsTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
    Step(0);
    handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
    handoffs_.Released(At(20), Range(0, 99), true, true);
    ASSERT_TRUE(offered_.Claim(Range(0, 99), Owner("a"), 0, Millis(30'000)).ok());
    ASSERT_TRUE(offered_.Offer(Range(0, 99), Owner("a"), lease::Epoch(1), 20, Owner("b"),
                               Millis(30'000)));
  }
  std::vector<lease::SlotRange> NotTaken(std::int64_t ms, const lease::OwnershipTable& table) {
    return handoffs_.OffersNotTaken(At(ms), table, Owner("a"), ms, log_);
  }
  lease::OwnershipTable offered_;  // the SQLite store's table: a's lapsed row, offered
  std::vector<LogLine> log_;
};

TEST_F(OfferedTest, an_offer_nobody_takes_gives_the_range_back_after_the_window) {
  EXPECT_FALSE(handoffs_.AwaitsOfferEnd(At(29'000)));
  EXPECT_TRUE(NotTaken(29'000, offered_).empty()) << "the window still runs";
  EXPECT_TRUE(handoffs_.AwaitsOfferEnd(At(30'100)));
  EXPECT_EQ(NotTaken(30'100, offered_), (std::vector{Range(0, 99)}));
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_NE(log_[0].text.find("nobody took the offer"), std::string::npos);
  EXPECT_TRUE(handoffs_.withheld().empty());
  EXPECT_FALSE(handoffs_.AwaitsOfferEnd(At(30'100)));
}

// etcd deletes the offering row with the offer, and the offer's key goes
// with its window: an untaken offer leaves no row at all.
TEST_F(OfferedTest, an_offer_nobody_takes_comes_back_when_the_store_keeps_no_row_of_it) {
  EXPECT_EQ(NotTaken(30'100, lease::OwnershipTable{}), (std::vector{Range(0, 99)}));
  EXPECT_TRUE(handoffs_.withheld().empty());
  EXPECT_FALSE(handoffs_.AwaitsOfferEnd(At(30'100)));
}

TEST_F(OfferedTest, an_offer_taken_keeps_the_range_parked_and_ends_the_reads_of_the_rows) {
  // Otherwise the poll would read every row on etcd, ~7 times a second,
  // for ever.
  lease::OwnershipTable taken = offered_;
  ASSERT_TRUE(taken.Claim(Range(0, 99), Owner("b"), 25'000, Millis(30'000)).ok());
  EXPECT_TRUE(NotTaken(30'100, taken).empty());
  EXPECT_FALSE(handoffs_.AwaitsOfferEnd(At(3'600'000)));
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)})) << "still parked here";
}

// Another host's row in part of the range after the window: someone claimed
// there, and the range stays parked here (a claim would be refused anyway).
TEST_F(OfferedTest, another_hosts_row_in_part_of_the_range_counts_as_taken) {
  lease::OwnershipTable other;
  ASSERT_TRUE(other.Claim(Range(50, 149), Owner("c"), 30'050, Millis(30'000)).ok());
  EXPECT_TRUE(NotTaken(30'100, other).empty());
  EXPECT_FALSE(handoffs_.AwaitsOfferEnd(At(30'100)));
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)}));
}

TEST(ControlRequest, a_handoff_to_an_owner_needs_a_replica_and_a_release_does_not) {
  ControlRequest to_b = *ParseControlRequest("drain to b");
  const Status refused = CheckControl(to_b, /*keeps_offers=*/true, /*replicating=*/false);
  EXPECT_NE(refused.message().find("replication is off"), std::string::npos) << refused.message();
  EXPECT_TRUE(CheckControl(to_b, true, true).ok());
  EXPECT_FALSE(CheckControl(to_b, false, true).ok());
  EXPECT_TRUE(CheckControl(*ParseControlRequest("drain release"), false, false).ok());
}

TEST_F(HandoffsTest, a_release_that_must_wait_for_a_running_call_is_asked_again_at_the_next_step) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
  EXPECT_EQ(handoffs_.ReleaseWaits(At(10), Range(0, 99)).wake, At(30));
  EXPECT_EQ(Step(30).release, (std::vector{Range(0, 99)}));
}

TEST_F(HandoffsTest, requests_are_refused_naming_the_rule) {
  auto message = [&](lease::SlotRange r, const std::string& to) {
    return handoffs_.Request(At(0), r, Owner(to), status_, Owner("a")).message();
  };
  EXPECT_NE(message(Range(0, 50), "b").find("is not one of this agent's configured ranges (0-99,"
                                            "100-199); a handoff takes exactly a configured range"),
            std::string::npos);
  EXPECT_NE(message(Range(0, 99), "a").find("is this agent"), std::string::npos);
  status_[1] = Served(Range(100, 199), false);
  EXPECT_NE(message(Range(100, 199), "b").find("is not served by this agent now"),
            std::string::npos);
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  EXPECT_NE(message(Range(0, 99), "c").find("is being handed off already"), std::string::npos);
}

TEST_F(HandoffsTest, undo_and_an_offer_back_forget_finished_handoffs_only) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  ASSERT_TRUE(handoffs_.Request(At(0), Range(100, 199), std::nullopt, status_, Owner("a")).ok());
  Step(0);
  handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
  handoffs_.Released(At(20), Range(0, 99), true, true);
  EXPECT_FALSE(handoffs_.Forget(Range(100, 199))) << "still running";
  EXPECT_EQ(handoffs_.Undo(), (std::vector{Range(0, 99)}));
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(100, 199)}));
  EXPECT_TRUE(handoffs_.Forget(Range(0, 99)));
}

TEST_F(HandoffsTest, an_undo_while_the_offer_is_out_serves_the_range_again_when_the_offer_fails) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  ASSERT_EQ(handoffs_.StopWorkDone(At(10), Range(0, 99), true, true).release,
            (std::vector{Range(0, 99)}));
  // The offer is out: the undo cannot stop it, HostOwnership unparks the
  // range once it answers, so the handoff must give the range back then.
  EXPECT_TRUE(handoffs_.Undo().empty()) << "a running handoff is not forgotten at once";
  EXPECT_TRUE(handoffs_.running());
  HandoffActions answered =
      handoffs_.Released(At(20), Range(0, 99), true, Status(Code::kUnavailable, "store down"));
  EXPECT_TRUE(handoffs_.withheld().empty()) << "held again by the next claim, so served";
  EXPECT_TRUE(handoffs_.Report().empty());
  EXPECT_TRUE(answered.publish);
  EXPECT_EQ(answered.claim, (std::vector{Range(0, 99)})) << "claimed now, not at the next refresh";
  ASSERT_EQ(answered.log.size(), 1u);
  EXPECT_NE(answered.log[0].text.find("undone"), std::string::npos) << answered.log[0].text;
}

TEST_F(HandoffsTest, an_undo_while_the_offer_is_out_forgets_the_handoff_whatever_the_answer) {
  for (const Result<bool>& answer : {Result<bool>(true), Result<bool>(false)}) {
    Handoffs handoffs{HandoffOptions{kGrace, kFlush, Millis(30'000)}};
    ASSERT_TRUE(handoffs.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
    handoffs.Step(At(0), [](lease::SlotRange) { return std::size_t{0}; });
    handoffs.StopWorkDone(At(10), Range(0, 99), true, true);
    handoffs.Undo();
    handoffs.Released(At(20), Range(0, 99), true, answer);
    // A standing offer refuses this host's claim until the target takes it
    // or the window ends; then this host claims the normal way and serves.
    EXPECT_TRUE(handoffs.withheld().empty());
    EXPECT_TRUE(handoffs.Forget(Range(0, 99)));
  }
}

TEST_F(HandoffsTest, an_undo_before_the_offer_is_sent_lets_the_handoff_go_on) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
  handoffs_.ReleaseWaits(At(10), Range(0, 99));
  // Not parked yet (StartHandoff said wait), so the undo unparked nothing:
  // the handoff goes on, and its range stays parked until the next undo.
  handoffs_.Undo();
  EXPECT_EQ(Step(30).release, (std::vector{Range(0, 99)}));
  handoffs_.Released(At(40), Range(0, 99), true, true);
  EXPECT_EQ(handoffs_.Report().front().state, "done");
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)}));
}

TEST_F(HandoffsTest, a_drained_range_is_not_taken_on_an_offer_to_this_host_until_undo) {
  status_[1] = Served(Range(100, 199), false);  // held by another host
  auto plan = handoffs_.PlanDrain(Owner("b"), status_, Owner("a"));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->park, (std::vector{Range(100, 199)}));
  ASSERT_TRUE(handoffs_.Drain(At(0), *plan, Owner("b"), status_, Owner("a")).ok());
  // The other host offers 100-199 here: the drain promised this host takes
  // nothing, so the offer is left to its window.
  EXPECT_FALSE(handoffs_.Forget(Range(100, 199)));
  // Nor is a range the drain handed off taken when it is offered back.
  Step(0);
  handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
  handoffs_.Released(At(20), Range(0, 99), true, true);
  EXPECT_FALSE(handoffs_.Forget(Range(0, 99)));
  EXPECT_EQ(handoffs_.withheld(), (std::set{Range(0, 99)}));
  // Undone: offers are taken again.
  EXPECT_EQ(handoffs_.Undo(), (std::vector{Range(0, 99)}));
  EXPECT_TRUE(handoffs_.Forget(Range(100, 199)));
  EXPECT_TRUE(handoffs_.Forget(Range(0, 99)));
}

TEST_F(HandoffsTest, a_range_handed_off_alone_is_taken_back_when_offered_back) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  handoffs_.StopWorkDone(At(10), Range(0, 99), true, true);
  handoffs_.Released(At(20), Range(0, 99), true, true);
  EXPECT_TRUE(handoffs_.Forget(Range(0, 99))) << "a handoff back, not a drain";
  EXPECT_TRUE(handoffs_.withheld().empty());
}

TEST_F(HandoffsTest, no_offer_starts_once_the_shutdown_settles_its_release_takes_the_range) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  // SIGTERM came, and the shutdown's own stop work ended: it starts no
  // store call and waits for the running ones before its release rule. An
  // offer now would hold that rule open (every range lapses if it outlives
  // ttl/3); the range is still held, so the shutdown's release takes it.
  HandoffActions done =
      handoffs_.StopWorkDone(At(10), Range(0, 99), /*all_shipped=*/true, /*may_call_store=*/false);
  EXPECT_TRUE(done.release.empty());
  EXPECT_FALSE(handoffs_.running());
  EXPECT_EQ(handoffs_.Report().front().state, "done");
  EXPECT_NE(handoffs_.Report().front().note.find("stopping"), std::string::npos);
  EXPECT_TRUE(Step(20).release.empty());
}

TEST_F(HandoffsTest, an_offer_still_starts_while_the_shutdown_renews) {
  ASSERT_TRUE(handoffs_.Request(At(0), Range(0, 99), Owner("b"), status_, Owner("a")).ok());
  Step(0);
  // SIGTERM came, but its drain or stop work still runs and renews: every
  // commit of the range is shipped and it is fenced, so the offer loses
  // nothing, and the target claims at once rather than at its next refresh
  // after the shutdown's release.
  EXPECT_EQ(handoffs_.StopWorkDone(At(10), Range(0, 99), true, /*may_call_store=*/true).release,
            (std::vector{Range(0, 99)}));
}

TEST(ControlRequest, well_formed_requests_parse_and_print_back) {
  auto handoff = ParseControlRequest("handoff 0-8191 to host-b\n");
  ASSERT_TRUE(handoff.ok()) << handoff.status().message();
  EXPECT_EQ(handoff->verb, ControlRequest::Verb::kHandoff);
  EXPECT_EQ(handoff->range, Range(0, 8191));
  EXPECT_EQ(FormatControlRequest(*handoff), "handoff 0-8191 to host-b\n");
  auto drain = ParseControlRequest("drain release");
  ASSERT_TRUE(drain.ok());
  EXPECT_FALSE(drain->to.has_value());
  EXPECT_EQ(FormatControlRequest(*drain), "drain release\n");
  EXPECT_EQ(ParseControlRequest("undo")->verb, ControlRequest::Verb::kUndo);
}

TEST(ControlRequest, every_valid_owner_round_trips_as_a_target_and_a_release_has_none) {
  for (const std::string& owner :
       std::vector<std::string>{"host b", "-", "release", "to", "a to b", "drain to -",
                                std::string(128, 'x'), "h\xc3\xa9te b"}) {
    const lease::OwnerId id = Owner(owner);
    for (ControlRequest request : {ControlRequest{ControlRequest::Verb::kHandoff, Range(0, 99), id},
                                   ControlRequest{ControlRequest::Verb::kDrain, std::nullopt, id}}) {
      auto back = ParseControlRequest(FormatControlRequest(request));
      ASSERT_TRUE(back.ok()) << owner << ": " << back.status().message();
      EXPECT_EQ(back->verb, request.verb) << owner;
      EXPECT_EQ(back->range, request.range) << owner;
      ASSERT_TRUE(back->to.has_value()) << owner;
      EXPECT_EQ(back->to->str(), owner);
    }
  }
  auto release = ParseControlRequest(
      FormatControlRequest(ControlRequest{ControlRequest::Verb::kDrain, std::nullopt, std::nullopt}));
  ASSERT_TRUE(release.ok());
  EXPECT_EQ(release->verb, ControlRequest::Verb::kDrain);
  EXPECT_FALSE(release->to.has_value());
}

TEST(ControlRequest, bad_requests_are_refused_naming_the_thing_and_the_rule) {
  auto message = [](std::string_view text) {
    auto parsed = ParseControlRequest(text);
    EXPECT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument);
    return parsed.ok() ? std::string() : parsed.status().message();
  };
  EXPECT_NE(message("handoff 9-1 to b").find("9-1"), std::string::npos);
  EXPECT_NE(message("handoff 0-16384 to b").find("16384"), std::string::npos);
  EXPECT_NE(message("handoff  0-99 to b").find("single spaces"), std::string::npos);
  EXPECT_NE(message("handoff 0-99 to b\nundo").find("one line"), std::string::npos);
  EXPECT_NE(message("handoff 0-99").find("takes a range and 'to OWNER'"), std::string::npos);
  EXPECT_NE(message("handoff 0-99 b").find("takes a range and 'to OWNER'"), std::string::npos);
  EXPECT_NE(message("handoff 0-99 to").find("followed by the owner"), std::string::npos);
  EXPECT_NE(message(std::string("handoff 0-99 to b\x01", 19)).find("target owner"),
            std::string::npos);
  EXPECT_NE(message("handoff 0-99 to  b").find("white space at an end"), std::string::npos);
  EXPECT_NE(message("handoff 0-99 to b ").find("white space at an end"), std::string::npos);
  EXPECT_NE(message("drain to " + std::string(129, 'x')).find("target owner"), std::string::npos);
  // The old forms: a bare owner, or '-' meaning no target, are not requests.
  EXPECT_NE(message("drain -").find("'release' for no target"), std::string::npos);
  EXPECT_NE(message("drain b").find("'release' for no target"), std::string::npos);
  EXPECT_NE(message("drain").find("'release' for no target"), std::string::npos);
  EXPECT_NE(message("drain release to b").find("'release' for no target"), std::string::npos);
  EXPECT_NE(message("undo to b").find("'undo' takes nothing"), std::string::npos);
  EXPECT_NE(message("drain to " + std::string(600, 'x')).find("at most 512 bytes"),
            std::string::npos);
  EXPECT_NE(message("reboot").find("'reboot' is unknown"), std::string::npos);
  EXPECT_NE(message("").find("single spaces"), std::string::npos);
}

TEST(OfferWatch, reads_at_its_interval_one_read_at_a_time_only_while_a_range_is_unheld) {
  OfferWatch watch(Millis(150));
  const std::vector<lease::SlotRange> none;
  const std::vector<lease::SlotRange> unheld{Range(0, 99)};
  EXPECT_FALSE(watch.Due(At(1000), none));
  EXPECT_EQ(watch.next(none), MonoTime::max());
  EXPECT_TRUE(watch.Due(At(1000), unheld));
  EXPECT_FALSE(watch.Due(At(2000), unheld)) << "one read at a time";
  lease::OwnershipTable empty;
  EXPECT_TRUE(watch.Answered(empty, unheld, Owner("a"), 0).empty());
  EXPECT_EQ(watch.next(unheld), At(1150));
  EXPECT_FALSE(watch.Due(At(1149), unheld));
  EXPECT_TRUE(watch.Due(At(1150), unheld));
}

TEST(OfferWatch, only_a_standing_offer_to_this_owner_counts) {
  OfferWatch watch(Millis(150));
  lease::OwnershipTable table;
  const auto grant = table.Claim(Range(0, 99), Owner("b"), 0, Millis(30'000));
  ASSERT_TRUE(grant.ok());
  const std::vector<lease::SlotRange> unheld{Range(0, 99)};
  watch.Due(At(0), unheld);
  EXPECT_TRUE(watch.Answered(table, unheld, Owner("a"), 1'000).empty()) << "held, not offered";
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("b"), lease::Epoch(1), 1'000, Owner("a"),
                          Millis(3'000)));
  watch.Due(At(200), unheld);
  EXPECT_TRUE(watch.Answered(table, unheld, Owner("c"), 1'001).empty()) << "offered to another";
  watch.Due(At(400), unheld);
  EXPECT_EQ(watch.Answered(table, unheld, Owner("a"), 1'001), unheld);
  watch.Due(At(600), unheld);
  EXPECT_TRUE(watch.Answered(table, unheld, Owner("a"), 4'000).empty()) << "the window ended";
  watch.Due(At(800), unheld);
  EXPECT_TRUE(watch.Answered(Status(Code::kUnavailable, "down"), unheld, Owner("a"), 1'001)
                  .empty());
}

TEST(OfferWatch, an_offer_counts_once_and_only_for_the_range_it_fits) {
  OfferWatch watch(Millis(150));
  lease::OwnershipTable table;
  ASSERT_TRUE(table.Claim(Range(0, 99), Owner("b"), 0, Millis(30'000)).ok());
  ASSERT_TRUE(table.Claim(Range(100, 199), Owner("c"), 0, Millis(30'000)).ok());
  ASSERT_TRUE(table.Offer(Range(0, 99), Owner("b"), lease::Epoch(1), 1'000, Owner("a"),
                          Millis(3'000)));
  // a is configured with 0-199: c's live row refuses its claim, so no claim.
  const std::vector<lease::SlotRange> bigger{Range(0, 199)};
  watch.Due(At(0), bigger);
  EXPECT_TRUE(watch.Answered(table, bigger, Owner("a"), 1'001).empty());
  // Exactly the range: reported once, not at every poll.
  const std::vector<lease::SlotRange> exact{Range(0, 99)};
  watch.Due(At(200), exact);
  EXPECT_EQ(watch.Answered(table, exact, Owner("a"), 1'001), exact);
  watch.Due(At(400), exact);
  EXPECT_TRUE(watch.Answered(table, exact, Owner("a"), 1'002).empty()) << "once per offer";
  // Inside a bigger configured range with nothing else live there: claimed.
  OfferWatch other(Millis(150));
  const std::vector<lease::SlotRange> wide{Range(0, 149)};
  other.Due(At(0), wide);
  EXPECT_TRUE(other.Answered(table, wide, Owner("a"), 1'001).empty()) << "c's row overlaps";
  lease::OwnershipTable alone;
  ASSERT_TRUE(alone.Claim(Range(0, 99), Owner("b"), 0, Millis(30'000)).ok());
  ASSERT_TRUE(alone.Offer(Range(0, 99), Owner("b"), lease::Epoch(1), 1'000, Owner("a"),
                          Millis(3'000)));
  other.Due(At(200), wide);
  EXPECT_EQ(other.Answered(alone, wide, Owner("a"), 1'001), wide);
}

}  // namespace
}  // namespace fleetfs::agent
