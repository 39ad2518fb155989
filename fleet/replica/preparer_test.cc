// The preparer's scheduling (fleet/replica/preparer.h): flights by key and
// epoch, lookups ahead of warm-ups, the bound on lookups, Stop, staleness and
// the absent-keys cache. The work is a fake that records what it was asked;
// most tests run flights with RunOnce on the test's thread, and those that
// use the pool wait on condition variables, never on time.
#include "fleet/replica/preparer.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fleet/replica/destination_fakes.h"
#include "fleet/replica/log_names.h"

namespace fleetfs::replica {
namespace {

FleetFile Main(std::string_view tenant) {
  return *ParseFleetPath(FleetMode::kTenant, TenantPath(tenant));
}

// What one Prepare was answered, if it was.
struct Answer {
  std::optional<int> err;
  std::function<void(int)> Done() {
    return [this](int e) {
      EXPECT_FALSE(err.has_value()) << "answered twice";
      err = e;
    };
  }
};

// Flights run by RunOnce, on the test's thread.
PreparerOptions Driven() {
  PreparerOptions o;
  o.threads = 0;
  return o;
}

// A preparer whose work records each job and answers what `results` says
// (0 by default), at the epoch `served`.
class Harness {
 public:
  explicit Harness(PreparerOptions o = Driven()) {
    o.work = [this](const PrepareJob& job) {
      std::unique_lock lock(mu_);
      jobs_.push_back(job);
      cv_.notify_all();
      if (gate_closed_.count(job.main.main_path) > 0) {
        cv_.wait(lock, [&] { return gate_closed_.count(job.main.main_path) == 0; });
      }
      if (job.main.main_path == remember_absent_)
        preparer->absent().Remember(job.main.main_path, job.epoch);
      auto it = results_.find({job.main.main_path, job.epoch});
      return it == results_.end() ? 0 : it->second;
    };
    o.serving_epoch = [this](Slot) -> std::optional<std::uint64_t> {
      std::lock_guard lock(mu_);
      return served_;
    };
    o.missing_here = [this](const FleetFile&) {
      std::lock_guard lock(mu_);
      return missing_;
    };
    preparer = std::make_unique<Preparer>(std::move(o));
  }

  void Serve(std::uint64_t epoch) {
    std::lock_guard lock(mu_);
    served_ = epoch;
  }
  void Result(const FleetFile& f, std::uint64_t epoch, int err) {
    std::lock_guard lock(mu_);
    results_[{f.main_path, epoch}] = err;
  }
  void Missing(bool missing) {
    std::lock_guard lock(mu_);
    missing_ = missing;
  }
  // The work remembers `f` absent at the job's epoch (as PrepareFile does).
  void AbsentInReplica(const FleetFile& f) {
    std::lock_guard lock(mu_);
    remember_absent_ = f.main_path;
  }
  // The work of `f` waits until Open(f).
  void Close(const FleetFile& f) {
    std::lock_guard lock(mu_);
    gate_closed_.insert(f.main_path);
  }
  void Open(const FleetFile& f) {
    std::lock_guard lock(mu_);
    gate_closed_.erase(f.main_path);
    cv_.notify_all();
  }
  void WaitForJobs(std::size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return jobs_.size() >= n; });
  }
  std::vector<PrepareJob> jobs() {
    std::lock_guard lock(mu_);
    return jobs_;
  }

  std::unique_ptr<Preparer> preparer;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::uint64_t> served_ = 1;
  bool missing_ = true;
  std::string remember_absent_;
  std::set<std::string> gate_closed_;
  std::map<std::pair<std::string, std::uint64_t>, int> results_;
  std::vector<PrepareJob> jobs_;
};

TEST(Preparer, a_lookup_at_a_newer_epoch_never_joins_a_flight_of_an_older_one) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.Serve(3);
  h.Result(a, 1, ESTALE);
  h.Result(a, 3, 0);
  Answer at1, at3;
  h.preparer->Prepare(a, 1, at1.Done(), /*warm=*/false);
  h.preparer->Prepare(a, 3, at3.Done(), /*warm=*/false);
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_FALSE(h.preparer->RunOnce());
  ASSERT_EQ(h.jobs().size(), 2u);
  EXPECT_EQ(h.jobs()[0].epoch, 1u);
  EXPECT_EQ(h.jobs()[1].epoch, 3u);
  EXPECT_EQ(at1.err, ESTALE);
  EXPECT_EQ(at3.err, 0);
}

