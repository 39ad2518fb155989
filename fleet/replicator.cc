#include "fleet/replicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <thread>
#include <unordered_map>

#include "fleet/replica/capture.h"
#include "fleet/replica_catalog.h"
#include "fleet/replica_object.h"
#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"
#include "fleet/wal_format.h"

namespace fleetfs::replica {
namespace {

constexpr std::string_view kMarkerDir = kUnshippedMarkerDir;
constexpr std::string_view kSpoolDir = ".fleetfs/spool";
// The one object of a takeover's empty generation (see MarkTakeover).
constexpr std::string_view kTakeoverMarkerName = "taken";
constexpr std::size_t kLagSamples = 4096;
// Internal to the prepare path (never an answer): a restore found the file
// made meanwhile, so the file there is checked again as any file found here.
constexpr int kRaced = -1;
// Attempts of one prepare when files keep appearing under its restores.
constexpr int kPrepareAttempts = 3;

// Keys the replica was found not to hold, each with the epoch it was listed
// at: a repeated lookup of an absent name needs no job and no listing. At one
// epoch only this host writes a key's replica, so an entry stays true for its
// epoch unless this host makes the key (a create through the mount forgets
// it); an entry of another epoch never answers. Bounded: the least recently
// used key goes first.
//
// Thread-safety: one mutex, held only while the map is read or changed.
class AbsentKeys {
 public:
  explicit AbsentKeys(std::size_t cap) : cap_(std::max<std::size_t>(1, cap)) {}

  bool Contains(const std::string& key, std::uint64_t epoch) {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    if (it->second.epoch != epoch) {
      order_.erase(it->second.at);
      map_.erase(it);
      return false;
    }
    order_.splice(order_.begin(), order_, it->second.at);
    return true;
  }

  void Remember(const std::string& key, std::uint64_t epoch) {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      it->second.epoch = epoch;
      order_.splice(order_.begin(), order_, it->second.at);
      return;
    }
    order_.push_front(key);
    map_.emplace(key, Entry{epoch, order_.begin()});
    if (map_.size() > cap_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }

  void Forget(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return;
    order_.erase(it->second.at);
    map_.erase(it);
  }

 private:
  struct Entry {
    std::uint64_t epoch = 0;
    std::list<std::string>::iterator at;
  };
  const std::size_t cap_;
  std::mutex mu_;  // guards the two below; taken alone
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, Entry> map_;
};

// The counters operators read, each on its own: Stats() reads them without
// a lock.
struct Counters {
  std::atomic<std::uint64_t> txns_shipped{0};
  std::atomic<std::uint64_t> bytes_shipped{0};
  std::atomic<std::uint64_t> snapshots{0};
  std::atomic<std::uint64_t> segments{0};
  std::atomic<std::uint64_t> upload_failures{0};
  std::atomic<std::uint64_t> restores{0};
  std::atomic<std::uint64_t> restore_failures{0};
  std::atomic<std::uint64_t> stale_replaced{0};
  std::atomic<std::uint64_t> tombstones{0};
  std::atomic<std::uint64_t> newer_epochs{0};
  std::atomic<std::uint64_t> warm_queued{0};
  std::atomic<std::uint64_t> capture_failures{0};
  std::atomic<std::uint64_t> absent_listed{0};
  std::atomic<std::uint64_t> prepares_refused{0};
};

}  // namespace

class Tenant;

class Replicator::Impl {
 public:
  explicit Impl(ReplicatorOptions options)
      : o_(std::move(options)), absent_(o_.absent_keys) {}
  ~Impl() { Stop(); }

  Status Start();
  void Stop();
  std::shared_ptr<TenantWatch> Watch(const FleetFile& file, std::uint64_t epoch);
  void Prepare(const FleetFile& main, std::uint64_t epoch, std::function<void(int)> done,
               bool warm);
  void Deleted(const FleetFile& main, std::uint64_t epoch);
  void Warm(Slot first, Slot last, std::uint64_t epoch);
  bool Flush(MonoTime deadline);
  double LagSeconds(Slot first, Slot last) const;
  ReplicationStats Stats() const;

  // Used by Tenant.
  int root() const { return root_.get(); }
  WallMs NowMs() const { return o_.wall->NowMs(); }
  const WallClock* wall() const { return o_.wall; }
  void CountCaptureFailure() { ++counters_.capture_failures; }

 private:
  struct Flight {
    FleetFile main;
    std::uint64_t epoch = 0;
    std::vector<std::function<void(int)>> waiters;
    bool started = false;
    bool warm = false;
  };
  struct Tombstone {
    FleetFile main;
    std::uint64_t epoch = 0;
    WallMs when = 0;
  };

  std::shared_ptr<Tenant> TenantFor(const FleetFile& main, bool create);
  void UploadLoop();
  void SyncAll();
  // One round of shipping; true when nothing is left unshipped.
  bool Round();
  // One round for one tenant; true when it has nothing left to ship.
  bool Sync(Tenant& t);
  Status UploadSegment(Tenant& t);
  Status StartGeneration(Tenant& t, const std::vector<GenerationId>& gens);
  Status PeriodicSnapshot(Tenant& t);
  void Prune(Tenant& t);  // retention, after a new snapshot
  Result<UniqueFd> TakeSnapshot(Tenant& t, std::vector<Txn>* before,
                                std::uint64_t* gap_mark = nullptr);
  void UploadTombstones();
  void PrepareLoop();
  // Prepares the flight's file; 0 only while its epoch is still served.
  int RunPrepare(const Flight& f);
  // One attempt of RunPrepare; kRaced when a file appeared under a restore.
  int PrepareFile(const Flight& f);
  int RestoreInPlace(const FleetFile& main, std::uint64_t epoch, bool replace);
  // Whether the local file carries the epoch stamp of `epoch` (or newer):
  // it was checked against the replica at that epoch, or made at it.
  bool CheckedAt(const FleetFile& main, std::uint64_t epoch) const;
  // Before a file is exposed at `epoch` that the replica holds under an
  // older one, an empty generation of `epoch` is put beside it: the replica
  // then tells any later owner that this epoch took the key, so an older
  // owner's unshipped copy is never taken for the newest state.
  Status MarkTakeover(const FleetFile& main, std::uint64_t epoch);
  // True while this host serves `main`'s slot at `epoch` (always, when the
  // agent wired no serving_epoch).
  bool StillServed(const FleetFile& main, std::uint64_t epoch) const;
  // Logs that `main`'s prepare at `epoch` ends unanswered because the epoch
  // is no longer served, and returns the errno the lookup gets.
  int NotServed(const FleetFile& main, std::uint64_t epoch, std::string_view what) const;
  void ResetTenant(const FleetFile& main);
  void RecordFailure(const Status& st);
  // OK when a snapshot of `t` may be staged on the backing volume now.
  Status CheckSpoolRoom(const Tenant& t);
  void RecordSuccess();
  void RecordLag(WallMs commit_ms, WallMs shipped_ms);

  ReplicatorOptions o_;
  UniqueFd root_;

