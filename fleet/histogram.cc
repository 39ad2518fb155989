#include "fleet/histogram.h"

#include <algorithm>
#include <charconv>

namespace fleetfs {
namespace {

// The bounds in seconds as Prometheus' own clients print them (Go's
// FormatFloat 'g' -1), one string per bound of kHistogramBoundsNs.
constexpr std::array<std::string_view, kHistogramBoundsNs.size()> kBoundLabels = {
    "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001",
    "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1", "2.5", "5", "10"};

// The shortest text that reads back as the same double.
std::string_view FormatDouble(double v, std::array<char, 32>& buf) {
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  if (ec != std::errc()) return "NaN";
  return std::string_view(buf.data(), static_cast<std::size_t>(end - buf.data()));
}

}  // namespace

std::uint64_t HistogramSnapshot::count() const {
  std::uint64_t n = 0;
  for (std::uint64_t b : buckets) n += b;
  return n;
}

std::size_t HistogramBucketOf(std::int64_t ns) {
  return static_cast<std::size_t>(
      std::lower_bound(kHistogramBoundsNs.begin(), kHistogramBoundsNs.end(), ns) -
      kHistogramBoundsNs.begin());
}

void Histogram::Observe(std::chrono::nanoseconds d) {
  const std::int64_t ns = d.count();
  buckets_[HistogramBucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  if (ns > 0) sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  for (std::size_t i = 0; i < kHistogramBuckets; ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  return s;
}

void WriteHistogramHeader(std::ostream& out, std::string_view name, std::string_view help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
}

void WriteHistogram(std::ostream& out, std::string_view name, std::string_view labels,
                    const HistogramSnapshot& h) {
  const std::string_view sep = labels.empty() ? "" : ",";
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kHistogramBuckets; ++i) {
    cumulative += h.buckets[i];
    const std::string_view le = i < kBoundLabels.size() ? kBoundLabels[i] : "+Inf";
    out << name << "_bucket{" << labels << sep << "le=\"" << le << "\"} " << cumulative << '\n';
  }
  std::array<char, 32> buf;
  out << name << "_sum";
  if (!labels.empty()) out << '{' << labels << '}';
  out << ' ' << FormatDouble(h.sum_seconds(), buf) << '\n';
  out << name << "_count";
  if (!labels.empty()) out << '{' << labels << '}';
  out << ' ' << cumulative << '\n';
}

}  // namespace fleetfs
