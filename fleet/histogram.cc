#include "fleet/histogram.h"

#include <algorithm>
#include <charconv>

namespace fleetfs {
namespace {

// The bounds in seconds as Prometheus' own clients print them (Go's
// FormatFloat 'g' -1), one string per bound of kCallHistogramBoundsNs, whose
// first bounds are kHistogramBoundsNs.
constexpr std::array<std::string_view, kCallHistogramBoundsNs.size()> kBoundLabels = {
    "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001",
    "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1", "2.5", "5", "10", "30", "60", "120", "300"};

// The shortest text that reads back as the same double.
std::string_view FormatDouble(double v, std::array<char, 32>& buf) {
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  if (ec != std::errc()) return "NaN";
  return std::string_view(buf.data(), static_cast<std::size_t>(end - buf.data()));
}

}  // namespace

constinit const HistogramBounds kRequestBounds{kHistogramBoundsNs,
                                               std::span(kBoundLabels).first(kHistogramBoundsNs.size())};
constinit const HistogramBounds kCallBounds{kCallHistogramBoundsNs, kBoundLabels};

std::uint64_t HistogramSnapshot::count() const {
  std::uint64_t n = 0;
  for (std::uint64_t b : buckets) n += b;
  return n;
}

std::size_t HistogramBucketOf(const HistogramBounds& bounds, std::int64_t ns) {
  return static_cast<std::size_t>(std::lower_bound(bounds.ns.begin(), bounds.ns.end(), ns) -
                                  bounds.ns.begin());
}

void Histogram::Observe(std::chrono::nanoseconds d) {
  const std::int64_t ns = d.count();
  buckets_[HistogramBucketOf(*bounds_, ns)].fetch_add(1, std::memory_order_relaxed);
  // Release: a Snapshot whose acquire load of the sum sees this addition
  // sees the bucket's too (the sum's later additions continue the release
  // sequence, so this holds whichever addition it reads).
  if (ns > 0) sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_release);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  // The sum first: the buckets read after it hold at least every
  // observation it holds.
  s.sum_ns = sum_ns_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < bounds_->buckets(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return s;
}

void WriteHistogramHeader(std::ostream& out, std::string_view name, std::string_view help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
}

void WriteHistogram(std::ostream& out, std::string_view name, std::string_view labels,
                    const HistogramSnapshot& h, const HistogramBounds& bounds) {
  const std::string_view sep = labels.empty() ? "" : ",";
  std::uint64_t cumulative = 0;
  // Buckets past these bounds (a snapshot of wider bounds) count in +Inf.
  for (std::size_t i = 0; i < bounds.buckets(); ++i) {
    cumulative += h.buckets[i];
    if (i == bounds.inf()) {
      for (std::size_t j = i + 1; j < h.buckets.size(); ++j) cumulative += h.buckets[j];
    }
    const std::string_view le = i < bounds.labels.size() ? bounds.labels[i] : "+Inf";
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
