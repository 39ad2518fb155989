// Preparer: when each main file is prepared before the mount exposes it
// (fleet/replicator.h, "Prepare"). The scheduling only; the work itself (the
// check against the key's log, a restore) is the caller's, passed in.
//
// - A flight is one (main path, epoch). Every lookup of it waits on that
//   flight and gets its one answer; the work runs once however many wait. A
//   lookup at another epoch never joins it (the older one may have lapsed
//   meanwhile): the two are flights of their own, each answered with its own
//   result.
// - Lookups' flights queue ahead of warm-ups', and at most `warm_parallel`
//   warm-ups run at once. A warm flight that a lookup joins before it starts
//   becomes a lookup's flight, at the back of the lookup queue.
// - At most `max_lookup_flights` lookups' flights at once (queued or
//   running): beyond it a lookup of another key is answered EAGAIN at once
//   (never 0, whose "absent" could make an application create an empty
//   database over a replica), counted, and logged once per episode.
// - A warm flight whose epoch is no longer served answers ENOENT without the
//   work; any flight's 0 ("ready at this epoch") is answered only while its
//   epoch is served.
// - A lookup of a key the cache knows absent at that epoch (AbsentKeys), and
//   still missing here, is answered 0 on the caller's thread, with no flight.
// - A warm-up lists a range's buckets at the destination on a thread of its
//   own and queues a warm flight for each main file of the range.
// - Stop answers every flight still waiting EIO.
//
// Thread-safety: every public method is safe from any thread. mu_ guards the
// flights and queues and is taken alone: never held across the work, a
// waiter's callback, a listing, a log line or the injected functions, so
// those may take any lock of their own. warm_mu_ guards the warm-up threads,
// also taken alone. The absent-keys cache has its own mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fleet/layout.h"
#include "fleet/replica/absent_keys.h"
#include "fleet/replica/destination.h"

namespace fleetfs::replica {

// What one flight prepares.
struct PrepareJob {
  FleetFile main;
  std::uint64_t epoch = 0;
  bool warm = false;  // a warm-up's flight that no lookup joined before it started
};

struct PreparerOptions {
  // Threads that run flights; 0: none, RunOnce runs them (tests).
  int threads = 4;
  int warm_parallel = 2;                  // at least 1
  std::size_t max_lookup_flights = 4096;  // at least 1
  std::size_t absent_keys = 65536;        // the cache's bound (at least 1)
  // Listed by warm-ups, whose names are parsed in `mode`.
  std::shared_ptr<Destination> destination;
  FleetMode mode = FleetMode::kTenant;
  // One attempt at preparing the job's file at its epoch: 0 when ready, an
  // errno, or Preparer::kRaced when a file appeared under a restore (the
  // attempt is made again, a few times). Runs on a pool thread, no lock held.
  std::function<int(const PrepareJob& job)> work;
  // As ReplicatorOptions::serving_epoch. Unset: every epoch is served, and
  // warm flights do nothing (answer 0).
  std::function<std::optional<std::uint64_t>(Slot)> serving_epoch;
  // True when `main` is not on the backing volume now (a local check, on the
  // lookup's thread): only then does the absent-keys cache answer. Unset:
  // the cache never answers a lookup without a flight.
  std::function<bool(const FleetFile& main)> missing_here;
};

class Preparer {
 public:
  // Never an answer: `work` found a file made under its restore.
  static constexpr int kRaced = -1;
  // Attempts of one flight while `work` answers kRaced; then EIO.
  static constexpr int kAttempts = 3;

  explicit Preparer(PreparerOptions options);
  ~Preparer();  // Stop()
  Preparer(const Preparer&) = delete;
  Preparer& operator=(const Preparer&) = delete;

  // Starts the pool's threads (none when options.threads is 0).
  void Start();
  // Ends the pool and the warm-ups (waiting for the flights running), then
  // answers every flight still queued EIO. Later prepares are answered EIO
  // at once. Idempotent.
  void Stop();

  // Prepares `main` at `epoch` and calls `done` (if set) once, with 0 or an
  // errno, on a pool thread or on the caller's. `warm`: a warm-up's, queued
  // behind every lookup's and never refused.
  void Prepare(const FleetFile& main, std::uint64_t epoch, std::function<void(int err)> done,
               bool warm);
  // Queues, in the background, a warm flight at `epoch` for every main file
  // of [first, last] the destination holds.
  void Warm(Slot first, Slot last, std::uint64_t epoch);
  // Runs the next flight a pool thread would take, on the calling thread,
  // and answers its waiters; false when none may run now.
  bool RunOnce();

  // Keys known absent from the replica: the work remembers them, whoever
  // makes a key forgets it.
  AbsentKeys& absent() { return absent_; }
  std::uint64_t prepares_refused() const { return refused_.load(); }
  std::uint64_t warm_queued() const { return warm_queued_.load(); }

 private:
  struct Flight {
    PrepareJob job;
    std::vector<std::function<void(int)>> waiters;
    bool started = false;
  };

  void Loop();
  // Takes the next runnable flight (marked started) and its queue; under mu_.
  std::shared_ptr<Flight> TakeLocked(bool* from_low);
  // Runs the flight's work and answers its waiters; takes mu_ itself.
  void Run(const std::shared_ptr<Flight>& f, bool from_low);
  // The flight's answer: the work, its retries, and the served checks.
  int Answer(const PrepareJob& job);
  bool Served(const PrepareJob& job) const;
  bool RunnableLocked() const;

  const PreparerOptions o_;
  AbsentKeys absent_;
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> warm_queued_{0};

  std::mutex mu_;  // guards everything below up to warm_mu_; taken alone
  std::condition_variable cv_;
  // Key: (main path, epoch).
  std::map<std::pair<std::string, std::uint64_t>, std::shared_ptr<Flight>> flights_;
  std::deque<std::shared_ptr<Flight>> high_, low_;  // lookups', warm-ups'
  // Lookups' flights, queued or running; at most o_.max_lookup_flights.
  std::size_t lookup_flights_ = 0;
  bool refusing_ = false;  // lookups are being refused (logged when it starts)
  int low_running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> pool_;

  std::mutex warm_mu_;  // guards warm_threads_; taken alone
  std::vector<std::thread> warm_threads_;
};

}  // namespace fleetfs::replica