TEST(Preparer, two_lookups_of_one_key_and_epoch_share_one_flight) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.Result(a, 1, EIO);
  Answer first, second;
  h.preparer->Prepare(a, 1, first.Done(), /*warm=*/false);
  h.preparer->Prepare(a, 1, second.Done(), /*warm=*/false);
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_FALSE(h.preparer->RunOnce());
  EXPECT_EQ(h.jobs().size(), 1u);
  EXPECT_EQ(first.err, EIO);
  EXPECT_EQ(second.err, EIO);
}

TEST(Preparer, a_lookup_queued_behind_warm_ups_runs_before_them) {
  PreparerOptions o = Driven();
  o.threads = 1;
  o.warm_parallel = 1;
  Harness h(o);
  const FleetFile busy = Main("busy"), b = Main("bravo"), c = Main("charlie"), a = Main("alpha");
  h.Close(busy);
  h.preparer->Start();
  h.preparer->Prepare(busy, 1, nullptr, /*warm=*/false);
  h.WaitForJobs(1);  // the only thread is taken: what follows queues
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0;
  auto done = [&](int) {
    std::lock_guard lock(mu);
    ++answered;
    cv.notify_all();
  };
  h.preparer->Prepare(b, 1, done, /*warm=*/true);
  h.preparer->Prepare(c, 1, done, /*warm=*/true);
  h.preparer->Prepare(a, 1, done, /*warm=*/false);
  h.Open(busy);
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return answered == 3; });
  }
  auto jobs = h.jobs();
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs[1].main, a);
  EXPECT_FALSE(jobs[1].warm);
  EXPECT_EQ(jobs[2].main, b);
  EXPECT_EQ(jobs[3].main, c);
  h.preparer->Stop();
}

TEST(Preparer, a_warm_flight_a_lookup_joins_before_it_starts_becomes_a_lookups_flight) {
  Harness h;
  const FleetFile a = Main("alpha"), b = Main("bravo");
  Answer warm, lookup;
  h.preparer->Prepare(b, 1, nullptr, /*warm=*/true);
  h.preparer->Prepare(a, 1, warm.Done(), /*warm=*/true);
  h.preparer->Prepare(a, 1, lookup.Done(), /*warm=*/false);
  EXPECT_TRUE(h.preparer->RunOnce());
  ASSERT_EQ(h.jobs().size(), 1u);
  EXPECT_EQ(h.jobs()[0].main, a);
  EXPECT_FALSE(h.jobs()[0].warm);
  EXPECT_EQ(lookup.err, 0);
  EXPECT_EQ(warm.err, 0);
  // It ran once: its copy in the warm-up queue is skipped.
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_FALSE(h.preparer->RunOnce());
  ASSERT_EQ(h.jobs().size(), 2u);
  EXPECT_EQ(h.jobs()[1].main, b);
}

TEST(Preparer, beyond_the_lookup_bound_a_new_lookup_is_answered_eagain_at_once) {
  PreparerOptions o = Driven();
  o.max_lookup_flights = 2;
  Harness h(o);
  const FleetFile a = Main("alpha"), b = Main("bravo"), c = Main("charlie"), d = Main("delta");
  Answer at_a, at_b, at_c, joined, warm;
  h.preparer->Prepare(a, 1, at_a.Done(), /*warm=*/false);
  h.preparer->Prepare(b, 1, at_b.Done(), /*warm=*/false);
  h.preparer->Prepare(c, 1, at_c.Done(), /*warm=*/false);
  EXPECT_EQ(at_c.err, EAGAIN);
  EXPECT_EQ(h.preparer->prepares_refused(), 1u);
  // Joining a flight, or a warm-up, adds no lookup's flight: never refused.
  h.preparer->Prepare(a, 1, joined.Done(), /*warm=*/false);
  h.preparer->Prepare(d, 1, warm.Done(), /*warm=*/true);
  EXPECT_FALSE(joined.err.has_value());
  EXPECT_FALSE(warm.err.has_value());
  EXPECT_EQ(h.preparer->prepares_refused(), 1u);
  // Once one ends, a lookup of another key queues again.
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(at_a.err, 0);
  Answer again;
  h.preparer->Prepare(c, 1, again.Done(), /*warm=*/false);
  EXPECT_FALSE(again.err.has_value());
  EXPECT_EQ(h.preparer->prepares_refused(), 1u);
}

TEST(Preparer, stop_answers_waiting_lookups_eio) {
  Harness h;
  const FleetFile a = Main("alpha"), b = Main("bravo");
  Answer at_a, at_b, after;
  h.preparer->Prepare(a, 1, at_a.Done(), /*warm=*/false);
  h.preparer->Prepare(b, 1, at_b.Done(), /*warm=*/true);
  h.preparer->Stop();
  EXPECT_EQ(at_a.err, EIO);
  EXPECT_EQ(at_b.err, EIO);
  EXPECT_TRUE(h.jobs().empty());
  h.preparer->Prepare(a, 1, after.Done(), /*warm=*/false);
  EXPECT_EQ(after.err, EIO);
}

