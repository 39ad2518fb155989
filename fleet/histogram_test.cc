#include "fleet/histogram.h"

#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fleetfs {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

std::string Render(std::string_view labels, const HistogramSnapshot& h) {
  std::ostringstream out;
  WriteHistogram(out, "x_seconds", labels, h);
  return out.str();
}

TEST(Histogram, the_bounds_rise_from_10_microseconds_to_10_seconds) {
  EXPECT_EQ(kHistogramBoundsNs.front(), 10'000);
  EXPECT_EQ(kHistogramBoundsNs.back(), 10'000'000'000);
  for (std::size_t i = 1; i < kHistogramBoundsNs.size(); ++i) {
    EXPECT_LT(kHistogramBoundsNs[i - 1], kHistogramBoundsNs[i]);
    // Log-spaced: each bound 2 to 2.5 times the one before.
    EXPECT_LE(kHistogramBoundsNs[i], kHistogramBoundsNs[i - 1] * 5 / 2);
    EXPECT_GE(kHistogramBoundsNs[i], kHistogramBoundsNs[i - 1] * 2);
  }
}

TEST(Histogram, a_value_on_a_bound_counts_in_that_bound_s_bucket) {
  EXPECT_EQ(HistogramBucketOf(0), 0u);
  EXPECT_EQ(HistogramBucketOf(10'000), 0u);  // le="1e-05" is "<= 10 µs"
  EXPECT_EQ(HistogramBucketOf(10'001), 1u);
  EXPECT_EQ(HistogramBucketOf(25'000), 1u);
  EXPECT_EQ(HistogramBucketOf(1'000'000'000), 15u);
  EXPECT_EQ(HistogramBucketOf(10'000'000'000), 18u);
}

TEST(Histogram, a_value_above_10_seconds_counts_only_in_inf) {
  Histogram h;
  h.Observe(seconds(11));
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(HistogramBucketOf(10'000'000'001), kHistogramBuckets - 1);
  EXPECT_EQ(s.buckets[kRequestBounds.inf()], 1u);
  EXPECT_EQ(s.count(), 1u);
  std::string text = Render("", s);
  EXPECT_NE(text.find("x_seconds_bucket{le=\"10\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos) << text;
}

// A 45 s snapshot restore must not read as "10 s" (the top finite bound of
// FUSE requests) on a dashboard.
TEST(Histogram, call_bounds_count_a_45_second_restore_in_a_finite_bucket) {
  EXPECT_EQ(kCallBounds.ns.back(), 300'000'000'000);
  for (std::size_t i = 1; i < kCallBounds.ns.size(); ++i) {
    EXPECT_LT(kCallBounds.ns[i - 1], kCallBounds.ns[i]);
  }
  ASSERT_EQ(kCallBounds.labels.size(), kCallBounds.ns.size());
  CallHistogram h;
  h.Observe(seconds(45));
  HistogramSnapshot s = h.Snapshot();
  EXPECT_LT(HistogramBucketOf(kCallBounds, 45'000'000'000), kCallBounds.inf());
  EXPECT_EQ(s.buckets[kCallBounds.inf()], 0u);
  std::ostringstream out;
  WriteHistogram(out, "x_seconds", "", s, kCallBounds);
  const std::string text = out.str();
  EXPECT_NE(text.find("x_seconds_bucket{le=\"30\"} 0\n"
                      "x_seconds_bucket{le=\"60\"} 1\n"
                      "x_seconds_bucket{le=\"120\"} 1\n"
                      "x_seconds_bucket{le=\"300\"} 1\n"
                      "x_seconds_bucket{le=\"+Inf\"} 1\n"),
            std::string::npos)
      << text;
  // FUSE requests keep their 10 s top bound (and their series count).
  EXPECT_EQ(kRequestBounds.ns.back(), 10'000'000'000);
  EXPECT_EQ(kRequestBounds.buckets(), kHistogramBuckets);
}

TEST(Histogram, a_negative_duration_counts_in_the_first_bucket_and_adds_nothing) {
  Histogram h;
  h.Observe(nanoseconds(-5));
  EXPECT_EQ(h.Snapshot().buckets[0], 1u);
  EXPECT_EQ(h.Snapshot().sum_ns, 0u);
}

TEST(Histogram, sum_and_count_add_up_every_observation) {
  Histogram h;
  h.Observe(microseconds(5));
  h.Observe(milliseconds(3));
  h.Observe(seconds(2));
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count(), 3u);
  EXPECT_EQ(s.sum_ns, 2'003'005'000u);
  EXPECT_DOUBLE_EQ(s.sum_seconds(), 2.003005);
  EXPECT_EQ(s.buckets[0], 1u);
  EXPECT_EQ(s.buckets[HistogramBucketOf(3'000'000)], 1u);
  EXPECT_EQ(s.buckets[HistogramBucketOf(2'000'000'000)], 1u);
}

TEST(Histogram, observations_from_many_threads_are_all_counted) {
  Histogram h;
  constexpr int kThreads = 8;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kEach; ++i) h.Observe(microseconds(1 + (i + t) % 5000));
    });
  }
  // Snapshots taken meanwhile are always consistent in their own count.
  for (int i = 0; i < 100; ++i) {
    HistogramSnapshot s = h.Snapshot();
    EXPECT_LE(s.count(), static_cast<std::uint64_t>(kThreads) * kEach);
  }
  for (auto& th : threads) th.join();
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count(), static_cast<std::uint64_t>(kThreads) * kEach);
  std::uint64_t want_sum = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) want_sum += 1000u * static_cast<std::uint64_t>(1 + (i + t) % 5000);
  }
  EXPECT_EQ(s.sum_ns, want_sum);
}

// A scrape must never read a sum > 0 with a count of 0 (nor, generally, a
// sum holding observations its count lacks): with every observation the same
// duration, sum <= count * duration in every snapshot.
TEST(Histogram, a_snapshot_never_holds_more_in_its_sum_than_in_its_count) {
  Histogram h;
  constexpr std::uint64_t kD = 1'000'000;  // 1 ms, every observation
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) h.Observe(nanoseconds(kD));
    });
  }
  std::uint64_t bad = 0;
  std::uint64_t first_sum = 0, first_count = 0;
  for (int i = 0; i < 300000; ++i) {
    HistogramSnapshot s = h.Snapshot();
    if (s.sum_ns > s.count() * kD) {
      if (bad++ == 0) first_sum = s.sum_ns, first_count = s.count();
    }
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, 0u) << "first: sum_ns " << first_sum << " with count " << first_count;
}

TEST(Histogram, renders_cumulative_buckets_then_sum_and_count) {
  Histogram h;
  h.Observe(microseconds(7));    // le 1e-05
  h.Observe(microseconds(7));    // le 1e-05
  h.Observe(microseconds(300));  // le 0.0005
  h.Observe(milliseconds(1));    // le 0.001 (on the bound)
  std::string text = Render("op=\"read\"", h.Snapshot());
  const std::string want =
      "x_seconds_bucket{op=\"read\",le=\"1e-05\"} 2\n"
      "x_seconds_bucket{op=\"read\",le=\"2.5e-05\"} 2\n"
      "x_seconds_bucket{op=\"read\",le=\"5e-05\"} 2\n"
      "x_seconds_bucket{op=\"read\",le=\"0.0001\"} 2\n"
      "x_seconds_bucket{op=\"read\",le=\"0.00025\"} 2\n"
      "x_seconds_bucket{op=\"read\",le=\"0.0005\"} 3\n"
      "x_seconds_bucket{op=\"read\",le=\"0.001\"} 4\n";
  EXPECT_EQ(text.substr(0, want.size()), want);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"read\",le=\"10\"} 4\n"
                      "x_seconds_bucket{op=\"read\",le=\"+Inf\"} 4\n"
                      "x_seconds_sum{op=\"read\"} 0.001314\n"
                      "x_seconds_count{op=\"read\"} 4\n"),
            std::string::npos)
      << text;
  // One line per bucket, then sum and count.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            static_cast<std::ptrdiff_t>(kHistogramBuckets + 2));
}

TEST(Histogram, renders_without_braces_when_there_are_no_labels) {
  std::string text = Render("", HistogramSnapshot{});
  EXPECT_EQ(text.find("x_seconds_bucket{le=\"1e-05\"} 0\n"), 0u) << text;
  EXPECT_NE(text.find("\nx_seconds_sum 0\nx_seconds_count 0\n"), std::string::npos) << text;
}

TEST(Histogram, the_header_names_the_family_once_as_a_histogram) {
  std::ostringstream out;
  WriteHistogramHeader(out, "x_seconds", "What x took.");
  EXPECT_EQ(out.str(), "# HELP x_seconds What x took.\n# TYPE x_seconds histogram\n");
}

}  // namespace
}  // namespace fleetfs
