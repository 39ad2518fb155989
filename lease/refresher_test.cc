#include "lease/refresher.h"

#include <gtest/gtest.h>

#include <atomic>

#include <condition_variable>
#include <map>
#include <set>
#include <thread>

#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::FakeMonotonicClock;
using testing::FakeWallClock;
using testing::Owner;
using testing::Range;

constexpr Millis kTtl{30'000};
constexpr Millis kStep{10'000};

// An in-memory store whose calls for some ranges block until released.
class GatedStore final : public OwnershipStore {
 public:
  explicit GatedStore(const WallClock& clock) : clock_(clock) {}

  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override {
    Gate(range);
    std::lock_guard lock(mu_);
    return table_.Claim(range, owner, clock_.NowMs(), ttl, floor);
  }
  Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                         Millis ttl) override {
    Gate(range);
    std::lock_guard lock(mu_);
    return Result<Decision>(table_.Renew(range, owner, epoch, clock_.NowMs(), ttl));
  }
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override {
    std::lock_guard lock(mu_);
    return table_.Release(range, owner, epoch, clock_.NowMs());
  }
  Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch, const OwnerId& to,
                     Millis window) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !offers_blocked_; });
    return table_.Offer(range, owner, epoch, clock_.NowMs(), to, window);
  }
  bool keeps_offers() const override { return true; }
  Result<OwnershipTable> Read() override {
    std::lock_guard lock(mu_);
    return table_;
  }
  WallMs NowMs() const override { return clock_.NowMs(); }
  // Its time is a wall time already.
  WallMs ToWallMs(std::int64_t store_ms) const override { return store_ms; }
  std::string url() const override { return "memory://gated"; }

  void Block(SlotRange range) {
    std::lock_guard lock(mu_);
    blocked_.insert(range);
  }
  void BlockOffers() {
    std::lock_guard lock(mu_);
    offers_blocked_ = true;
  }
  void Unblock() {
    std::lock_guard lock(mu_);
    blocked_.clear();
    offers_blocked_ = false;
    cv_.notify_all();
  }
  int calls(SlotRange range) {
    std::lock_guard lock(mu_);
    return calls_[range];
  }

 private:
  void Gate(SlotRange range) {
    std::unique_lock lock(mu_);
    ++calls_[range];
    cv_.wait(lock, [&] { return blocked_.count(range) == 0; });
  }

  const WallClock& clock_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  OwnershipTable table_;
  std::set<SlotRange> blocked_;
  bool offers_blocked_ = false;
  std::map<SlotRange, int> calls_;
};

// Runs each task on its own thread; joins them all at the end.
class ThreadPerTask {
 public:
  ~ThreadPerTask() { Join(); }
  Refresher::Executor executor() {
    return [this](Refresher::Task task) {
      std::lock_guard lock(mu_);
      threads_.emplace_back(std::move(task));
    };
  }
  void Join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (auto& thread : threads) thread.join();
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// Waits (bounded, in real time) for another thread to reach a state; the
// clock the code under test reads is the fake one.
template <typename Predicate>
bool Eventually(Predicate predicate) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return predicate();
}

struct Rig {
  FakeWallClock wall{1'700'000'000'000};
  FakeMonotonicClock mono;
  std::shared_ptr<GatedStore> store = std::make_shared<GatedStore>(wall);
  ThreadPerTask threads;

  std::unique_ptr<Refresher> Make(const std::string& owner, std::vector<SlotRange> ranges) {
    auto host = HostOwnership::Make(Owner(owner), std::move(ranges), kTtl);
    EXPECT_TRUE(host.ok());
    return std::make_unique<Refresher>(std::move(host).value(), store, mono, threads.executor());
  }
  void Advance(Millis by) {
    mono.Advance(by);
    wall.Advance(by);
  }
};

bool Answered(const Refresher& refresher, std::size_t index) {
  return !refresher.Status()[index].call_running;
}