TEST(Preparer, a_warm_flight_of_an_epoch_no_longer_served_answers_enoent_without_the_work) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.Serve(2);
  Answer warm;
  h.preparer->Prepare(a, 1, warm.Done(), /*warm=*/true);
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(warm.err, ENOENT);
  EXPECT_TRUE(h.jobs().empty());
}

TEST(Preparer, a_lookup_ready_only_after_its_epoch_ended_is_answered_enoent) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.Serve(1);
  Answer lookup;
  h.preparer->Prepare(a, 1, lookup.Done(), /*warm=*/false);
  h.Serve(2);  // the range moved on before the flight ran
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(h.jobs().size(), 1u);
  EXPECT_EQ(lookup.err, ENOENT);
}

TEST(Preparer, a_repeated_absent_lookup_is_answered_without_a_job_at_that_epoch_only) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.AbsentInReplica(a);
  h.Serve(4);
  Answer first, repeated, next_epoch;
  h.preparer->Prepare(a, 4, first.Done(), /*warm=*/false);
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(first.err, 0);
  h.preparer->Prepare(a, 4, repeated.Done(), /*warm=*/false);
  EXPECT_EQ(repeated.err, 0);  // on the caller's thread
  EXPECT_FALSE(h.preparer->RunOnce());
  EXPECT_EQ(h.jobs().size(), 1u);
  h.Serve(5);
  h.preparer->Prepare(a, 5, next_epoch.Done(), /*warm=*/false);
  EXPECT_FALSE(next_epoch.err.has_value());
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(h.jobs().size(), 2u);
  EXPECT_EQ(next_epoch.err, 0);
}

TEST(Preparer, a_cached_absence_does_not_answer_once_the_file_is_here) {
  Harness h;
  const FleetFile a = Main("alpha");
  h.preparer->absent().Remember(a.main_path, 1);
  h.Missing(false);
  Answer lookup;
  h.preparer->Prepare(a, 1, lookup.Done(), /*warm=*/false);
  EXPECT_FALSE(lookup.err.has_value());
  EXPECT_TRUE(h.preparer->RunOnce());
  EXPECT_EQ(h.jobs().size(), 1u);
}

TEST(Preparer, a_warm_up_queues_a_warm_flight_for_each_main_file_the_replica_holds) {
  auto dest = std::make_shared<MemoryDestination>();
  const FleetFile a = Main("alpha"), b = Main("bravo");
  ASSERT_TRUE(dest->Put(LogObjectPath(LogDir(a), 1), "x").ok());
  ASSERT_TRUE(dest->Put(LogObjectPath(LogDir(b), 1), "x").ok());
  PreparerOptions o = Driven();
  o.threads = 1;
  o.destination = dest;
  Harness h(o);
  h.preparer->Start();
  h.preparer->Warm(0, kLastSlot, 1);
  h.WaitForJobs(2);
  h.preparer->Stop();  // waits for the warm-up's thread
  EXPECT_EQ(h.preparer->warm_queued(), 2u);
  auto jobs = h.jobs();
  ASSERT_EQ(jobs.size(), 2u);
  for (const PrepareJob& j : jobs) {
    EXPECT_TRUE(j.warm);
    EXPECT_EQ(j.epoch, 1u);
    EXPECT_TRUE(j.main == a || j.main == b);
  }
  EXPECT_NE(jobs[0].main, jobs[1].main);
}

TEST(AbsentKeys, an_entry_answers_at_its_own_epoch_only) {
  AbsentKeys keys(4);
  keys.Remember("000/a.db", 1);
  EXPECT_FALSE(keys.Contains("000/a.db", 2));
  // Asked at another epoch, the entry is dropped.
  EXPECT_FALSE(keys.Contains("000/a.db", 1));
  keys.Remember("000/a.db", 1);
  keys.Forget("000/a.db");
  EXPECT_FALSE(keys.Contains("000/a.db", 1));
}

TEST(AbsentKeys, beyond_its_bound_the_least_recently_used_key_goes_first) {
  AbsentKeys keys(2);
  keys.Remember("000/a.db", 1);
  keys.Remember("000/b.db", 1);
  EXPECT_TRUE(keys.Contains("000/a.db", 1));  // a is used: b is the oldest
  keys.Remember("000/c.db", 1);
  EXPECT_FALSE(keys.Contains("000/b.db", 1));
  EXPECT_TRUE(keys.Contains("000/a.db", 1));
  EXPECT_TRUE(keys.Contains("000/c.db", 1));
}

}  // namespace
}  // namespace fleetfs::replica
