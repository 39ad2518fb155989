// CountingDestination: a Destination that forwards every call to another and
// counts the requests by kind, so the agent can report requests to the
// destination (per tenant per hour is the fleet's cost on S3) and tests can
// assert how many a piece of work took. RequestCounter is the counting part
// alone, for destinations that count themselves (the in-memory fake).
//
// A call counts when it is made (a call still running counts), whatever its
// outcome; failed calls are also counted apart when they return. Each call is
// also timed, by kind, when it returns (failed or not), for the latency
// histograms of /metrics. Put and PutFile are both puts,
// Create and CreateFromFile both creates, List and ListFrom both lists (each is one request to S3).
//
// Thread-safety: safe from any thread; the counters are atomics, so a
// snapshot taken while calls run may mix counts of slightly different moments.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fleet/clock.h"
#include "fleet/histogram.h"
#include "fleet/replica/destination.h"

namespace fleetfs::replica {

enum class Request { kList, kPut, kCreate, kGet, kHead, kSize, kRemove, kProbe, kCleanTemps };
inline constexpr std::size_t kRequestKinds = 9;

// "list", "put", ...: for metrics labels and messages.
std::string_view RequestName(Request r);

struct RequestCounts {
  std::uint64_t lists = 0;
  std::uint64_t puts = 0;
  std::uint64_t creates = 0;
  std::uint64_t gets = 0;
  std::uint64_t heads = 0;
  std::uint64_t sizes = 0;
  std::uint64_t removes = 0;
  std::uint64_t probes = 0;
  std::uint64_t clean_temps = 0;
  std::uint64_t failures = 0;  // calls of any kind that returned an error

  std::uint64_t of(Request r) const;
  // Every request, failed or not.
  std::uint64_t total() const;
  bool operator==(const RequestCounts&) const = default;
};

class RequestCounter {
 public:
  void Count(Request r) { by_kind_[static_cast<std::size_t>(r)].fetch_add(1); }
  // Counts a failure when the call's outcome is an error; returns it.
  Status Outcome(Status st) {
    if (!st.ok()) failures_.fetch_add(1);
    return st;
  }
  template <typename T>
  Result<T> Outcome(Result<T> result) {
    if (!result.ok()) failures_.fetch_add(1);
    return result;
  }
  RequestCounts Snapshot() const;
  void Reset();

 private:
  std::array<std::atomic<std::uint64_t>, kRequestKinds> by_kind_{};
  std::atomic<std::uint64_t> failures_{0};
};

class CountingDestination final : public Destination {
 public:
  // `clock` times the calls; null: std::chrono::steady_clock. Must outlive
  // this.
  explicit CountingDestination(std::shared_ptr<Destination> inner,
                               const MonotonicClock* clock = nullptr);

  RequestCounts counts() const { return counter_.Snapshot(); }
  // How long the calls took, by kind (index: Request).
  std::array<HistogramSnapshot, kRequestKinds> latencies() const;
  void ResetCounts() { counter_.Reset(); }
  Destination& inner() { return *inner_; }

  const std::string& url() const override { return inner_->url(); }
  Result<std::vector<std::string>> List(std::string_view dir) override;
  Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after) override;
  Status Put(std::string_view path, std::string_view bytes) override;
  Status PutFile(std::string_view path, int fd) override;
  Status Create(std::string_view path, std::string_view bytes) override;
  Status CreateFromFile(std::string_view path, int fd) override;
  Status Get(std::string_view path, const Sink& sink) override;
  Result<std::string> GetHead(std::string_view path, std::size_t n) override;
  Result<std::uint64_t> Size(std::string_view path) override;
  Status Remove(std::string_view path) override;
  Status RemoveObject(std::string_view path) override;
  Status Probe() override;
  Result<int> CleanTemps(std::chrono::seconds max_age) override;

 private:
  // Counts `kind`, runs `call`, times it and counts its failure.
  template <typename Call>
  auto Timed(Request kind, Call&& call);
  MonoTime Now() const { return clock_ ? clock_->Now() : std::chrono::steady_clock::now(); }

  const std::shared_ptr<Destination> inner_;
  const MonotonicClock* const clock_;
  RequestCounter counter_;
  std::array<CallHistogram, kRequestKinds> latency_{};
};

}  // namespace fleetfs::replica
