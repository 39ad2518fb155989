#include "fleet/replica/counting_destination.h"

namespace fleetfs::replica {

std::string_view RequestName(Request r) {
  switch (r) {
    case Request::kList:
      return "list";
    case Request::kPut:
      return "put";
    case Request::kCreate:
      return "create";
    case Request::kGet:
      return "get";
    case Request::kHead:
      return "head";
    case Request::kSize:
      return "size";
    case Request::kRemove:
      return "remove";
    case Request::kProbe:
      return "probe";
    case Request::kCleanTemps:
      return "clean_temps";
  }
  return "unknown";
}

std::uint64_t RequestCounts::of(Request r) const {
  switch (r) {
    case Request::kList:
      return lists;
    case Request::kPut:
      return puts;
    case Request::kCreate:
      return creates;
    case Request::kGet:
      return gets;
    case Request::kHead:
      return heads;
    case Request::kSize:
      return sizes;
    case Request::kRemove:
      return removes;
    case Request::kProbe:
      return probes;
    case Request::kCleanTemps:
      return clean_temps;
  }
  return 0;
}

std::uint64_t RequestCounts::total() const {
  return lists + puts + creates + gets + heads + sizes + removes + probes + clean_temps;
}

RequestCounts RequestCounter::Snapshot() const {
  auto at = [&](Request r) { return by_kind_[static_cast<std::size_t>(r)].load(); };
  RequestCounts c;
  c.lists = at(Request::kList);
  c.puts = at(Request::kPut);
  c.creates = at(Request::kCreate);
  c.gets = at(Request::kGet);
  c.heads = at(Request::kHead);
  c.sizes = at(Request::kSize);
  c.removes = at(Request::kRemove);
  c.probes = at(Request::kProbe);
  c.clean_temps = at(Request::kCleanTemps);
  c.failures = failures_.load();
  return c;
}

void RequestCounter::Reset() {
  for (auto& n : by_kind_) n.store(0);
  failures_.store(0);
}

CountingDestination::CountingDestination(std::shared_ptr<Destination> inner,
                                         const MonotonicClock* clock)
    : inner_(std::move(inner)), clock_(clock) {}

std::array<HistogramSnapshot, kRequestKinds> CountingDestination::latencies() const {
  std::array<HistogramSnapshot, kRequestKinds> out;
  for (std::size_t i = 0; i < kRequestKinds; ++i) out[i] = latency_[i].Snapshot();
  return out;
}

template <typename Call>
auto CountingDestination::Timed(Request kind, Call&& call) {
  counter_.Count(kind);
  const MonoTime started = Now();
  auto outcome = call();
  latency_[static_cast<std::size_t>(kind)].Observe(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Now() - started));
  return counter_.Outcome(std::move(outcome));
}

Result<std::vector<std::string>> CountingDestination::List(std::string_view dir) {
  return Timed(Request::kList, [&] { return inner_->List(dir); });
}
Result<std::vector<std::string>> CountingDestination::ListFrom(std::string_view dir,
                                                               std::string_view after) {
  return Timed(Request::kList, [&] { return inner_->ListFrom(dir, after); });
}
Status CountingDestination::Put(std::string_view path, std::string_view bytes) {
  return Timed(Request::kPut, [&] { return inner_->Put(path, bytes); });
}
Status CountingDestination::PutFile(std::string_view path, int fd) {
  return Timed(Request::kPut, [&] { return inner_->PutFile(path, fd); });
}
Status CountingDestination::Create(std::string_view path, std::string_view bytes) {
  return Timed(Request::kCreate, [&] { return inner_->Create(path, bytes); });
}
Status CountingDestination::CreateFromFile(std::string_view path, int fd) {
  return Timed(Request::kCreate, [&] { return inner_->CreateFromFile(path, fd); });
}
Status CountingDestination::Get(std::string_view path, const Sink& sink) {
  return Timed(Request::kGet, [&] { return inner_->Get(path, sink); });
}
Result<std::string> CountingDestination::GetHead(std::string_view path, std::size_t n) {
  return Timed(Request::kHead, [&] { return inner_->GetHead(path, n); });
}
Result<std::uint64_t> CountingDestination::Size(std::string_view path) {
  return Timed(Request::kSize, [&] { return inner_->Size(path); });
}
Status CountingDestination::Remove(std::string_view path) {
  return Timed(Request::kRemove, [&] { return inner_->Remove(path); });
}

Status CountingDestination::RemoveObject(std::string_view path) {
  return Timed(Request::kRemove, [&] { return inner_->RemoveObject(path); });
}
Status CountingDestination::Probe() {
  return Timed(Request::kProbe, [&] { return inner_->Probe(); });
}
Result<int> CountingDestination::CleanTemps(std::chrono::seconds max_age) {
  return Timed(Request::kCleanTemps, [&] { return inner_->CleanTemps(max_age); });
}

}  // namespace fleetfs::replica