  // Guards the three below. Held only while they are read or changed: never
  // across I/O or while taking a Tenant's lock, so Stats() may take it.
  mutable std::mutex tenants_mu_;
  std::unordered_map<std::string, std::shared_ptr<Tenant>> tenants_;  // key: main path
  std::unordered_map<std::string, std::uint64_t> deleted_;  // main path -> epoch of the delete
  std::vector<Tombstone> tombstones_;                       // not yet at the destination

  std::mutex upload_mu_;  // guards the wake flags; taken alone
  std::condition_variable upload_cv_;
  bool upload_stop_ = false;
  bool upload_wake_ = false;
  std::thread uploader_;

  std::mutex prep_mu_;  // guards the flights and queues; taken alone
  std::condition_variable prep_cv_;
  // Key: (main path, epoch). A prepare answers for its epoch only: one at a
  // newer epoch never joins a flight of an older one (which may have lapsed
  // meanwhile); the two may run at once, and only the one whose epoch is
  // served publishes or answers 0.
  std::map<std::pair<std::string, std::uint64_t>, std::shared_ptr<Flight>> flights_;
  std::deque<std::shared_ptr<Flight>> high_, low_;
  // Flights of lookups (not warm), queued or running; at most
  // o_.max_lookup_flights. `refusing_`: lookups are being refused (logged
  // once, when it starts).
  std::size_t lookup_flights_ = 0;
  bool refusing_ = false;
  int low_running_ = 0;
  bool prep_stop_ = false;
  std::vector<std::thread> preparers_;
  std::mutex warm_mu_;  // guards warm_threads_; taken alone
  std::vector<std::thread> warm_threads_;

  AbsentKeys absent_;
  Counters counters_;
  // Every RecordFailure; a round that sees it unchanged clears the failure.
  std::atomic<std::uint64_t> failures_seen_{0};
  // Guards failing_ and the lag ring; taken alone, held only to copy them
  // (never across I/O, logging included).
  mutable std::mutex stats_mu_;
  std::string failing_;  // the last upload error while uploads fail
  std::string staging_blocked_;  // why the last snapshot could not be staged
  std::vector<double> lags_;
  std::size_t lag_next_ = 0;
};

// ---- one tenant: its capture, and where its shipping stands ----

class Tenant final {
 public:
  Tenant(Replicator::Impl& r, FleetFile main)
      : capture_(std::make_shared<Capture>(
            CaptureOptions{r.root(), r.wall(), [&r] { r.CountCaptureFailure(); }},
            std::move(main))) {
    key_dir_ = KeyDir(capture_->main());
  }

  const FleetFile& main() const { return capture_->main(); }
  const std::string& key_dir() const { return key_dir_; }
  Capture& capture() { return *capture_; }

  // The tenant's TenantWatch (the mount's hooks) and its capture state.
  const std::shared_ptr<Capture> capture_;
  std::string key_dir_;
  std::mutex ship_mu_;  // serializes shipping; order: ship_mu_, the capture's locks, mu_

