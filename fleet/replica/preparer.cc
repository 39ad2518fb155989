#include "fleet/replica/preparer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>

namespace fleetfs::replica {
namespace {

PreparerOptions Bounded(PreparerOptions o) {
  o.threads = std::max(0, o.threads);
  o.warm_parallel = std::max(1, o.warm_parallel);
  o.max_lookup_flights = std::max<std::size_t>(1, o.max_lookup_flights);
  return o;
}

}  // namespace

Preparer::Preparer(PreparerOptions options)
    : o_(Bounded(std::move(options))), absent_(o_.absent_keys) {}

Preparer::~Preparer() { Stop(); }

void Preparer::Start() {
  std::lock_guard lock(mu_);
  if (stop_ || !pool_.empty()) return;
  for (int i = 0; i < o_.threads; ++i) pool_.emplace_back([this] { Loop(); });
}

void Preparer::Stop() {
  std::vector<std::thread> pool;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    pool.swap(pool_);
  }
  cv_.notify_all();
  for (auto& t : pool) t.join();
  std::vector<std::thread> warm;
  {
    std::lock_guard lock(warm_mu_);
    warm.swap(warm_threads_);
  }
  for (auto& t : warm) t.join();
  // Lookups still waiting get an error rather than no answer. (A flight
  // that RunOnce runs meanwhile answers its own.)
  std::vector<std::function<void(int)>> left;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, f] : flights_) {
      if (f->started) continue;
      if (!f->job.warm) --lookup_flights_;
      for (auto& w : f->waiters) left.push_back(std::move(w));
      f->waiters.clear();
    }
    flights_.clear();
    high_.clear();
    low_.clear();
  }
  for (auto& w : left) w(EIO);
}

void Preparer::Prepare(const FleetFile& main, std::uint64_t epoch, std::function<void(int)> done,
                       bool warm) {
  if (!warm && o_.missing_here && absent_.Contains(main.main_path, epoch)) {
    // Known absent at this epoch, and still not here (a local check on the
    // caller's thread): answered without a job, so repeated lookups of
    // absent names never queue ahead of a real first open. Only while the
    // epoch is served: the absence is true for that epoch only.
    if (o_.missing_here(main) && Served(PrepareJob{main, epoch, warm})) {
      if (done) done(0);
      return;
    }
  }
  std::unique_lock lock(mu_);
  if (stop_) {
    lock.unlock();
    if (done) done(EIO);
    return;
  }
  // A lookup that would add a flight beyond the bound is answered at once.
  auto refuse = [&] {
    const bool first = !refusing_;
    refusing_ = true;
    const std::size_t waiting = lookup_flights_;
    lock.unlock();
    ++refused_;
    if (first) {
      spdlog::warn(
          "replica: {} lookups wait for a prepare (the most at once); new ones are "
          "answered EAGAIN until some finish",
          waiting);
    }
    if (done) done(EAGAIN);
  };
  auto it = flights_.find({main.main_path, epoch});
  if (it != flights_.end()) {
    auto& f = it->second;
    if (!warm && f->job.warm && !f->started) {
      // A lookup waits now: it goes first, as a lookup's flight.
      if (lookup_flights_ >= o_.max_lookup_flights) return refuse();
      f->job.warm = false;
      ++lookup_flights_;
      high_.push_back(f);
      cv_.notify_one();
    }
    if (done) f->waiters.push_back(std::move(done));
    return;
  }
  if (!warm && lookup_flights_ >= o_.max_lookup_flights) return refuse();
  if (!warm) ++lookup_flights_;
  auto f = std::make_shared<Flight>();
  f->job = PrepareJob{main, epoch, warm};
  if (done) f->waiters.push_back(std::move(done));
  flights_.emplace(std::make_pair(main.main_path, epoch), f);
  (warm ? low_ : high_).push_back(f);
  cv_.notify_one();
}

bool Preparer::RunnableLocked() const {
  return !high_.empty() || (!low_.empty() && low_running_ < o_.warm_parallel);
}

