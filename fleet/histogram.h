// Histogram: a distribution of durations for the Prometheus metrics (restore
// time, FUSE request latency, store and destination call latency), in fixed
// buckets of 10 µs to 10 s, roughly log-spaced (1, 2.5, 5 per decade), and
// +Inf.
//
// The buckets are fixed so that every histogram of the agent aggregates with
// every other (histogram_quantile over hosts needs the same `le` bounds), and
// so Observe is a search of a constant table and two relaxed atomic adds: it
// runs on every FUSE request, on several threads, and takes no lock.
//
// Thread-safety: Observe and Snapshot are safe from any thread. A snapshot
// taken while others observe may miss an observation's sum but not its
// bucket, or the reverse; its count is the sum of its buckets, so count and
// the +Inf bucket always agree.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace fleetfs {

// Upper bounds of the finite buckets, in nanoseconds: 10 µs .. 10 s.
inline constexpr std::array<std::int64_t, 19> kHistogramBoundsNs = {
    10'000,        25'000,        50'000,         100'000,       250'000,
    500'000,       1'000'000,     2'500'000,      5'000'000,     10'000'000,
    25'000'000,    50'000'000,    100'000'000,    250'000'000,   500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
// The finite buckets and +Inf.
inline constexpr std::size_t kHistogramBuckets = kHistogramBoundsNs.size() + 1;

// What a histogram held at one moment: a value, for the pure report code.
struct HistogramSnapshot {
  std::array<std::uint64_t, kHistogramBuckets> buckets{};  // per bucket, not cumulative
  std::uint64_t sum_ns = 0;

  std::uint64_t count() const;
  double sum_seconds() const { return static_cast<double>(sum_ns) / 1e9; }
};

class Histogram {
 public:
  // A negative duration (a clock that went back) counts in the first bucket
  // and adds nothing to the sum.
  void Observe(std::chrono::nanoseconds d);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<std::uint64_t>, kHistogramBuckets> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// The index of the bucket a duration of `ns` nanoseconds counts in: the first
// whose bound is >= ns (Prometheus buckets are "less than or equal"), else
// the +Inf bucket.
std::size_t HistogramBucketOf(std::int64_t ns);

// Writes one histogram's samples in the Prometheus text format (0.0.4):
// NAME_bucket{LABELS,le="..."} cumulative counts, ending with le="+Inf",
// then NAME_sum and NAME_count. `labels` is empty or `key="value",...`
// without braces, already escaped. The family's HELP and TYPE lines are the
// caller's, once per family (WriteHistogramHeader).
void WriteHistogram(std::ostream& out, std::string_view name, std::string_view labels,
                    const HistogramSnapshot& h);
// # HELP NAME TEXT and # TYPE NAME histogram.
void WriteHistogramHeader(std::ostream& out, std::string_view name, std::string_view help);

}  // namespace fleetfs
