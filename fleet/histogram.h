// Histogram: a distribution of durations for the Prometheus metrics (restore
// time, FUSE request latency, store and destination call latency), in fixed
// fixed buckets, roughly log-spaced (1, 2.5, 5 per decade), and +Inf. Two
// sets of bounds: kRequestBounds (10 µs .. 10 s) for FUSE requests, which
// are local and fast, and kCallBounds (10 µs .. 300 s) for calls to other
// services and restores, where a 45 s snapshot download is ordinary and must
// not read as "10 s" on a dashboard.
//
// The bounds are fixed per family so that one family's histograms aggregate
// over hosts (histogram_quantile needs the same `le` bounds), and so Observe
// is a search of a constant table and two atomic adds: it runs on every FUSE
// request, on several threads, and takes no lock.
//
// Thread-safety: Observe and Snapshot are safe from any thread. Observe adds
// to its bucket, then (release) to the sum; Snapshot reads the sum (acquire)
// before the buckets, so every observation in a snapshot's sum is in its
// count too: never a sum > 0 with a count of 0. The reverse can happen (an
// observation counted whose duration is not yet in the sum). A snapshot's
// count is the sum of its buckets, so count and the +Inf bucket agree.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>

namespace fleetfs {

// Upper bounds of the finite buckets of kRequestBounds, in nanoseconds:
// 10 µs .. 10 s.
inline constexpr std::array<std::int64_t, 19> kHistogramBoundsNs = {
    10'000,        25'000,        50'000,         100'000,       250'000,
    500'000,       1'000'000,     2'500'000,      5'000'000,     10'000'000,
    25'000'000,    50'000'000,    100'000'000,    250'000'000,   500'000'000,
    1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};
// kCallBounds: the same, then 30 s, 1, 2 and 5 minutes.
inline constexpr std::array<std::int64_t, 23> kCallHistogramBoundsNs = {
    10'000,         25'000,         50'000,          100'000,         250'000,
    500'000,        1'000'000,      2'500'000,       5'000'000,       10'000'000,
    25'000'000,     50'000'000,     100'000'000,     250'000'000,     500'000'000,
    1'000'000'000,  2'500'000'000,  5'000'000'000,   10'000'000'000,  30'000'000'000,
    60'000'000'000, 120'000'000'000, 300'000'000'000};
// The finite buckets of kRequestBounds and +Inf.
inline constexpr std::size_t kHistogramBuckets = kHistogramBoundsNs.size() + 1;
// The most buckets of any bounds: the size of a histogram's arrays.
inline constexpr std::size_t kHistogramMaxBuckets = kCallHistogramBoundsNs.size() + 1;

// One family's bucket bounds: the finite upper bounds in nanoseconds,
// ascending, and the same as `le` label text.
struct HistogramBounds {
  std::span<const std::int64_t> ns;
  std::span<const std::string_view> labels;

  // The finite buckets and +Inf.
  std::size_t buckets() const { return ns.size() + 1; }
  std::size_t inf() const { return ns.size(); }
};
extern const HistogramBounds kRequestBounds;  // 10 µs .. 10 s: FUSE requests
extern const HistogramBounds kCallBounds;     // 10 µs .. 300 s: store, replica calls, restores

// What a histogram held at one moment: a value, for the pure report code.
// Buckets past its bounds' +Inf stay 0.
struct HistogramSnapshot {
  std::array<std::uint64_t, kHistogramMaxBuckets> buckets{};  // per bucket, not cumulative
  std::uint64_t sum_ns = 0;

  std::uint64_t count() const;
  double sum_seconds() const { return static_cast<double>(sum_ns) / 1e9; }
};

class Histogram {
 public:
  Histogram() : Histogram(kRequestBounds) {}
  explicit Histogram(const HistogramBounds& bounds) : bounds_(&bounds) {}

  // A negative duration (a clock that went back) counts in the first bucket
  // and adds nothing to the sum.
  void Observe(std::chrono::nanoseconds d);
  HistogramSnapshot Snapshot() const;

 const HistogramBounds& bounds() const { return *bounds_; }

 private:
  const HistogramBounds* bounds_;
  std::array<std::atomic<std::uint64_t>, kHistogramMaxBuckets> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// A Histogram of kCallBounds, default-constructible for arrays of them.
class CallHistogram : public Histogram {
 public:
  CallHistogram() : Histogram(kCallBounds) {}
};

// The index of the bucket a duration of `ns` nanoseconds counts in: the first
// whose bound is >= ns (Prometheus buckets are "less than or equal"), else
// the +Inf bucket.
std::size_t HistogramBucketOf(const HistogramBounds& bounds, std::int64_t ns);
// The same in kRequestBounds.
inline std::size_t HistogramBucketOf(std::int64_t ns) { return HistogramBucketOf(kRequestBounds, ns); }

// Writes one histogram's samples in the Prometheus text format (0.0.4):
// NAME_bucket{LABELS,le="..."} cumulative counts, ending with le="+Inf",
// then NAME_sum and NAME_count, in the family's `bounds` (the caller's, so
// that every series of a family has the same `le` set even when one of them
// is a default snapshot). `labels` is empty or `key="value",...` without
// braces, already escaped. The family's HELP and TYPE lines are the caller's,
// once per family (WriteHistogramHeader).
void WriteHistogram(std::ostream& out, std::string_view name, std::string_view labels,
                    const HistogramSnapshot& h, const HistogramBounds& bounds = kRequestBounds);
// # HELP NAME TEXT and # TYPE NAME histogram.
void WriteHistogramHeader(std::ostream& out, std::string_view name, std::string_view help);

}  // namespace fleetfs