std::shared_ptr<Preparer::Flight> Preparer::TakeLocked(bool* from_low) {
  while (RunnableLocked()) {
    std::shared_ptr<Flight> f;
    *from_low = high_.empty();
    auto& queue = *from_low ? low_ : high_;
    f = queue.front();
    queue.pop_front();
    // A warm flight a lookup joined sits in both queues: it runs once.
    if (f->started) continue;
    f->started = true;
    if (*from_low) ++low_running_;
    return f;
  }
  return nullptr;
}

void Preparer::Run(const std::shared_ptr<Flight>& f, bool from_low) {
  // f->job no longer changes: only a flight not yet started is promoted.
  const int err = Answer(f->job);
  std::unique_lock lock(mu_);
  if (from_low) --low_running_;
  if (!f->job.warm && --lookup_flights_ < o_.max_lookup_flights) refusing_ = false;
  auto it = flights_.find({f->job.main.main_path, f->job.epoch});
  if (it != flights_.end() && it->second == f) flights_.erase(it);
  auto waiters = std::move(f->waiters);
  lock.unlock();
  for (auto& w : waiters) w(err);
  cv_.notify_all();
}

void Preparer::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || RunnableLocked(); });
    if (stop_) return;
    bool from_low = false;
    std::shared_ptr<Flight> f = TakeLocked(&from_low);
    if (!f) continue;
    lock.unlock();
    Run(f, from_low);
    lock.lock();
  }
}

bool Preparer::RunOnce() {
  std::shared_ptr<Flight> f;
  bool from_low = false;
  {
    std::lock_guard lock(mu_);
    if (stop_) return false;
    f = TakeLocked(&from_low);
  }
  if (!f) return false;
  Run(f, from_low);
  return true;
}

bool Preparer::Served(const PrepareJob& job) const {
  return !o_.serving_epoch || o_.serving_epoch(job.main.slot) == job.epoch;
}

int Preparer::Answer(const PrepareJob& job) {
  if (job.warm && !o_.serving_epoch) return 0;
  if (job.warm && !Served(job)) {
    // A warm-up of an epoch no longer served does nothing (quietly: a whole
    // range's may end so); a lookup that joined it after it started is not
    // told its file is ready.
    return ENOENT;
  }
  int err = kRaced;
  for (int attempt = 0; attempt < kAttempts && err == kRaced; ++attempt) {
    err = o_.work(job);
  }
  if (err == kRaced) {
    spdlog::error("replica: {} kept appearing while it was restored; the lookup gets an error",
                  job.main.main_path);
    return EIO;
  }
  // Every answer 0 says "ready at this epoch", which is true only while the
  // epoch is served: a flight of an older epoch that outlived it (a lookup at
  // the new epoch is its own flight) answers an error instead.
  if (err == 0 && !Served(job)) {
    spdlog::warn(
        "replica: prepare of {} at epoch {} ended after the epoch stopped being served; "
        "the lookup gets an error",
        job.main.main_path, job.epoch);
    return ENOENT;  // as a restore that lapsed answers
  }
  return err;
}

void Preparer::Warm(Slot first, Slot last, std::uint64_t epoch) {
  std::lock_guard lock(warm_mu_);
  warm_threads_.emplace_back([this, first, last, epoch] {
    int queued = 0;
    for (int b = first / kSlotsPerBucket; b <= last / kSlotsPerBucket; ++b) {
      auto names = o_.destination->List(BucketName(b));
      if (!names.ok()) {
        spdlog::warn("replica: warm-up of {}-{}: {}", first, last, names.status().message());
        return;
      }
      for (const auto& n : *names) {
        auto file = ParseFleetName(o_.mode, b, n);
        if (!file || file->role != FileRole::kMain || file->slot < first || file->slot > last) {
          continue;
        }
        Prepare(*file, epoch, nullptr, /*warm=*/true);
        ++queued;
      }
    }
    if (queued > 0) {
      spdlog::info("replica: warming range {}-{} at epoch {}: {} tenants queued", first, last,
                   epoch, queued);
    }
    warm_queued_ += static_cast<std::uint64_t>(queued);
  });
}

}  // namespace fleetfs::replica