TEST(Refresher, the_calls_run_at_the_same_time_and_a_hung_one_blocks_nothing) {
  Rig rig;
  auto refresher = rig.Make("a", {Range(0, 9), Range(10, 19)});
  rig.store->Block(Range(0, 9));
  ASSERT_TRUE(refresher->Start());
  // Range 10-19 is answered while 0-9 hangs on its own thread. The hung
  // call's thread may reach the store after the other answered, so the test
  // waits for it there before it counts calls.
  ASSERT_TRUE(Eventually([&] { return Answered(*refresher, 1); }));
  ASSERT_TRUE(Eventually([&] { return rig.store->calls(Range(0, 9)) == 1; }))
      << "the call for 0-9 reached the store and hangs there";
  EXPECT_TRUE(refresher->EpochFor(15).has_value()) << "served before the refresh ends";
  EXPECT_FALSE(refresher->Tick().has_value()) << "the time limit has not passed";
  rig.Advance(kStep);
  const auto report = refresher->Tick();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->claimed.size(), 1u);
  EXPECT_EQ(report->failed,
            (std::vector{std::pair(Range(0, 9), std::string(kTimedOutText))}));
  // The hung call still runs: the next refresh sends no new call for it.
  ASSERT_TRUE(refresher->Start());
  ASSERT_TRUE(Eventually([&] { return !refresher->refresh_open(); }))
      << "the live range answered, so the refresh ended without waiting";
  EXPECT_EQ(refresher->last_report().renewed, std::vector{Range(10, 19)});
  EXPECT_EQ(refresher->last_report().failed[0].second, kStillRunningText);
  EXPECT_EQ(rig.store->calls(Range(0, 9)), 1);
  EXPECT_TRUE(refresher->Unsettled());
  // The store answers; the range claims on the next refresh.
  rig.store->Unblock();
  ASSERT_TRUE(Eventually([&] { return !refresher->Unsettled(); }));
  rig.Advance(kStep);
  ASSERT_TRUE(refresher->Start());
  ASSERT_TRUE(Eventually([&] { return !refresher->refresh_open(); }));
  EXPECT_EQ(refresher->last_report().claimed.size(), 1u);
  EXPECT_TRUE(refresher->EpochFor(3).has_value());
}

TEST(Refresher, a_refresh_ends_when_every_call_answered_and_tells_the_listener) {
  Rig rig;
  auto refresher = rig.Make("a", {Range(0, 9)});
  std::mutex mu;
  std::vector<RefreshReport> reports;
  refresher->SetReportListener([&](const RefreshReport& report) {
    std::lock_guard lock(mu);
    reports.push_back(report);
  });
  ASSERT_TRUE(refresher->Start());
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard lock(mu);
    return reports.size() == 1;
  }));
  EXPECT_EQ(reports[0].claimed.size(), 1u);
  EXPECT_FALSE(refresher->refresh_open());
}

TEST(Refresher, a_second_start_while_a_refresh_is_open_does_nothing) {
  Rig rig;
  auto refresher = rig.Make("a", {Range(0, 9)});
  rig.store->Block(Range(0, 9));
  ASSERT_TRUE(refresher->Start());
  EXPECT_FALSE(refresher->Start());
  rig.store->Unblock();
  rig.threads.Join();
  EXPECT_EQ(rig.store->calls(Range(0, 9)), 1);
}

TEST(Refresher, wakes_for_the_time_limit_then_the_next_refresh) {
  Rig rig;
  auto refresher = rig.Make("a", {Range(0, 9)});
  const MonoTime start = rig.mono.Now();
  rig.store->Block(Range(0, 9));
  refresher->Start();
  EXPECT_EQ(refresher->NextWake(), start + kStep);
  rig.store->Unblock();
  ASSERT_TRUE(Eventually([&] { return !refresher->refresh_open(); }));
  EXPECT_EQ(refresher->NextWake(), start + kStep);
}

TEST(Refresher, shutdown_releases_so_another_host_claims_at_once) {
  Rig rig;
  auto a = rig.Make("a", {Range(0, 9)});
  a->Start();
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  const ReleasePlan plan = a->StartRelease(/*all_shipped=*/true);
  EXPECT_EQ(plan.calls.size(), 1u);
  EXPECT_EQ(a->EpochFor(3), std::nullopt) << "stops serving at once";
  ASSERT_TRUE(Eventually([&] { return a->released() == 1; }));
  auto b = rig.Make("b", {Range(0, 9)});
  b->Start();
  ASSERT_TRUE(Eventually([&] { return !b->refresh_open(); }));
  EXPECT_EQ(b->last_report().claimed, (std::vector{std::pair(Range(0, 9), Epoch(2))}));
  EXPECT_FALSE(a->Start()) << "a stopped host never refreshes again";
}

TEST(Refresher, a_fence_drops_the_range_while_the_others_serve) {
  Rig rig;
  auto a = rig.Make("a", {Range(0, 9), Range(10, 19)});
  a->Start();
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  EXPECT_EQ(a->Lose(3, Epoch(40)), Range(0, 9));
  EXPECT_EQ(a->Serving().size(), 1u);
  rig.Advance(kStep);
  a->Start();
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  EXPECT_EQ(a->last_report().claimed, (std::vector{std::pair(Range(0, 9), Epoch(41))}));
}