  std::mutex mu_;  // guards everything below; taken alone or before a capture's mu_
  std::uint64_t epoch_ = 0;
  std::optional<GenerationId> gen_;
  std::uint64_t next_seq_ = 0;
  WallMs last_snapshot_ms_ = 0;
  std::uint64_t commits_since_snapshot_ = 0;
  std::uint64_t stopped_below_ = 0;  // a newer epoch at the destination: ship nothing below it
  bool deleted_ = false;
};

// ---- start and stop ----

Status Replicator::Impl::Start() {
  o_.max_lookup_flights = std::max<std::size_t>(1, o_.max_lookup_flights);
  root_ = UniqueFd(::open(o_.backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_.valid()) return ErrnoStatus("opening the backing directory " + o_.backing, errno);
  ::mkdirat(root_.get(), ".fleetfs", 0700);
  for (std::string_view dir : {kMarkerDir, kSpoolDir}) {
    if (::mkdirat(root_.get(), std::string(dir).c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus("making " + o_.backing + "/" + std::string(dir), errno);
    }
  }
  if (Status probe = o_.destination->Probe(); !probe.ok()) {
    return probe.WithContext("the replica destination cannot be written");
  }
  // Tenants left with unshipped commits by an agent that ended.
  UniqueFd mfd(::openat(root_.get(), std::string(kMarkerDir).c_str(),
                        O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (DIR* d = mfd.valid() ? ::fdopendir(mfd.Release()) : nullptr) {
    int found = 0;
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n.size() < 5 || n[3] != '-') continue;
      auto bucket = ParseBucketName(n.substr(0, 3));
      auto file = bucket ? ParseFleetName(o_.mode, *bucket, n.substr(4)) : std::nullopt;
      if (!file || file->role != FileRole::kMain) continue;
      auto t = TenantFor(*file, true);
      t->capture().MarkUnshipped();
      ++found;
    }
    ::closedir(d);
    if (found > 0) {
      spdlog::info("replica: {} tenants have commits an earlier run did not ship; they ship in "
                   "new generations once their ranges are served", found);
    }
  }
  lags_.reserve(kLagSamples);
  // What writers that crashed left at the destination (their temporary
  // files), older than any write can take: on a thread of its own, since a
  // large replica takes a while to walk and shipping must not wait for it.
  // Detached, holding the destination: a walk of a large (or hung network)
  // replica must not hold up a stop.
  std::thread([dest = o_.destination] {
    auto removed = dest->CleanTemps(std::chrono::hours(1));
    if (!removed.ok()) {
      spdlog::warn("replica: cleaning up temporary files at {}: {}", dest->url(),
                   removed.status().message());
    } else if (*removed > 0) {
      spdlog::info("replica: removed {} temporary files that crashed writers left at {}",
                   *removed, dest->url());
    }
  }).detach();
  uploader_ = std::thread([this] { UploadLoop(); });
  for (int i = 0; i < std::max(1, o_.prepare_threads); ++i) {
    preparers_.emplace_back([this] { PrepareLoop(); });
  }
  return Status::Ok();
}

void Replicator::Impl::Stop() {
  {
    std::lock_guard lock(upload_mu_);
    upload_stop_ = true;
  }
  upload_cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
  {
    std::lock_guard lock(prep_mu_);
    prep_stop_ = true;
  }
  prep_cv_.notify_all();
  for (auto& t : preparers_) t.join();
  preparers_.clear();
  std::vector<std::thread> warm;
  {
    std::lock_guard lock(warm_mu_);
    warm.swap(warm_threads_);
  }
  for (auto& t : warm) t.join();
  // Lookups still waiting get an error rather than no answer.
  std::vector<std::shared_ptr<Flight>> left;
  {
    std::lock_guard lock(prep_mu_);
    for (auto& [k, f] : flights_) left.push_back(f);
    flights_.clear();
    lookup_flights_ = 0;
  }
  for (auto& f : left) {
    for (auto& w : f->waiters) w(EIO);
  }
}

// ---- the hooks ----

std::shared_ptr<Tenant> Replicator::Impl::TenantFor(const FleetFile& main, bool create) {
  {
    std::lock_guard lock(tenants_mu_);
    auto it = tenants_.find(main.main_path);
    if (it != tenants_.end()) return it->second;
    if (!create) return nullptr;
  }
  // Made outside the lock: it reads the disk, and tenants_mu_ is never held
  // across I/O. When two calls race, the first one in wins.
  auto made = std::make_shared<Tenant>(*this, main);
  std::lock_guard lock(tenants_mu_);
  return tenants_.emplace(main.main_path, std::move(made)).first->second;
}

std::shared_ptr<TenantWatch> Replicator::Impl::Watch(const FleetFile& file, std::uint64_t epoch) {
  if (file.role != FileRole::kMain && file.role != FileRole::kWal &&
      file.role != FileRole::kJournal) {
    return nullptr;
  }
  FleetFile main = file;
  main.role = FileRole::kMain;
  // Made (or opened) here: no longer absent.
  absent_.Forget(main.main_path);
  if (file.role == FileRole::kMain) {
    // The main file was opened or made again after a delete: the tenant
    // exists again, and its tombstone is superseded. (A sidecar opened by a
    // connection that outlived the delete does not bring it back.)
    std::lock_guard lock(tenants_mu_);
    if (deleted_.erase(main.main_path) > 0) {
      std::erase_if(tombstones_, [&](const Tombstone& t) { return t.main.main_path == main.main_path; });
    }
  }
  auto t = TenantFor(main, true);
  std::lock_guard lock(t->mu_);
  if (epoch > t->epoch_) t->epoch_ = epoch;
  return t->capture_;
}

void Replicator::Impl::Deleted(const FleetFile& main, std::uint64_t epoch) {
  std::shared_ptr<Tenant> t;
  {
    std::lock_guard lock(tenants_mu_);
    auto it = tenants_.find(main.main_path);
    if (it != tenants_.end()) {
      t = it->second;
      tenants_.erase(it);
    }
    deleted_[main.main_path] = epoch;
    tombstones_.push_back(Tombstone{main, epoch, NowMs()});
  }
  if (t) {
    {
      std::lock_guard lock(t->mu_);
      t->deleted_ = true;
    }
    t->capture().Drop();
  }
  {
    std::lock_guard lock(upload_mu_);
    upload_wake_ = true;
  }
  upload_cv_.notify_all();
}

// ---- shipping ----

void Replicator::Impl::UploadLoop() {
  // Fixed rate: a commit waits at most one interval (plus the round's own
  // time) however long the previous round took.
  std::unique_lock lock(upload_mu_);
  auto next = std::chrono::steady_clock::now() + o_.sync_interval;
  while (!upload_stop_) {
    upload_cv_.wait_until(lock, next, [&] { return upload_stop_ || upload_wake_; });
    if (upload_stop_) break;
    upload_wake_ = false;
    auto now = std::chrono::steady_clock::now();
    if (now >= next) next = std::max(next + o_.sync_interval, now);
    lock.unlock();
    SyncAll();
    lock.lock();
  }
}

void Replicator::Impl::SyncAll() { (void)Round(); }

bool Replicator::Impl::Round() {
  const std::uint64_t failures_before = failures_seen_.load();
  UploadTombstones();
  std::vector<std::shared_ptr<Tenant>> all;
  {
    std::lock_guard lock(tenants_mu_);
    for (auto& [k, t] : tenants_) all.push_back(t);
  }
  // Every tenant, served now or not: true means nothing captured is left
  // unshipped anywhere. A tenant whose range is not served at this moment
  // (a lapse, or a range lost) ships what its generation can still take;
  // what it cannot ship (a generation starts only while served) keeps the
  // round unclean. A tenant in journal mode OFF or MEMORY is not waited for:
  // it is not replicated at all (said loudly), and holding a stop for it
  // would only make every range on the host lapse instead of being released.
  bool clean = true;
  for (auto& t : all) {
    const bool shipped = Sync(*t);
    // Its commits from before the switch still count: they can ship.
    clean = (shipped || (t->capture().unshippable() && !t->capture().HasShippable())) && clean;
  }
  {
    std::lock_guard lock(tenants_mu_);
    clean = clean && tombstones_.empty();
  }
  // A failure is cleared by a round in which nothing that reached the
  // destination failed: not by another tenant's upload that landed (one
  // key's directory may fail every round while the others work), and never
  // by a probe (a full disk takes an empty probe file and refuses every real
  // object; clearing on the probe made /health flap every round).
  if (failures_seen_.load() == failures_before) RecordSuccess();
  return clean;
}

void Replicator::Impl::UploadTombstones() {
  std::vector<Tombstone> todo;
  {
    std::lock_guard lock(tenants_mu_);
    todo = tombstones_;
  }
  for (const Tombstone& tomb : todo) {
    std::string dir = KeyDir(tomb.main);
    auto gens = ListGenerations(*o_.destination, dir);
    Status st = gens.status();
    if (st.ok() && gens->empty()) {
      // Nothing was ever shipped: nothing to hide.
    } else if (st.ok()) {
      std::uint64_t index = 0;
      for (const auto& g : *gens) index = std::max(index, g.index);
      GenerationId gen{tomb.epoch, index + 1};
      if (gens->back().epoch > tomb.epoch) {
        gen = GenerationId{};  // a newer owner's generation: the delete is not ours to record
      } else {
        st = o_.destination->Put(ObjectPath(dir, gen, ObjectId{0, ObjectKind::kTombstone}),
                                 EncodeTombstone(tomb.when));
        if (st.ok()) {
          spdlog::info("replica: {} deleted at epoch {}: tombstone {}", tomb.main.main_path,
                       tomb.epoch, gen.Name());
          ++counters_.tombstones;
        }
      }
    }
    if (!st.ok()) {
      RecordFailure(st);
      continue;
    }
    std::lock_guard lock(tenants_mu_);
    std::erase_if(tombstones_, [&](const Tombstone& t) {
      return t.main.main_path == tomb.main.main_path && t.when == tomb.when;
    });
  }
}

bool Replicator::Impl::Sync(Tenant& t) {
  std::lock_guard ship(t.ship_mu_);
  bool has_captured = false, need_gen = false, periodic = false;
  std::uint64_t epoch = 0;
  const CaptureScan scan = t.capture().Scan();  // reads the WAL first
  bool gap = scan.gap;
  {
    std::lock_guard lock(t.mu_);
    if (t.deleted_) return true;
    if (auto serving = o_.serving_epoch ? o_.serving_epoch(t.main().slot) : std::nullopt;
        serving && *serving > t.epoch_) {
      t.epoch_ = *serving;
    }
    if (t.gen_ && t.gen_->epoch != t.epoch_ && !gap) {
      t.capture().MarkGap();
      gap = true;
    }
    epoch = t.epoch_;
    has_captured = scan.has_captured;
    need_gen = gap && scan.unshipped;
    periodic = t.gen_ && !gap && t.commits_since_snapshot_ > 0 &&
               NowMs() - t.last_snapshot_ms_ >= o_.snapshot_interval.count();
  }
  // Journal mode OFF or MEMORY: no snapshot of it ships (the capture logged
  // why; Stats counts it) until it commits with a journal or WAL again. The
  // commits captured before the switch still go, as a segment of the
  // generation they belong to: they are whole, and a crash must not lose them.
  if (scan.unshippable) {
    bool in_generation;
    {
      std::lock_guard lock(t.mu_);
      in_generation = t.gen_.has_value() && t.gen_->epoch == epoch;
    }
    if (!in_generation || !t.capture().HasShippable()) return false;
    need_gen = false;
    periodic = false;
    has_captured = true;
  }
  if (!has_captured && !need_gen && !periodic) return t.capture().SettleIdle(scan);
  {
    std::lock_guard lock(t.mu_);
    if (epoch == 0 || epoch < t.stopped_below_) return false;  // nothing we may ship under
  }
  const bool serving_now = o_.serving_epoch && o_.serving_epoch(t.main().slot) == epoch;
  if (need_gen && !serving_now) return false;  // a generation starts only while served
  if (need_gen && !CheckedAt(t.main(), epoch)) {
    // Nothing ships under an epoch before the file was checked against the
    // replica at it (a restart's stale copy would become the newest state):
    // the check is queued, and the generation starts after it.
    Prepare(t.main(), epoch, nullptr, /*warm=*/false);  // ahead of warm-ups: a stop waits for it
    return false;
  }
  auto gens = ListGenerations(*o_.destination, t.key_dir());
  if (!gens.ok()) {
    RecordFailure(gens.status());
    return false;
  }
  if (!gens->empty() && gens->back().epoch > epoch) {
    const std::uint64_t newer = gens->back().epoch;
    {
      std::lock_guard lock(t.mu_);
      t.stopped_below_ = newer + 1;
    }
    spdlog::error("replica: {} has epoch {} at {} (ours is {}): another host owns it now; stopping "
                  "its shipping and dropping its range",
                  t.main().main_path, newer, o_.destination->url(), epoch);
    ++counters_.newer_epochs;
    if (o_.on_newer_epoch) o_.on_newer_epoch(t.main().slot, newer);
    return false;
  }
  Status st;
  if (need_gen) {
    st = StartGeneration(t, *gens);
  } else if (periodic) {
    st = PeriodicSnapshot(t);
  } else {
    st = UploadSegment(t);
  }
  if (st.code() == Code::kFailedPrecondition) {
    spdlog::debug("replica: {}", st.message());  // not the destination's fault
    return false;
  }
  if (!st.ok()) {
    RecordFailure(st.WithContext("shipping " + t.main().main_path));
    return false;
  }
  if (scan.unshippable) return false;  // what came after the switch waits
  return t.capture().SettleShipped(scan);
}

Status Replicator::Impl::UploadSegment(Tenant& t) {
  GenerationId gen;
  std::uint64_t seq = 0;
  {
    std::lock_guard lock(t.mu_);
    if (!t.gen_) return Status::Ok();
    gen = *t.gen_;
    seq = t.next_seq_;
  }
  std::vector<Txn> txns = t.capture().Take();
  if (txns.empty()) return Status::Ok();
  std::string bytes = EncodeSegment(txns);
  Status st = o_.destination->Put(ObjectPath(t.key_dir(), gen, ObjectId{seq, ObjectKind::kSegment}),
                                  bytes);
  if (!st.ok()) {
    // Back in front, in order: the next round tries the same number again.
    t.capture().Return(std::move(txns));
    return st;
  }
  {
    std::lock_guard lock(t.mu_);
    t.next_seq_ = seq + 1;
    t.commits_since_snapshot_ += txns.size();
  }
  t.capture().Shipped();
  const WallMs now = NowMs();
  for (const Txn& x : txns) RecordLag(x.commit_ms, now);
  counters_.txns_shipped += txns.size();
  counters_.bytes_shipped += bytes.size();
  ++counters_.segments;
  return Status::Ok();
}

// A snapshot is staged on the backing volume before its upload. Were it
// staged whatever the room, each retry (every sync interval) would fill the
// volume, and the applications' own writes would fail with "database or disk
// is full". It waits instead while it would leave less than the reserve, and
// says so: not the destination's fault, and not a lag of 0.
Status Replicator::Impl::CheckSpoolRoom(const Tenant& t) {
  struct stat st;
  if (::fstatat(root_.get(), t.main().main_path.c_str(), &st, 0) != 0) return Status::Ok();
  std::optional<std::uint64_t> free_bytes;
  std::uint64_t volume_bytes = 0;
  if (o_.backing_free_bytes) {
    free_bytes = o_.backing_free_bytes();
  } else if (struct statvfs vfs; ::fstatvfs(root_.get(), &vfs) == 0) {
    free_bytes = std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
    volume_bytes = std::uint64_t{vfs.f_blocks} * vfs.f_frsize;
  }
  const std::uint64_t reserve =
      o_.spool_reserve_bytes != 0 ? o_.spool_reserve_bytes
                                  : std::clamp<std::uint64_t>(volume_bytes / 20, 4ull << 20, 1ull << 30);
  if (!free_bytes) return Status::Ok();
  // zstd never grows data by more than this (ZSTD_compressBound), plus the header.
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t need = size + size / 128 + 4096;
  std::string blocked;
  if (*free_bytes < need + reserve) {
    blocked = "staging a snapshot of " + t.main().main_path + " needs " + std::to_string(need) +
              " bytes on the backing volume, which has " + std::to_string(*free_bytes) +
              " free and keeps " + std::to_string(reserve) +
              " for the applications; it waits for room";
  }
  bool changed;
  {
    std::lock_guard lock(stats_mu_);
    changed = staging_blocked_ != blocked;
    staging_blocked_ = blocked;
  }
  if (blocked.empty()) return Status::Ok();
  if (changed) spdlog::warn("replica: {}", blocked);
  return Status(Code::kFailedPrecondition, blocked);
}

Result<UniqueFd> Replicator::Impl::TakeSnapshot(Tenant& t, std::vector<Txn>* before,
                                                std::uint64_t* gap_mark) {
  // Short: the shipping thread serves every tenant, and a hot journal left
  // by a writer that died stays hot until the next opener rolls it back.
  // Every write to the main file and its WAL waits from here until the copy is
  // done, so the copy is one consistent state.
  FLEETFS_RETURN_IF_ERROR(CheckSpoolRoom(t));
  auto held = t.capture().HoldForSnapshot(std::chrono::milliseconds(200));
  if (!held.ok()) return held.status();
  Capture::SnapshotHold hold = std::move(*held);
  if (gap_mark) *gap_mark = hold.gap_mark();
  {
    std::vector<Txn> taken = hold.TakeCaptured();
    if (before) *before = std::move(taken);
  }
  UniqueFd main(::openat(root_.get(), t.main().main_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!main.valid()) {
    Status st = ErrnoStatus("opening " + t.main().main_path + " for a snapshot", errno);
    return st;
  }
  struct stat st;
  ::fstat(main.get(), &st);
  std::uint64_t db_size = static_cast<std::uint64_t>(st.st_size);
  // The committed frames of the whole log, newest version of each page.
  std::map<std::uint32_t, std::string> overlay;
  std::uint32_t page = 0;
  UniqueFd walfd(::openat(root_.get(), (t.main().main_path + "-wal").c_str(), O_RDONLY | O_CLOEXEC));
  if (!walfd.valid() && errno != ENOENT) {
    // Without the log's commits the copy would not be the committed state.
    Status s = ErrnoStatus("opening the WAL of " + t.main().main_path + " for a snapshot", errno);
    hold.CaptureFailed();
    return s;
  }
  if (walfd.valid()) {
    wal::WalCursor fresh;
    auto read = wal::ReadCommitted(walfd.get(), fresh);
    if (!read.ok()) {
      Status s = read.status().WithContext("reading the WAL of " + t.main().main_path +
                                           " for a snapshot");
      hold.CaptureFailed();
      return s;
    }
    if (!read->txns.empty()) {
      for (auto& c : read->txns) {
        page = c.page_size;
        db_size = std::uint64_t{c.db_pages} * c.page_size;
        for (auto& [pgno, data] : c.pages) overlay[pgno] = std::move(data);
      }
    }
  }
  // An unnamed file in the spool directory: it goes away with its descriptor,
  // so a snapshot never stays on the volume after its upload (or a crash).
  UniqueFd out(::openat(root_.get(), std::string(kSpoolDir).c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC,
                        0600));
  if (!out.valid()) {
    Status s = ErrnoStatus("making a snapshot spool file in " + o_.backing + "/" +
                               std::string(kSpoolDir),
                           errno);
    return s;
  }
  SnapshotOwner owner{st.st_uid, st.st_gid, st.st_mode & 07777};
  Status written = WriteSnapshot(
      main.get(), db_size, NowMs(), owner,
      [&](std::uint64_t off, char* buf, std::size_t n) {
        if (overlay.empty() || page == 0) return;
        for (std::uint64_t p = off / page; p * page < off + n; ++p) {
          auto it = overlay.find(static_cast<std::uint32_t>(p + 1));
          if (it != overlay.end() && p * page >= off) {
            std::memcpy(buf + (p * page - off), it->second.data(),
                        std::min<std::size_t>(page, off + n - p * page));
          }
        }
      },
      out.get());
  // The hold ends as this returns: the upload happens after.
  if (!written.ok()) return written.WithContext("snapshot of " + t.main().main_path);
  return out;
}

Status Replicator::Impl::StartGeneration(Tenant& t, const std::vector<GenerationId>& gens) {
  {
    bool continues = false;
    {
      std::lock_guard lock(t.mu_);
      continues = t.gen_ && t.gen_->epoch == t.epoch_;
    }
    continues = continues && t.capture().HasShippable();
    // What the current generation can still take goes there first.
    if (continues) FLEETFS_RETURN_IF_ERROR(UploadSegment(t));
  }
  std::uint64_t gap_mark = 0;
  FLEETFS_ASSIGN_OR_RETURN(UniqueFd snap, TakeSnapshot(t, nullptr, &gap_mark));
  std::uint64_t epoch;
  {
    std::lock_guard lock(t.mu_);
    epoch = t.epoch_;
  }
  std::uint64_t index = 0;
  for (const auto& g : gens) index = std::max(index, g.index);
  GenerationId gen{epoch, index + 1};  // above every index, so no name is ever reused
  struct stat st;
  ::fstat(snap.get(), &st);
  Status put = o_.destination->PutFile(
      ObjectPath(t.key_dir(), gen, ObjectId{0, ObjectKind::kSnapshot}), snap.get());
  if (!put.ok()) return put;
  spdlog::info("replica: {} ships generation {} at epoch {} (snapshot, {} bytes)",
               t.main().main_path, gen.Name(), epoch, st.st_size);
  {
    std::lock_guard lock(t.mu_);
    t.gen_ = gen;
    t.next_seq_ = 1;
    t.last_snapshot_ms_ = NowMs();
    t.commits_since_snapshot_ = 0;
  }
  t.capture().ClearGap(gap_mark);
  ++counters_.snapshots;
  counters_.bytes_shipped += static_cast<std::uint64_t>(st.st_size);
  absent_.Forget(t.main().main_path);  // shipped: the replica holds it now
  Prune(t);
  return Status::Ok();
}

Status Replicator::Impl::PeriodicSnapshot(Tenant& t) {
  FLEETFS_RETURN_IF_ERROR(UploadSegment(t));
  std::vector<Txn> before;
  FLEETFS_ASSIGN_OR_RETURN(UniqueFd snap, TakeSnapshot(t, &before));
  GenerationId gen;
  std::uint64_t seq;
  {
    std::lock_guard lock(t.mu_);
    gen = *t.gen_;
    seq = t.next_seq_;
  }
  if (!before.empty()) {
    Status st = o_.destination->Put(ObjectPath(t.key_dir(), gen, ObjectId{seq, ObjectKind::kSegment}),
                                    EncodeSegment(before));
    if (!st.ok()) {
      // The snapshot covers these commits, but the generation's numbering
      // must stay whole: start a new generation instead.
      t.capture().MarkGap();
      return st;
    }
    ++seq;
  }
  Status st = o_.destination->PutFile(ObjectPath(t.key_dir(), gen, ObjectId{seq, ObjectKind::kSnapshot}),
                                      snap.get());
  std::lock_guard lock(t.mu_);
  if (!st.ok()) {
    t.next_seq_ = seq;
    return st;
  }
  t.next_seq_ = seq + 1;
  t.last_snapshot_ms_ = NowMs();
  t.commits_since_snapshot_ = 0;
  ++counters_.snapshots;
  Prune(t);
  return Status::Ok();
}

void Replicator::Impl::Prune(Tenant& t) {
  auto pruned = PruneGenerations(*o_.destination, t.key_dir(), NowMs() - o_.retention.count());
  if (!pruned.ok()) {
    spdlog::warn("replica: retention of {}: {}", t.main().main_path, pruned.status().message());
  } else if (*pruned > 0) {
    spdlog::info("replica: {}: removed {} objects or generations older than the retention",
                 t.main().main_path, *pruned);
  }
}

bool Replicator::Impl::Flush(MonoTime deadline) {
  while (true) {
    // A range that lapsed for a moment is not released, nor the agent ended,
    // with commits left: an unclean round keeps the flush going.
    if (Round()) return true;
    if (o_.mono->Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// ---- prepare: restore before exposure ----

void Replicator::Impl::Prepare(const FleetFile& main, std::uint64_t epoch,
                               std::function<void(int)> done, bool warm) {
  if (!warm && absent_.Contains(main.main_path, epoch)) {
    // Known absent at this epoch, and still not here (a local check on the
    // caller's thread): answered without a job, so repeated lookups of
    // absent names never queue ahead of a real first open. Only while the
    // epoch is served: the absence is true for that epoch only.
    struct stat st;
    if (::fstatat(root_.get(), main.main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
        errno == ENOENT && StillServed(main, epoch)) {
      if (done) done(0);
      return;
    }
  }
  std::unique_lock lock(prep_mu_);
  if (prep_stop_) {
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
    ++counters_.prepares_refused;
    if (first) {
      spdlog::warn("replica: {} lookups wait for a prepare (the most at once); new ones are "
                   "answered EAGAIN until some finish",
                   waiting);
    }
    if (done) done(EAGAIN);
  };
  auto it = flights_.find({main.main_path, epoch});
  if (it != flights_.end()) {
    auto& f = it->second;
    if (!warm && f->warm && !f->started) {
      // A lookup waits now: it goes first, as a lookup's flight.
      if (lookup_flights_ >= o_.max_lookup_flights) return refuse();
      f->warm = false;
      ++lookup_flights_;
      high_.push_back(f);
      prep_cv_.notify_one();
    }
    if (done) f->waiters.push_back(std::move(done));
    return;
  }
  if (!warm && lookup_flights_ >= o_.max_lookup_flights) return refuse();
  if (!warm) ++lookup_flights_;
  auto f = std::make_shared<Flight>();
  f->main = main;
  f->epoch = epoch;
  f->warm = warm;
  if (done) f->waiters.push_back(std::move(done));
  flights_.emplace(std::make_pair(main.main_path, epoch), f);
  (warm ? low_ : high_).push_back(f);
  prep_cv_.notify_one();
}

void Replicator::Impl::PrepareLoop() {
  std::unique_lock lock(prep_mu_);
  while (true) {
    prep_cv_.wait(lock, [&] {
      return prep_stop_ || !high_.empty() ||
             (!low_.empty() && low_running_ < std::max(1, o_.warm_parallel));
    });
    if (prep_stop_) return;
    std::shared_ptr<Flight> f;
    bool from_low = false;
    if (!high_.empty()) {
      f = high_.front();
      high_.pop_front();
    } else {
      f = low_.front();
      low_.pop_front();
      from_low = true;
    }
    if (f->started) continue;
    f->started = true;
    if (from_low) ++low_running_;
    lock.unlock();
    int err = RunPrepare(*f);
    lock.lock();
    if (from_low) --low_running_;
    if (!f->warm && --lookup_flights_ < o_.max_lookup_flights) refusing_ = false;
    auto it = flights_.find({f->main.main_path, f->epoch});
    if (it != flights_.end() && it->second == f) flights_.erase(it);
    auto waiters = std::move(f->waiters);
    lock.unlock();
    for (auto& w : waiters) w(err);
    lock.lock();
    prep_cv_.notify_all();
  }
}

int Replicator::Impl::RunPrepare(const Flight& f) {
  if (f.warm && !o_.serving_epoch) return 0;
  if (f.warm && o_.serving_epoch(f.main.slot) != f.epoch) {
    // A warm-up of an epoch no longer served does nothing (quietly: a whole
    // range's may end so); a lookup that joined it after it started is not
    // told its file is ready.
    return ENOENT;
  }
  int err = kRaced;
  for (int attempt = 0; attempt < kPrepareAttempts && err == kRaced; ++attempt) {
    err = PrepareFile(f);
  }
  if (err == kRaced) {
    spdlog::error("replica: {} kept appearing while it was restored; the lookup gets an error",
                  f.main.main_path);
    return EIO;
  }
  // Every answer 0 says "ready at this epoch", which is true only while the
  // epoch is served: a flight of an older epoch that outlived it (a lookup at
  // the new epoch is its own flight) answers an error instead.
  if (err == 0 && !StillServed(f.main, f.epoch)) return NotServed(f.main, f.epoch, "prepare");
  return err;
}

int Replicator::Impl::PrepareFile(const Flight& f) {
  const FleetFile& main = f.main;
  {
    std::lock_guard lock(tenants_mu_);
    if (deleted_.count(main.main_path) > 0) return 0;  // deleted here: not brought back
  }
  struct stat st;
  if (::fstatat(root_.get(), main.main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return errno;
    // Missing here. One listing says whether the replica holds anything;
    // nothing is made (no bucket, no file) unless it does.
    if (!f.warm && absent_.Contains(main.main_path, f.epoch)) return 0;
    ++counters_.absent_listed;
    auto gens = ListGenerations(*o_.destination, KeyDir(main));
    if (!gens.ok()) {
      spdlog::error("replica: cannot tell whether the replica holds {}: {}", main.main_path,
                    gens.status().message());
      ++counters_.restore_failures;
      return EIO;
    }
    if (gens->empty()) {
      // Remembered for an epoch still served only: an entry says nothing
      // about another epoch, and could push out one that does.
      if (!StillServed(main, f.epoch)) return NotServed(main, f.epoch, "absent key");
      absent_.Remember(main.main_path, f.epoch);
      return 0;
    }
    return RestoreInPlace(main, f.epoch, /*replace=*/false);
  }
  if (!S_ISREG(st.st_mode)) return 0;  // the mount hides it
  UniqueFd file(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!file.valid()) return errno;
  if (auto key = ReadKeyStamp(file.get()); key && *key != main.key) {
    spdlog::error("replica: {} says it belongs to '{}', not '{}'; refusing to expose it",
                  main.main_path, *key, main.key);
    return EIO;
  }
  const std::optional<std::uint64_t> stamped = ReadEpochStamp(file.get());
  std::uint64_t stamp = stamped.value_or(0);
  if (stamp >= f.epoch) return 0;  // RunPrepare answers 0 only while f.epoch is served
  auto newest = NewestEpoch(*o_.destination, KeyDir(main));
  if (!newest.ok()) {
    spdlog::error("replica: cannot tell whether {} is stale: {}", main.main_path,
                  newest.status().message());
    return EIO;
  }
  // Stamped 0 explicitly: a restore that published and then stopped (a
  // crash) before it cleared the stray sidecars and stamped its epoch. It is
  // restored again, sidecars and all, rather than exposed beside them.
  const bool unfinished = stamped && *stamped == 0 && *newest;
  // A newer epoch than the file's stamp took the key: another owner's, or
  // this epoch's own takeover marker or shipment (which were made for a file
  // checked at it; this one is not, so it is a stale copy that appeared).
  if (unfinished || (*newest && **newest > stamp)) {
    spdlog::warn("replica: {} on disk is stamped epoch {}, the replica holds epoch {} from another "
                 "owner; replacing it from the replica before exposing it at epoch {}",
                 main.main_path, stamp, **newest, f.epoch);
    int err = RestoreInPlace(main, f.epoch, /*replace=*/true);
    if (err == 0) ++counters_.stale_replaced;
    return err;
  }
  // The stamp is raised only while its epoch is served, and never lowered (a
  // flight of a newer epoch may have raised it meanwhile).
  if (!StillServed(main, f.epoch)) return NotServed(main, f.epoch, "epoch stamp");
  if (ReadEpochStamp(file.get()).value_or(0) >= f.epoch) return 0;
  if (Status marked = MarkTakeover(main, f.epoch); !marked.ok()) {
    spdlog::error("replica: marking {} taken at epoch {}: {}", main.main_path, f.epoch,
                  marked.message());
    return EIO;
  }
  if (Status stamped = WriteStamps(file.get(), f.epoch, main.key, main.main_path); !stamped.ok()) {
    // Exposed unstamped, the file would be taken for a stale copy by the
    // next check (our own marker is newer than its stamp) and replaced.
    spdlog::error("replica: {}", stamped.message());
    return EIO;
  }
  return 0;
}

bool Replicator::Impl::StillServed(const FleetFile& main, std::uint64_t epoch) const {
  return !o_.serving_epoch || o_.serving_epoch(main.slot) == epoch;
}

int Replicator::Impl::NotServed(const FleetFile& main, std::uint64_t epoch,
                                std::string_view what) const {
  spdlog::warn("replica: {} of {} at epoch {} ended after the epoch stopped being served; the "
               "lookup gets an error",
               what, main.main_path, epoch);
  return ENOENT;  // as a restore that lapsed answers
}

bool Replicator::Impl::CheckedAt(const FleetFile& main, std::uint64_t epoch) const {
  UniqueFd fd(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return true;  // gone: nothing of it can ship anyway
  struct stat st;
  // Not a regular file: the mount never exposes it, and a snapshot of it fails.
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return true;
  return ReadEpochStamp(fd.get()).value_or(0) >= epoch;
}

Status Replicator::Impl::MarkTakeover(const FleetFile& main, std::uint64_t epoch) {
  FLEETFS_ASSIGN_OR_RETURN(std::vector<GenerationId> gens, ListGenerations(*o_.destination, KeyDir(main)));
  if (gens.empty() || gens.back().epoch >= epoch) return Status::Ok();
  std::uint64_t index = 0;
  for (const auto& g : gens) index = std::max(index, g.index);
  const GenerationId marker{epoch, index + 1};
  // A name no object parser reads: restores skip the generation (it holds
  // no object), listings count its epoch.
  FLEETFS_RETURN_IF_ERROR(o_.destination->Put(
      GenerationDir(KeyDir(main), marker) + "/" + std::string(kTakeoverMarkerName),
      "taken at epoch " + std::to_string(epoch) + "\n"));
  spdlog::info("replica: {} taken at epoch {} (generation {} marks it)", main.main_path, epoch,
               marker.Name());
  // The marker it supersedes says nothing more: removed, so an idle key
  // keeps one marker however many takeovers it sees.
  auto previous = DescribeGeneration(*o_.destination, KeyDir(main), gens.back());
  if (previous.ok() && previous->objects.empty()) {
    (void)o_.destination->Remove(GenerationDir(KeyDir(main), gens.back()));
  }
  return Status::Ok();
}

// The restore is built in an unnamed file in the spool directory, so nothing
// is made in the bucket unless there is something to publish, and nothing is
// left behind by a crash. It is published with a hard link (never over an
// existing file), after a last check, immediately before, that its epoch is
// still served: a restore may wait (for the download, for the tenant's
// upload in ResetTenant) past the local lease end.
int Replicator::Impl::RestoreInPlace(const FleetFile& main, std::uint64_t epoch, bool replace) {
  const int bucket = main.slot / kSlotsPerBucket;
  const auto started = o_.mono->Now();
  UniqueFd fd(::openat(root_.get(), std::string(kSpoolDir).c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC,
                       0600));
  if (!fd.valid()) {
    spdlog::error("replica: cannot make a restore file in {}/{}: {}", o_.backing,
                  std::string(kSpoolDir), std::strerror(errno));
    return EIO;
  }
  // The marker goes first: an older owner still shipping sees it at its next
  // upload and stops, so what it ships cannot land under the download.
  if (!StillServed(main, epoch)) return NotServed(main, epoch, "restore");
  if (Status marked = MarkTakeover(main, epoch); !marked.ok()) {
    spdlog::error("replica: marking {} taken at epoch {}: {}", main.main_path, epoch,
                  marked.message());
    return EIO;
  }
  auto outcome = RestoreTo(*o_.destination, KeyDir(main), std::nullopt, fd.get());
  if (!outcome.ok()) {
    spdlog::error("replica: restoring {}: {}", main.main_path, outcome.status().message());
    ++counters_.restore_failures;
    return EIO;
  }
  auto remove_set = [&](bool with_main) {
    for (std::string_view suffix : kSidecarSuffixes) {
      ::unlinkat(root_.get(), (main.main_path + std::string(suffix)).c_str(), 0);
    }
    if (with_main) ::unlinkat(root_.get(), main.main_path.c_str(), 0);
  };
  // Whether the name still holds the file this restore published: a flight
  // of another epoch may have replaced it since, and its sidecars are live.
  auto still_ours = [&] {
    struct stat ours, named;
    return ::fstat(fd.get(), &ours) == 0 &&
           ::fstatat(root_.get(), main.main_path.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
           ours.st_dev == named.st_dev && ours.st_ino == named.st_ino;
  };
  auto lapsed = [&] {
    // The range lapsed (or moved to a new epoch) meanwhile: nothing is
    // written for an epoch no longer served.
    spdlog::warn("replica: {} restored, but epoch {} is no longer served; not published",
                 main.main_path, epoch);
    return ENOENT;
  };
  if (outcome->result != RestoreResult::kRestored) {
    if (!StillServed(main, epoch)) return lapsed();
    if (!replace) {
      absent_.Remember(main.main_path, epoch);  // nothing to restore at this epoch
    } else if (outcome->result == RestoreResult::kDeleted) {
      ResetTenant(main);
      if (!StillServed(main, epoch)) return lapsed();
      spdlog::warn("replica: {} was deleted by epoch {}; removing the stale local copy",
                   main.main_path, outcome->generation.epoch);
      remove_set(true);
    }
    return 0;
  }
  // Stamped epoch 0 until it is published and its stray sidecars are gone:
  // a lookup that finds it before then is prepared, and so waits for this
  // restore's flight to end, instead of being exposed at once.
  if (!WriteStamps(fd.get(), 0, main.key, main.main_path).ok() ||
      ::fchown(fd.get(), outcome->owner.uid, outcome->owner.gid) != 0 ||
      ::fchmod(fd.get(), outcome->owner.mode != 0 ? outcome->owner.mode : 0644) != 0 ||
      ::fsync(fd.get()) != 0) {
    spdlog::error("replica: preparing the restored {}: {}", main.main_path, std::strerror(errno));
    return EIO;
  }
  if (!StillServed(main, epoch)) return lapsed();  // no need to wait for the tenant
  // The stale file's captured state must not ship; a missing file's is reset
  // only once the link wins (a file created meanwhile keeps its own).
  if (replace) ResetTenant(main);  // may wait for an upload of the tenant in progress
  auto dir = OpenOrMakeBucket(root_.get(), bucket);
  if (!dir.ok()) {
    spdlog::error("replica: restoring {}: {}", main.main_path, dir.status().message());
    return EIO;
  }
  // The last check, immediately before anything is changed in the bucket.
  if (!StillServed(main, epoch)) return lapsed();
  // A stale file goes with its sidecars, which would replay onto the restore.
  if (replace) remove_set(true);
  const std::string proc = "/proc/self/fd/" + std::to_string(fd.get());
  const std::string name = main.main_path.substr(4);
  if (::linkat(AT_FDCWD, proc.c_str(), dir->get(), name.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    int err = errno;
    // Made meanwhile (a create, or the restore of another epoch's flight):
    // that file wins, with its sidecars untouched (its WAL may hold commits),
    // and is checked as any file found here.
    if (err == EEXIST) return kRaced;
    spdlog::error("replica: publishing the restored {}: {}", main.main_path, std::strerror(err));
    return EIO;
  }
  // Published: sidecars found now belong to no file (the main file did not
  // exist a moment ago) and would replay onto the restore. Nobody opens the
  // file before they go: a lookup of it finds epoch 0 and joins this flight.
  if (!replace) {
    ResetTenant(main);  // what an earlier file at this name left: the replica holds the truth
    if (still_ours()) remove_set(false);
  }
  if (!WriteStamps(fd.get(), epoch, main.key, main.main_path).ok() || ::fsync(fd.get()) != 0) {
    spdlog::error("replica: stamping the restored {}: {}", main.main_path, std::strerror(errno));
    return EIO;  // left stamped 0: the next lookup prepares it again
  }
  ::fsync(dir->get());
  if (!StillServed(main, epoch)) {
    // The lease ended during the link: the file stays (the mount hides an
    // unserved slot), but the lookup waiting for it is not told it is there.
    spdlog::warn("replica: {} was published as epoch {} stopped being served; the lookup gets "
                 "an error",
                 main.main_path, epoch);
    return ENOENT;
  }
  auto ms = std::chrono::duration_cast<Millis>(o_.mono->Now() - started).count();
  spdlog::info("replica: restored {} from generation {} ({} commits after its snapshot, {} bytes) "
               "in {} ms",
               main.main_path, outcome->generation.Name(), outcome->commits, outcome->bytes, ms);
  ++counters_.restores;
  return 0;
}

void Replicator::Impl::ResetTenant(const FleetFile& main) {
  auto t = TenantFor(main, false);
  if (!t) return;
  std::lock_guard ship(t->ship_mu_);
  t->capture().Reset();
  std::lock_guard lock(t->mu_);
  t->gen_.reset();
}

void Replicator::Impl::Warm(Slot first, Slot last, std::uint64_t epoch) {
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
    counters_.warm_queued += static_cast<std::uint64_t>(queued);
  });
}

// ---- what operators see ----

void Replicator::Impl::RecordFailure(const Status& st) {
  ++counters_.upload_failures;
  ++failures_seen_;
  bool changed;
  {
    std::lock_guard lock(stats_mu_);
    changed = failing_ != st.message();
    failing_ = st.message();
  }
  if (changed) spdlog::warn("replica: {}", st.message());  // outside the lock: logging is I/O
}

void Replicator::Impl::RecordSuccess() {
  bool was_failing;
  {
    std::lock_guard lock(stats_mu_);
    was_failing = !failing_.empty();
    failing_.clear();
  }
  if (was_failing) spdlog::info("replica: the destination takes uploads again");
}

void Replicator::Impl::RecordLag(WallMs commit_ms, WallMs shipped_ms) {
  double lag = std::max<WallMs>(0, shipped_ms - commit_ms) / 1000.0;
  std::lock_guard lock(stats_mu_);
  if (lags_.size() < kLagSamples) {
    lags_.push_back(lag);
  } else {
    lags_[lag_next_] = lag;
    lag_next_ = (lag_next_ + 1) % kLagSamples;
  }
}

// Called from the agent's loop: reads what each tenant published, and takes
// tenants_mu_ only (never held across I/O), never a Tenant's lock.
double Replicator::Impl::LagSeconds(Slot first, Slot last) const {
  WallMs oldest = 0;
  {
    std::lock_guard lock(tenants_mu_);
    for (auto& [k, t] : tenants_) {
      if (t->main().slot < first || t->main().slot > last) continue;
      const WallMs o = t->capture().oldest_pending_ms();
      if (o != 0 && (oldest == 0 || o < oldest)) oldest = o;
    }
  }
  return oldest == 0 ? 0.0 : std::max<WallMs>(0, NowMs() - oldest) / 1000.0;
}

ReplicationStats Replicator::Impl::Stats() const {
  ReplicationStats s;
  s.txns_shipped = counters_.txns_shipped.load();
  s.bytes_shipped = counters_.bytes_shipped.load();
  s.snapshots = counters_.snapshots.load();
  s.segments = counters_.segments.load();
  s.upload_failures = counters_.upload_failures.load();
  s.restores = counters_.restores.load();
  s.restore_failures = counters_.restore_failures.load();
  s.stale_replaced = counters_.stale_replaced.load();
  s.tombstones = counters_.tombstones.load();
  s.newer_epochs = counters_.newer_epochs.load();
  s.warm_queued = counters_.warm_queued.load();
  s.capture_failures = counters_.capture_failures.load();
  s.absent_listed = counters_.absent_listed.load();
  s.prepares_refused = counters_.prepares_refused.load();
  std::vector<double> lags;
  {
    std::lock_guard lock(stats_mu_);
    s.failing = failing_;
    s.staging_blocked = staging_blocked_;
    lags = lags_;
  }
  if (!lags.empty()) {
    std::sort(lags.begin(), lags.end());
    s.lag_p50_s = lags[lags.size() / 2];
    s.lag_p99_s = lags[std::min(lags.size() - 1, lags.size() * 99 / 100)];
  }
  std::lock_guard lock(tenants_mu_);
  s.tenants = tenants_.size();
  for (auto& [k, t] : tenants_) {
    if (t->capture().unshipped()) ++s.unshipped_tenants;
    if (t->capture().unshippable()) {
      if (s.unshippable_tenants++ == 0) s.unshippable_example = t->main().main_path;
    }
  }
  return s;
}

// ---- the public face ----

Replicator::Replicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Replicator::~Replicator() = default;

Result<std::unique_ptr<Replicator>> Replicator::Start(ReplicatorOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  FLEETFS_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Replicator>(new Replicator(std::move(impl)));
}

std::shared_ptr<TenantWatch> Replicator::Watch(const FleetFile& file, std::uint64_t epoch) {
  return impl_->Watch(file, epoch);
}
void Replicator::Prepare(const FleetFile& main, std::uint64_t epoch,
                         std::function<void(int err)> done) {
  impl_->Prepare(main, epoch, std::move(done), /*warm=*/false);
}
void Replicator::Deleted(const FleetFile& main, std::uint64_t epoch) { impl_->Deleted(main, epoch); }
void Replicator::Warm(Slot first, Slot last, std::uint64_t epoch) { impl_->Warm(first, last, epoch); }
bool Replicator::Flush(MonoTime deadline) { return impl_->Flush(deadline); }
double Replicator::LagSeconds(Slot first, Slot last) const { return impl_->LagSeconds(first, last); }
ReplicationStats Replicator::Stats() const { return impl_->Stats(); }
void Replicator::Stop() { impl_->Stop(); }

}  // namespace fleetfs::replica