TEST(Refresher, a_handoff_waits_for_a_hung_call_then_offers_the_range_and_the_target_claims_it) {
  Rig rig;
  auto a = rig.Make("a", {Range(0, 9)});
  auto b = rig.Make("b", {Range(0, 9)});
  ASSERT_TRUE(a->Start());
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  rig.store->Block(Range(0, 9));
  rig.Advance(kStep);
  ASSERT_TRUE(a->Start());  // its renew hangs
  ASSERT_TRUE(Eventually([&] { return rig.store->calls(Range(0, 9)) == 2; }));
  std::atomic<int> answers{0};
  auto done = [&](Result<bool> answer) {
    EXPECT_TRUE(answer.ok() && *answer);
    ++answers;
  };
  EXPECT_EQ(*a->StartHandoff(Range(0, 9), Owner("b"), done), Refresher::HandoffSend::kWait);
  rig.store->Unblock();
  ASSERT_TRUE(Eventually([&] { return !a->Unsettled(); }));
  EXPECT_EQ(*a->StartHandoff(Range(0, 9), Owner("b"), done), Refresher::HandoffSend::kSent);
  ASSERT_TRUE(Eventually([&] { return answers == 1; }));
  EXPECT_TRUE(a->parked(Range(0, 9)));
  EXPECT_FALSE(a->EpochFor(5).has_value());
  // b claims it at once, at a new epoch, long before a's lease would end.
  ASSERT_TRUE(b->Start());
  ASSERT_TRUE(Eventually([&] { return !b->refresh_open(); }));
  EXPECT_EQ(b->EpochFor(5), Epoch(2));
  EXPECT_TRUE(a->UnheldRanges() == std::vector{Range(0, 9)});
}

TEST(Refresher, a_round_its_time_limit_ends_with_no_call_run_counts_no_answer) {
  Rig rig;
  auto host = HostOwnership::Make(Owner("a"), {Range(0, 9)}, kTtl);
  ASSERT_TRUE(host.ok());
  std::vector<Refresher::Task> never_run;  // a wedged pool: tasks queue, none runs
  Refresher refresher(std::move(host).value(), rig.store, rig.mono,
                      [&](Refresher::Task task) { never_run.push_back(std::move(task)); });
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(refresher.Start());
    rig.Advance(kStep);
    refresher.Tick();
    // The first at its time limit; the later ones at once (the call still runs).
    ASSERT_FALSE(refresher.refresh_open()) << "round " << round << " ended";
  }
  EXPECT_EQ(refresher.answered(), 0u) << "rounds ended, yet no store call ran";
  for (auto& task : never_run) task();
  EXPECT_EQ(refresher.answered(), 1u) << "the one call sent (later rounds wait for it)";
}

TEST(Refresher, an_undo_while_the_offer_is_out_claims_nothing_until_the_offer_answers) {
  Rig rig;
  auto a = rig.Make("a", {Range(0, 9)});
  ASSERT_TRUE(a->Start());
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  ASSERT_EQ(a->EpochFor(5), Epoch(1));
  rig.store->BlockOffers();
  std::atomic<int> answers{0};
  ASSERT_EQ(*a->StartHandoff(Range(0, 9), Owner("b"), [&](Result<bool>) { ++answers; }),
            Refresher::HandoffSend::kSent);
  a->Unpark(Range(0, 9));  // drain --undo while the offer is in flight
  EXPECT_TRUE(a->parked(Range(0, 9)));
  rig.Advance(kStep);
  a->Start();
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  EXPECT_EQ(rig.store->calls(Range(0, 9)), 1) << "a claim went out before the offer answered";
  rig.store->Unblock();
  ASSERT_TRUE(Eventually([&] { return answers == 1; }));
  EXPECT_FALSE(a->parked(Range(0, 9)));
  // Its local lease is over; the claim goes the normal way: refused while
  // the range stands offered to b.
  rig.Advance(kStep);
  ASSERT_TRUE(a->Start());
  ASSERT_TRUE(Eventually([&] { return !a->refresh_open(); }));
  EXPECT_EQ(rig.store->calls(Range(0, 9)), 2);
  EXPECT_FALSE(a->EpochFor(5).has_value());
}

}  // namespace
}  // namespace fleetfs::lease
