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
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "fleet/replica/capture.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"
#include "fleet/replica/log_writer.h"
#include "fleet/replica/preparer.h"
#include "fleet/replica/ship_decision.h"
#include "fleet/replica/spill_file.h"
#include "fleet/fd_io.h"
#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"
#include "fleet/wal_format.h"

namespace fleetfs::replica {
namespace {

constexpr std::string_view kMarkerDir = kUnshippedMarkerDir;
constexpr std::string_view kSpoolDir = ".fleetfs/spool";
// One file per tenant deleted through the mount whose tombstone is not yet
// in its log, holding "<epoch> <deletion ms>": a delete survives a crash.
constexpr std::string_view kDeletedDir = ".fleetfs/deleted";
constexpr std::size_t kLagSamples = 4096;
// Internal to the prepare path (never an answer): a restore found the file
// made meanwhile, so the file there is checked again as any file found here.
constexpr int kRaced = Preparer::kRaced;

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
  std::atomic<std::uint64_t> capture_failures{0};
  std::atomic<std::uint64_t> absent_listed{0};
  std::atomic<std::uint64_t> continued{0};
  std::atomic<std::uint64_t> visits{0};
};

}  // namespace

class Tenant;
struct KeyLog;

class Replicator::Impl {
 public:
  explicit Impl(ReplicatorOptions options)
      : o_(std::move(options)), preparer_(PreparerOptionsFor(o_)) {}
  ~Impl() { Stop(); }

  Status Start();
  void Stop();
  std::shared_ptr<TenantWatch> Watch(const FleetFile& file, std::uint64_t epoch);
  void Prepare(const FleetFile& main, std::uint64_t epoch, std::function<void(int)> done,
               bool warm);
  void WillDelete(const FleetFile& main, std::uint64_t epoch);
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
  // The tenant of `main_path` has something for the next round to look at.
  // Called with its capture's lock held: takes active_mu_ only.
  void Activate(const std::string& main_path);
  const std::shared_ptr<CaptureBudget>& budget() const { return budget_; }
  std::uint64_t max_txn_bytes() const { return o_.max_txn_bytes; }

 private:
  struct Tombstone {
    FleetFile main;
    std::uint64_t epoch = 0;
    WallMs when = 0;
  };

  std::shared_ptr<Tenant> TenantFor(const FleetFile& main, bool create);
  // The key's log state, made on first use and kept for the agent's life.
  std::shared_ptr<KeyLog> LogFor(const FleetFile& main);
  void UploadLoop();
  void SyncAll();
  // One round of shipping; true when nothing is left unshipped.
  bool Round();
  // One round for one tenant; true when it has nothing left to ship.
  // With `snapshots` false, a tenant whose next shipment is a snapshot is
  // left for later (`*deferred` set): a round ships every tenant's segments
  // before any snapshot, so one tenant's long copy does not age the others'
  // commits past the sync interval.
  bool Sync(Tenant& t, bool snapshots = true, bool* deferred = nullptr);
  // Whether a tenant Sync answered `shipped` for leaves the round clean.
  bool Counted(Tenant& t, bool shipped);
  // The tenants a round visits: the active ones, and those whose periodic
  // snapshot fell due. Each comes with its activation count at this moment.
  std::vector<std::pair<std::string, std::uint64_t>> ActiveNow();
  // The active tenants that exist, for the operators' figures (no I/O).
  std::vector<std::shared_ptr<Tenant>> ActiveTenants() const;
  // A round visited the tenant (activation count `seen` when it began):
  // when it left nothing to ship and nothing activated it since, it is no
  // longer visited until it is.
  void Visited(const std::string& main_path, std::uint64_t seen, bool done);
  // Its periodic snapshot falls due at `due` (wall ms).
  void SnapshotDueAt(const std::string& main_path, WallMs due);
  Status ShipSegment(Tenant& t);
  Status ShipSnapshot(Tenant& t, bool periodic);
  // Copies the tenant's committed state into a spool file under its write
  // gate: the key's pending snapshot (and, for a periodic one, the segment
  // of the commits since the last, before it).
  Status StageSnapshot(Tenant& t, bool periodic);
  Status AppendPendingSegment(KeyLog& k, const FleetFile& main, Capture* capture);
  // An upload of the pending segment failed: it waits for the next one.
  void SpoolPendingSegment(KeyLog& k);
  Status AppendPendingSnapshot(KeyLog& k, const FleetFile& main, Capture* capture);
  void Prune(KeyLog& k, const FleetFile& main);  // retention, after a new snapshot
  void UploadTombstones();
  Status ShipTombstone(KeyLog& k, const Tombstone& tomb, bool* done);
  std::string DeletedPath(const FleetFile& main) const;
  // The newest object of `main`'s log that carries data (not a marker).
  Result<std::optional<LogHeader>> NewestData(const FleetFile& main, std::uint64_t epoch);
  // When the log's tail is markers after a snapshot or segment: that
  // object's sequence and checksum (the first marker after it holds the
  // checksum). Else nullopt.
  Result<std::optional<ShippedStamp>> DataBeforeMarkers(const FleetFile& main, std::uint64_t epoch);
  // True when the file's shipped stamp is the log's newest data and nothing
  // unshipped was written to it since (item 12: no snapshot needed).
  bool IsShippedState(const FleetFile& main, std::uint64_t epoch);
  // Whether the log's newest data (before its trailing markers) is the
  // object `stamp` names.
  bool LogEndsAt(const FleetFile& main, std::uint64_t epoch, const ShippedStamp& stamp);
  // Item 12: a tenant whose file is the log's newest data continues the log
  // with segments after this epoch's marker, with no snapshot. Under k.mu.
  void MaybeContinue(KeyLog& k, Tenant& t, std::optional<std::uint64_t> serving);
  // The tombstone of `main` (of the delete at `when`, or any) is no longer
  // to be shipped: landed, superseded, or the tenant made again.
  void ForgetDelete(const FleetFile& main, std::optional<WallMs> when);

  // Taking a key's log at an epoch (under the KeyLog's mu).
  struct Took {
    bool ok = false;
    bool fenced = false;  // a newer epoch holds it (reported, the range dropped)
    std::optional<LogTail> tail;
    Status problem;
  };
  Took TakeLog(KeyLog& k, const FleetFile& main, std::uint64_t epoch);
  // The marker after the tail TakeLog returned; `on_older` is told of each
  // older owner's object that landed after it, before the marker follows it.
  Status WriteMarker(KeyLog& k, const FleetFile& main, std::uint64_t epoch,
                     const std::function<void(const LogTail&)>& on_older);
  // What a write that did not append means: a fence, corruption, or an
  // epoch the store granted since the ceiling was read. Never OK.
  Status Settle(KeyLog& k, const FleetFile& main, const LogWriteOutcome& out);
  // The key's shipping stops at `epoch`: fenced (the range is dropped) or
  // corrupt (said as a failure, never a fence floor).
  void Stopped(KeyLog& k, const FleetFile& main, const LogWriteOutcome& out, std::uint64_t epoch);
  // The highest epoch an object may carry: what the store granted, as last
  // read, and never below `epoch`.
  std::uint64_t Ceiling(std::uint64_t epoch) const;
  // Reads the store's ceiling again; true when it rose.
  bool RefreshCeiling();

  // The preparer's options: its work is PrepareFile.
  PreparerOptions PreparerOptionsFor(const ReplicatorOptions& o);
  // One attempt at preparing the job's file (the Preparer's work); kRaced
  // when a file appeared under a restore.
  int PrepareFile(const PrepareJob& f);
  int RestoreInPlace(const FleetFile& main, std::uint64_t epoch, bool replace);
  // Whether the local file carries the epoch stamp of `epoch` (or newer):
  // it was checked against the replica at that epoch, or made at it.
  bool CheckedAt(const FleetFile& main, std::uint64_t epoch) const;
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
  struct Room {
    std::optional<std::uint64_t> free_bytes;  // nullopt when unknown
    std::uint64_t reserve = 0;                // kept for the applications
  };
  // What the backing volume has free, and the reserve the spool (and the
  // spill) never take.
  Room BackingRoom() const;
  void RecordSuccess();
  void RecordLag(WallMs commit_ms, WallMs shipped_ms);

  ReplicatorOptions o_;
  UniqueFd root_;
  // Every tenant's captured commits, in memory and spilled (made at Start).
  std::shared_ptr<CaptureBudget> budget_;

  // Guards the four below. Held only while they are read or changed: never
  // across I/O or while taking a Tenant's lock, so Stats() may take it.
  mutable std::mutex tenants_mu_;
  std::unordered_map<std::string, std::shared_ptr<Tenant>> tenants_;  // key: main path
  std::unordered_map<std::string, std::uint64_t> deleted_;  // main path -> epoch of the delete
  std::vector<Tombstone> tombstones_;                       // not yet at the destination
  std::unordered_map<std::string, std::shared_ptr<KeyLog>> logs_;  // key: main path
  std::atomic<std::uint64_t> ceiling_{0};  // the store's highest granted epoch, as last read

  // Tenants with something a round must look at (main path -> the number of
  // its last activation, unique over the agent's life), and those that are visited again only when their periodic
  // snapshot falls due (due wall ms, main path). A round visits these alone,
  // so its work follows the tenants with something to ship, not every tenant
  // ever seen. An entry leaves only when a visit found nothing left and no
  // activation came since it began (two rounds may run at once: a flush's
  // and the loop's). Taken alone: a capture calls Activate under its lock.
  mutable std::mutex active_mu_;
  std::unordered_map<std::string, std::uint64_t> active_;  // main path -> activation number
  std::uint64_t activations_ = 0;
  std::set<std::pair<WallMs, std::string>> snapshot_due_;

  std::mutex upload_mu_;  // guards the wake flags; taken alone
  std::condition_variable upload_cv_;
  bool upload_stop_ = false;
  bool upload_wake_ = false;
  std::thread uploader_;

  // Flights by (main path, epoch), lookups ahead of warm-ups, the absent-keys
  // cache. A prepare answers for its epoch only: one at a newer epoch never
  // joins a flight of an older one (which may have lapsed meanwhile); the two
  // may run at once, and only the one whose epoch is served publishes or
  // answers 0. Its lock is taken alone, never across PrepareFile.
  Preparer preparer_;
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

// ---- one key's log position, and one tenant's capture ----

// A key's log as this host writes it: one per key for the agent's life, so
// a tenant deleted and made again, a restore and a tombstone all go through
// the one writer (two writers of one key at one epoch would each take the
// other's objects for corruption).
// A segment taken from a capture and not yet in the log, retried byte for
// byte until it lands. Its first upload goes from memory; once one fails it
// waits in an unnamed spool file, as a snapshot does (charged to the spill
// bound), so an outage holds no memory for it.
struct PendingSegment {
  // A segment encoded in memory, before its first upload.
  static PendingSegment Of(EncodedLogObject object, const std::vector<Txn>& txns) {
    PendingSegment p;
    p.checksum = object.checksum;
    p.bytes = object.bytes.size();
    p.object = std::move(object);
    for (const Txn& x : txns) p.commit_ms.push_back(x.commit_ms);
    return p;
  }
  std::optional<EncodedLogObject> object;  // in memory
  UniqueFd file;                           // or spooled
  std::uint64_t checksum = 0;
  std::uint64_t bytes = 0;
  std::vector<WallMs> commit_ms;  // its commits, for the lag once it lands
  // Of the capture budget: for `file`, or for `object` kept across rounds
  // when it could not be spooled.
  std::uint64_t spill_held = 0;
  std::uint64_t memory_held = 0;
};

struct KeyLog {
  KeyLog(Destination& dest, std::string dir, CaptureBudget* budget)
      : writer(dest, std::move(dir)), budget(budget) {}

  // Serializes the key's shipping, takeovers, restores' markers and
  // tombstones. Order: mu, then a capture's locks, then Tenant::mu_.
  std::mutex mu;
  // Everything below is used under mu only.
  LogWriter writer;
  // A snapshot of the local file (or its restore) follows this host's
  // marker: segments may follow it.
  bool base = false;
  // Set (without mu) when the file the base was taken from may be gone: a
  // delete, or a new Tenant (a new capture) for the key. The next round
  // under mu starts from a snapshot.
  std::atomic<bool> stale_base{false};
  // The newest data object this host appended (its sequence and checksum):
  // what the file's shipped stamp records once nothing is left to ship.
  std::optional<ShippedStamp> last_data;
  WallMs last_snapshot_ms = 0;
  std::uint64_t commits_since_snapshot = 0;
  // A newer epoch took the log (or it could not be trusted) while written at
  // this epoch: nothing ships at or below it.
  std::uint64_t stopped_at = 0;
  Status stop_problem;  // why, when the log could not be trusted (not a fence)
  // Objects whose create got no clear answer: they may have landed, so they
  // are retried byte for byte (a different object at the same sequence would
  // be taken for corruption) before anything else follows them.
  CaptureBudget* const budget;  // the Impl's, which outlives every KeyLog's use
  std::optional<PendingSegment> pending_segment;
  UniqueFd pending_snapshot;
  std::uint64_t pending_snapshot_sum = 0;
  std::uint64_t pending_gap_mark = 0;
  // A new takeover left the pending objects behind: they never land, and
  // the next snapshot covers their commits (still in the local file).
  bool DropPending() {
    const bool had = pending_segment.has_value() || pending_snapshot.valid();
    EndPendingSegment();
    pending_snapshot.Reset();
    return had;
  }
  void EndPendingSegment() {
    if (!pending_segment) return;
    budget->ReleaseSpill(pending_segment->spill_held);
    budget->ReleaseMemory(pending_segment->memory_held);
    pending_segment.reset();
  }
};

class Tenant final {
 public:
  Tenant(Replicator::Impl& r, FleetFile main, std::shared_ptr<KeyLog> log)
      : capture_(std::make_shared<Capture>(
            CaptureOptions{r.root(), r.wall(), r.budget(), [&r] { r.CountCaptureFailure(); },
                           [&r, path = main.main_path] { r.Activate(path); },
                           r.max_txn_bytes()},
            std::move(main))),
        log_(std::move(log)),
        continuable_(ShippedState(r.root(), capture_->main())) {}

  // The file's shipped stamp, when the file is still that state as the
  // capture begins (before any write through the mount): no unshipped
  // marker, and the files' identity unchanged since the stamp was written
  // (a write around the mount, or a marker lost to a crash or a full
  // volume, changes it).
  static std::optional<ShippedStamp> ShippedState(int root, const FleetFile& main) {
    const std::string marker = std::string(kUnshippedMarkerDir) + "/" + MarkerName(main);
    if (::faccessat(root, marker.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0) return std::nullopt;
    UniqueFd file(::openat(root, main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!file.valid()) return std::nullopt;
    std::optional<ShippedStamp> stamp = ReadShippedStamp(file.get());
    if (!stamp || ReadFileIdentity(root, main.main_path) != stamp->files) return std::nullopt;
    return stamp;
  }

  const FleetFile& main() const { return capture_->main(); }
  Capture& capture() { return *capture_; }
  KeyLog& log() { return *log_; }

  // The tenant's TenantWatch (the mount's hooks) and its capture state.
  const std::shared_ptr<Capture> capture_;
  const std::shared_ptr<KeyLog> log_;
  const std::optional<ShippedStamp> continuable_;
  bool continue_tried_ = false;  // under the log's mu: MaybeContinue ran to a verdict

  std::mutex mu_;  // guards the two below; taken alone or after the log's mu
  std::uint64_t epoch_ = 0;
  bool deleted_ = false;  // deleted through the mount: nothing more of it ships

  bool IsDeleted() {
    std::lock_guard lock(mu_);
    return deleted_;
  }
};

// ---- start and stop ----

Status Replicator::Impl::Start() {
  root_ = UniqueFd(::open(o_.backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_.valid()) return ErrnoStatus("opening the backing directory " + o_.backing, errno);
  ::mkdirat(root_.get(), ".fleetfs", 0700);
  for (std::string_view dir : {kMarkerDir, kSpoolDir, kDeletedDir, kSpillDir}) {
    if (::mkdirat(root_.get(), std::string(dir).c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus("making " + o_.backing + "/" + std::string(dir), errno);
    }
  }
  // Spill files hold nothing a restart needs: each spilled tenant kept its
  // unshipped marker, so it ships from a snapshot.
  if (UniqueFd sfd(::openat(root_.get(), std::string(kSpillDir).c_str(),
                            O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      sfd.valid()) {
    if (DIR* d = ::fdopendir(sfd.get())) {
      sfd.Release();
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        if (std::string_view n = e->d_name; n != "." && n != "..") names.emplace_back(n);
      }
      for (const std::string& n : names) ::unlinkat(::dirfd(d), n.c_str(), 0);
      ::closedir(d);
    }
  }
  budget_ = std::make_shared<CaptureBudget>(
      std::max<std::uint64_t>(o_.capture_memory_bytes, 1), o_.capture_spill_bytes,
      [this]() -> std::optional<std::uint64_t> {
        const Room room = BackingRoom();
        if (!room.free_bytes) return std::nullopt;
        return *room.free_bytes > room.reserve ? *room.free_bytes - room.reserve : 0;
      });
  if (Status probe = o_.destination->Probe(); !probe.ok()) {
    return probe.WithContext("the replica destination cannot be written");
  }
  RefreshCeiling();
  // The tenants named in one of the agent's marker directories.
  auto each_marked = [&](std::string_view dir, const std::function<void(const FleetFile&, int)>& fn) {
    UniqueFd mfd(::openat(root_.get(), std::string(dir).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* d = mfd.valid() ? ::fdopendir(mfd.get()) : nullptr;
    if (d == nullptr) return;
    mfd.Release();
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n.size() < 5 || n[3] != '-') continue;
      auto bucket = ParseBucketName(n.substr(0, 3));
      auto file = bucket ? ParseFleetName(o_.mode, *bucket, n.substr(4)) : std::nullopt;
      if (!file || file->role != FileRole::kMain) continue;
      fn(*file, ::dirfd(d));
    }
    ::closedir(d);
  };
  // Tenants left with unshipped commits by an agent that ended.
  int found = 0;
  each_marked(kMarkerDir, [&](const FleetFile& file, int) {
    TenantFor(file, true)->capture().MarkUnshipped();
    ++found;
  });
  if (found > 0) {
    spdlog::info("replica: {} tenants have commits an earlier run did not ship; they ship once "
                 "their ranges are served", found);
  }
  // Deletes whose tombstones an agent that ended did not ship.
  int deleted = 0;
  each_marked(kDeletedDir, [&](const FleetFile& file, int dirfd) {
    char buf[64] = {};
    UniqueFd fd(::openat(dirfd, MarkerName(file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    const ssize_t n = fd.valid() ? ::read(fd.get(), buf, sizeof buf - 1) : -1;
    unsigned long long epoch = 0, when = 0;
    struct stat st;
    if (::fstatat(root_.get(), file.main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      // The tenant was made again after the delete (the record outlived
      // it): the record is stale, never a delete of the file there now.
      ::unlinkat(dirfd, MarkerName(file).c_str(), 0);
      return;
    }
    if (n <= 0 || std::sscanf(buf, "%llu %llu", &epoch, &when) != 2 || epoch == 0) {
      spdlog::warn("replica: {}/{}/{} does not hold '<epoch> <ms>'; the delete it records is "
                   "ignored",
                   o_.backing, std::string(kDeletedDir), MarkerName(file));
      return;
    }
    deleted_[file.main_path] = std::max<std::uint64_t>(deleted_[file.main_path], epoch);
    tombstones_.push_back(Tombstone{file, epoch, static_cast<WallMs>(when)});
    ++deleted;
  });
  if (deleted > 0) {
    spdlog::info("replica: {} tenants were deleted before an earlier run shipped their "
                 "tombstones; they stay deleted, and the tombstones ship once served",
                 deleted);
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
  preparer_.Start();
  return Status::Ok();
}

void Replicator::Impl::Stop() {
  {
    std::lock_guard lock(upload_mu_);
    upload_stop_ = true;
  }
  upload_cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
  preparer_.Stop();  // lookups still waiting get EIO
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
  auto log = LogFor(main);
  auto made = std::make_shared<Tenant>(*this, main, log);
  std::shared_ptr<Tenant> t;
  {
    std::lock_guard lock(tenants_mu_);
    auto [it, inserted] = tenants_.emplace(main.main_path, std::move(made));
    if (!inserted) return it->second;
    t = it->second;
    // A new capture knows nothing of what the log's base was taken from:
    // its commits never follow that base as segments.
    log->stale_base = true;
  }
  // Looked at once: it may have found something on disk to ship (a WAL an
  // earlier run left).
  Activate(main.main_path);
  return t;
}

std::shared_ptr<KeyLog> Replicator::Impl::LogFor(const FleetFile& main) {
  std::lock_guard lock(tenants_mu_);
  auto& k = logs_[main.main_path];
  if (!k) k = std::make_shared<KeyLog>(*o_.destination, LogDir(main), budget_.get());
  return k;
}

std::shared_ptr<TenantWatch> Replicator::Impl::Watch(const FleetFile& file, std::uint64_t epoch) {
  if (file.role != FileRole::kMain && file.role != FileRole::kWal &&
      file.role != FileRole::kJournal) {
    return nullptr;
  }
  FleetFile main = file;
  main.role = FileRole::kMain;
  if (file.role != FileRole::kMain) {
    // A sidecar of a deleted tenant (a connection that outlived the delete)
    // does not bring the tenant back.
    std::lock_guard lock(tenants_mu_);
    if (deleted_.count(main.main_path) > 0) return nullptr;
  }
  // Made (or opened) here: no longer absent.
  preparer_.absent().Forget(main.main_path);
  if (file.role == FileRole::kMain) {
    // The main file was opened or made again after a delete: the tenant
    // exists again, and its tombstone is superseded. (A sidecar opened by a
    // connection that outlived the delete does not bring it back.)
    ForgetDelete(main, std::nullopt);
  }
  auto t = TenantFor(main, true);
  std::lock_guard lock(t->mu_);
  if (epoch > t->epoch_) t->epoch_ = epoch;
  return t->capture_;
}

void Replicator::Impl::WillDelete(const FleetFile& main, std::uint64_t epoch) {
  // On disk before the file goes (a crash between the unlink and a record
  // written after it would bring the tenant back by restore), and before the
  // delete is known in memory (an upload that lands meanwhile finds the
  // record to remove). Kept until the tombstone is in the log. If the unlink
  // fails, the record names a file still there, and a start drops it.
  const std::string record = std::to_string(epoch) + " " + std::to_string(NowMs()) + "\n";
  const std::string path = DeletedPath(main);
  const std::string temp = path + ".tmp";
  UniqueFd fd(::openat(root_.get(), temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid() || ::write(fd.get(), record.data(), record.size()) != static_cast<ssize_t>(record.size()) ||
      ::fsync(fd.get()) != 0 || ::renameat(root_.get(), temp.c_str(), root_.get(), path.c_str()) != 0) {
    spdlog::error("replica: cannot record the delete of {} in {}/{}: {}; a crash before its "
                  "tombstone ships would bring the tenant back",
                  main.main_path, o_.backing, std::string(kDeletedDir), std::strerror(errno));
  } else if (UniqueFd dir(::openat(root_.get(), std::string(kDeletedDir).c_str(),
                                   O_RDONLY | O_DIRECTORY | O_CLOEXEC));
             dir.valid()) {
    ::fsync(dir.get());
  }
}

void Replicator::Impl::Deleted(const FleetFile& main, std::uint64_t epoch) {
  const WallMs when = NowMs();
  // The record WillDelete wrote, for a caller that did not call it.
  if (::faccessat(root_.get(), DeletedPath(main).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
    WillDelete(main, epoch);
  }
  LogFor(main)->stale_base = true;  // a tenant made again starts from a snapshot
  std::shared_ptr<Tenant> t;
  {
    std::lock_guard lock(tenants_mu_);
    auto it = tenants_.find(main.main_path);
    if (it != tenants_.end()) {
      t = it->second;
      tenants_.erase(it);
    }
    deleted_[main.main_path] = epoch;
    tombstones_.push_back(Tombstone{main, epoch, when});
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
  struct Visit {
    std::shared_ptr<Tenant> tenant;
    std::string path;
    std::uint64_t seen = 0;
  };
  std::vector<Visit> visits;
  for (auto& [path, seen] : ActiveNow()) visits.push_back(Visit{nullptr, path, seen});
  {
    std::lock_guard lock(tenants_mu_);
    for (Visit& v : visits) {
      if (auto it = tenants_.find(v.path); it != tenants_.end()) v.tenant = it->second;
    }
  }
  counters_.visits += visits.size();
  // Every active tenant, served now or not (the others left nothing to ship
  // at their last visit and changed in no way since): true means nothing
  // captured is left unshipped anywhere. A tenant whose range is not served
  // at this moment (a lapse, or a range lost) ships what its log can still
  // take; what it cannot ship (a snapshot goes only while served) keeps the
  // round unclean.
  bool clean = true;
  std::vector<Visit*> later;
  auto sync = [&](Visit& v, bool snapshots, bool* deferred) {
    // Before its scan: a change from here on activates it again.
    v.tenant->capture().ClearActive();
    return Sync(*v.tenant, snapshots, deferred);
  };
  // A visit leaves the tenant alone from now on only if the capture holds
  // nothing either: its marker kept (a commit frame seen whose chain is not
  // valid yet is forgotten only after a quiet round) means another visit.
  auto visited = [&](const Visit& v, bool shipped) {
    Capture& c = v.tenant->capture();
    Visited(v.path, v.seen, shipped && !c.unshipped() && c.oldest_pending_ms() == 0);
  };
  for (Visit& v : visits) {
    if (!v.tenant) {
      Visited(v.path, v.seen, true);  // deleted: its tombstone ships on its own
      continue;
    }
    bool deferred = false;
    const bool shipped = sync(v, /*snapshots=*/false, &deferred);
    if (deferred) {
      later.push_back(&v);
      continue;
    }
    visited(v, shipped);
    clean = Counted(*v.tenant, shipped) && clean;
  }
  for (Visit* v : later) {
    const bool shipped = sync(*v, /*snapshots=*/true, nullptr);
    visited(*v, shipped);
    clean = Counted(*v->tenant, shipped) && clean;
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

void Replicator::Impl::Activate(const std::string& main_path) {
  std::lock_guard lock(active_mu_);
  // Never a value an entry had before: a round that copied an erased
  // entry's value must not take a new activation for the one it saw.
  active_[main_path] = ++activations_;
}

std::vector<std::pair<std::string, std::uint64_t>> Replicator::Impl::ActiveNow() {
  const WallMs now = NowMs();
  std::lock_guard lock(active_mu_);
  while (!snapshot_due_.empty() && snapshot_due_.begin()->first <= now) {
    active_[snapshot_due_.begin()->second] = ++activations_;
    snapshot_due_.erase(snapshot_due_.begin());
  }
  return {active_.begin(), active_.end()};
}

std::vector<std::shared_ptr<Tenant>> Replicator::Impl::ActiveTenants() const {
  std::vector<std::string> paths;
  {
    std::lock_guard lock(active_mu_);
    paths.reserve(active_.size());
    for (const auto& [path, n] : active_) paths.push_back(path);
  }
  std::vector<std::shared_ptr<Tenant>> out;
  out.reserve(paths.size());
  std::lock_guard lock(tenants_mu_);
  for (const std::string& p : paths) {
    if (auto it = tenants_.find(p); it != tenants_.end()) out.push_back(it->second);
  }
  return out;
}

void Replicator::Impl::Visited(const std::string& main_path, std::uint64_t seen, bool done) {
  if (!done) return;
  std::lock_guard lock(active_mu_);
  if (auto it = active_.find(main_path); it != active_.end() && it->second == seen) {
    active_.erase(it);
  }
}

void Replicator::Impl::SnapshotDueAt(const std::string& main_path, WallMs due) {
  std::lock_guard lock(active_mu_);
  snapshot_due_.emplace(due, main_path);
}

bool Replicator::Impl::Counted(Tenant& t, bool shipped) {
  if (shipped || !t.capture().unshippable()) return shipped;
  // Journal mode OFF or MEMORY: not waited for (it is not replicated at all,
  // said loudly; holding a stop for it would only make every range on the
  // host lapse instead of being released), but its commits from before the
  // switch still count: they can ship (and so do those taken into an object
  // not yet landed).
  std::lock_guard ship(t.log().mu);
  return !t.capture().HasShippable() && !t.log().pending_segment.has_value() &&
         !t.log().pending_snapshot.valid();
}

// Deletes are facts of the replica: a tombstone in the key's log. Until it
// is there, a file under BACKING/.fleetfs/deleted/ keeps the delete across a
// crash, and lookups of the key answer "absent" (the log still holds the
// tenant) unless the log shows a newer owner's objects after it.
void Replicator::Impl::UploadTombstones() {
  std::vector<Tombstone> todo;
  {
    std::lock_guard lock(tenants_mu_);
    todo = tombstones_;
  }
  for (const Tombstone& tomb : todo) {
    auto k = LogFor(tomb.main);
    std::lock_guard ship(k->mu);
    {
      // Another round (a flush beside the loop's) may have shipped it while
      // this one waited for the key.
      std::lock_guard lock(tenants_mu_);
      if (std::none_of(tombstones_.begin(), tombstones_.end(), [&](const Tombstone& t) {
            return t.main.main_path == tomb.main.main_path && t.when == tomb.when;
          })) {
        continue;
      }
    }
    bool done = false;
    Status st = ShipTombstone(*k, tomb, &done);
    if (!st.ok() && st.code() != Code::kFailedPrecondition) RecordFailure(st);
    if (done) ForgetDelete(tomb.main, tomb.when);
  }
}

Status Replicator::Impl::ShipTombstone(KeyLog& k, const Tombstone& tomb, bool* done) {
  const FleetFile& main = tomb.main;
  FLEETFS_RETURN_IF_ERROR(AppendPendingSegment(k, main, nullptr));
  FLEETFS_RETURN_IF_ERROR(AppendPendingSnapshot(k, main, nullptr));
  const auto serving = o_.serving_epoch ? o_.serving_epoch(main.slot)
                                        : std::optional<std::uint64_t>(tomb.epoch);
  const bool at_log = k.writer.shipping() && k.writer.position().epoch >= tomb.epoch;
  if (!at_log || (serving && *serving > k.writer.position().epoch)) {
    // The log is taken first (after a restart, or at a new epoch): while
    // served only, and only if no newer owner wrote after the delete.
    if (!serving) return Status(Code::kFailedPrecondition, "waits to be served");
    Took took = TakeLog(k, main, *serving);
    if (took.fenced) {
      *done = true;  // another host's now: the delete is not ours to record
      return Status::Ok();
    }
    if (!took.ok) return took.problem;
    if (!took.tail) {
      *done = true;  // nothing was ever shipped: nothing to hide
      return Status::Ok();
    }
    FLEETFS_ASSIGN_OR_RETURN(const std::optional<LogHeader> data, NewestData(main, *serving));
    if (!data || data->kind == LogKind::kTombstone || data->epoch > tomb.epoch) {
      // No data to hide, the tombstone landed before a crash, or a newer
      // owner's data follows the delete (it made the tenant again; markers,
      // this host's own included, carry none): nothing to add.
      *done = true;
      return Status::Ok();
    }
    FLEETFS_RETURN_IF_ERROR(WriteMarker(k, main, *serving, nullptr));
  }
  FLEETFS_ASSIGN_OR_RETURN(EncodedLogObject object, EncodeLogTombstone(k.writer.position(), tomb.when));
  FLEETFS_ASSIGN_OR_RETURN(const LogWriteOutcome out,
                           k.writer.Append(object, Ceiling(k.writer.position().epoch)));
  if (out.kind != LogWriteKind::kAppended) {
    *done = out.kind == LogWriteKind::kFenced;
    return Settle(k, main, out);
  }
  k.base = false;  // a tenant made again starts from a snapshot
  *done = true;
  ++counters_.tombstones;
  spdlog::info("replica: {} deleted at epoch {}: tombstone at sequence {}", main.main_path,
               tomb.epoch, out.seq);
  return Status::Ok();
}

Result<std::optional<LogHeader>> Replicator::Impl::NewestData(const FleetFile& main,
                                                               std::uint64_t epoch) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs,
                           ListLog(*o_.destination, LogDir(main)));
  for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
    FLEETFS_ASSIGN_OR_RETURN(LogHeader h,
                             ReadLogHeader(*o_.destination, LogDir(main), *it, Ceiling(epoch)));
    if (h.kind != LogKind::kMarker) return std::optional<LogHeader>(std::move(h));
  }
  return std::optional<LogHeader>();
}

Result<std::optional<ShippedStamp>> Replicator::Impl::DataBeforeMarkers(const FleetFile& main,
                                                                        std::uint64_t epoch) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs,
                           ListLog(*o_.destination, LogDir(main)));
  if (seqs.empty()) return std::optional<ShippedStamp>();
  std::uint64_t seq = seqs.back();
  FLEETFS_ASSIGN_OR_RETURN(LogHeader h, ReadLogHeader(*o_.destination, LogDir(main), seq, Ceiling(epoch)));
  if (h.kind != LogKind::kMarker) return std::optional<ShippedStamp>();
  while (seq > 0) {
    const std::uint64_t sum = h.prev;
    --seq;
    FLEETFS_ASSIGN_OR_RETURN(h, ReadLogHeader(*o_.destination, LogDir(main), seq, Ceiling(epoch)));
    if (h.kind == LogKind::kMarker) continue;
    if (h.kind == LogKind::kTombstone) break;
    return std::optional<ShippedStamp>(ShippedStamp{seq, sum, {}});
  }
  return std::optional<ShippedStamp>();
}

bool Replicator::Impl::IsShippedState(const FleetFile& main, std::uint64_t epoch) {
  const std::optional<ShippedStamp> stamp = Tenant::ShippedState(root_.get(), main);
  if (!stamp) return false;
  return LogEndsAt(main, epoch, *stamp);
}

bool Replicator::Impl::LogEndsAt(const FleetFile& main, std::uint64_t epoch,
                                 const ShippedStamp& stamp) {
  auto data = DataBeforeMarkers(main, epoch);
  return data.ok() && *data && (*data)->seq == stamp.seq && (*data)->checksum == stamp.checksum;
}

void Replicator::Impl::MaybeContinue(KeyLog& k, Tenant& t, std::optional<std::uint64_t> serving) {
  if (k.base || t.continue_tried_ || !t.continuable_ || !serving) return;
  // After this epoch's marker, and once the file was checked at it (a check
  // may yet replace the file).
  if (!k.writer.shipping() || k.writer.position().epoch != *serving) return;
  if (!CheckedAt(t.main(), *serving)) return;
  t.continue_tried_ = true;
  const std::optional<ShippedStamp>& stamp = t.continuable_;
  if (!LogEndsAt(t.main(), *serving, *stamp)) return;
  k.base = true;
  k.last_data = *stamp;
  // The snapshot interval counts from here: the base's own time is unknown,
  // and an immediate "due" snapshot would undo what continuing saves.
  k.last_snapshot_ms = NowMs();
  k.commits_since_snapshot = 0;
  t.capture().ClearGap(0);  // unless a capture failed since it began
  ++counters_.continued;
  spdlog::info("replica: {} continues its log after sequence {} (the file is that state): no "
               "snapshot",
               t.main().main_path, stamp->seq);
}

std::string Replicator::Impl::DeletedPath(const FleetFile& main) const {
  return std::string(kDeletedDir) + "/" + MarkerName(main);
}

void Replicator::Impl::ForgetDelete(const FleetFile& main, std::optional<WallMs> when) {
  bool forgot = false, left = false;
  {
    std::lock_guard lock(tenants_mu_);
    const auto before = tombstones_.size();
    std::erase_if(tombstones_, [&](const Tombstone& t) {
      return t.main.main_path == main.main_path && (!when || t.when == *when);
    });
    forgot = tombstones_.size() != before;
    left = std::any_of(tombstones_.begin(), tombstones_.end(), [&](const Tombstone& t) {
      return t.main.main_path == main.main_path;
    });
    if (!left) deleted_.erase(main.main_path);
  }
  // Unless a newer delete of the key came meanwhile: its file is its own.
  if (forgot && !left) ::unlinkat(root_.get(), DeletedPath(main).c_str(), 0);
}

// ---- the key's log: takeovers, markers, and what a refused create means ----

std::uint64_t Replicator::Impl::Ceiling(std::uint64_t epoch) const {
  // Without a store to ask (tests that do not wire one), no epoch is judged
  // forged; the agent always wires it.
  if (!o_.epoch_ceiling) return std::numeric_limits<std::uint64_t>::max();
  return std::max(ceiling_.load(), epoch);
}

bool Replicator::Impl::RefreshCeiling() {
  if (!o_.epoch_ceiling) return false;
  auto read = o_.epoch_ceiling();
  if (!read.ok()) {
    spdlog::warn("replica: reading the highest epoch the store granted: {}", read.status().message());
    return false;
  }
  std::uint64_t old = ceiling_.load();
  while (*read > old && !ceiling_.compare_exchange_weak(old, *read)) {
  }
  return *read > old;
}

void Replicator::Impl::Stopped(KeyLog& k, const FleetFile& main, const LogWriteOutcome& out,
                               std::uint64_t epoch) {
  k.stopped_at = std::max(k.stopped_at, out.kind == LogWriteKind::kFenced ? out.fenced_by : epoch);
  if (out.kind == LogWriteKind::kFenced) {
    spdlog::error("replica: {} has epoch {} at {} (ours is {}): another host owns it now; stopping "
                  "its shipping and dropping its range",
                  main.main_path, out.fenced_by, o_.destination->url(), epoch);
    ++counters_.newer_epochs;
    if (o_.on_newer_epoch) o_.on_newer_epoch(main.slot, out.fenced_by);
    return;
  }
  // Corrupt: never a fence floor (a forged epoch must not exhaust the
  // counter), and nothing more ships at this epoch.
  k.stop_problem = out.problem.WithContext("replica log of " + main.main_path +
                                           " cannot be trusted; its shipping stops at epoch " +
                                           std::to_string(epoch));
  RecordFailure(out.problem.WithContext("replica log of " + main.main_path +
                                        " cannot be trusted; its shipping stops at epoch " +
                                        std::to_string(epoch)));
}

Replicator::Impl::Took Replicator::Impl::TakeLog(KeyLog& k, const FleetFile& main,
                                                 std::uint64_t epoch) {
  Took took;
  for (int attempt = 0;; ++attempt) {
    auto to = k.writer.Takeover(epoch, Ceiling(epoch));
    if (!to.ok()) {
      took.problem = to.status();
      return took;
    }
    if (to->kind == TakeoverKind::kCorrupt && attempt == 0 && RefreshCeiling()) continue;
    if (k.DropPending()) {
      // Their commits are in the local file, which ships as a snapshot next.
      if (auto t = TenantFor(main, false)) t->capture().MarkGap();
    }
    k.base = false;
    if (to->kind == TakeoverKind::kFenced) {
      LogWriteOutcome out;
      out.kind = LogWriteKind::kFenced;
      out.fenced_by = to->fenced_by;
      Stopped(k, main, out, epoch);
      took.fenced = true;
      took.problem = Status(Code::kFailedPrecondition, "fenced by epoch " + std::to_string(to->fenced_by));
      return took;
    }
    if (to->kind == TakeoverKind::kCorrupt) {
      LogWriteOutcome out;
      out.kind = LogWriteKind::kCorrupt;
      out.problem = to->problem;
      Stopped(k, main, out, epoch);
      took.problem = Status(Code::kFailedPrecondition, to->problem.message());
      return took;
    }
    took.ok = true;
    took.tail = to->tail;
    return took;
  }
}

Status Replicator::Impl::WriteMarker(KeyLog& k, const FleetFile& main, std::uint64_t epoch,
                                     const std::function<void(const LogTail&)>& on_older) {
  bool refreshed = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    FLEETFS_ASSIGN_OR_RETURN(const LogWriteOutcome out,
                             k.writer.WriteMarker(NowMs(), Ceiling(epoch)));
    switch (out.kind) {
      case LogWriteKind::kAppended:
        k.base = false;
        k.stopped_at = 0;
        k.stop_problem = Status::Ok();
        k.commits_since_snapshot = 0;
        spdlog::info("replica: {} taken at epoch {} (marker at sequence {})", main.main_path, epoch,
                     out.seq);
        return Status::Ok();
      case LogWriteKind::kTakenByOlder:
        // An older owner's late object landed after the listing: it is the
        // tail now, and what was checked against the old tail is checked
        // against it before the marker goes after it.
        spdlog::warn("replica: {}: an object of epoch {} landed at sequence {} while epoch {} took "
                     "the key; checking against it",
                     main.main_path, out.tail->header.epoch, out.seq, epoch);
        if (on_older) on_older(*out.tail);
        continue;
      case LogWriteKind::kCorrupt:
        if (!refreshed && RefreshCeiling()) {
          // The epoch at our sequence may be one the store granted since the
          // ceiling was read: the log is taken again to judge it.
          refreshed = true;
          Took again = TakeLog(k, main, epoch);
          if (!again.ok) return Status(Code::kFailedPrecondition, again.problem.message());
          continue;
        }
        [[fallthrough]];
      case LogWriteKind::kFenced:
        Stopped(k, main, out, epoch);
        return Status(Code::kFailedPrecondition,
                      "the marker of " + main.main_path + " at epoch " + std::to_string(epoch) +
                          " was refused: " + std::string(LogWriteKindName(out.kind)));
    }
  }
  return Unavailable("older owners' objects kept landing in the log of " + main.main_path +
                     " while epoch " + std::to_string(epoch) + " took it");
}

Status Replicator::Impl::Settle(KeyLog& k, const FleetFile& main, const LogWriteOutcome& out) {
  const std::uint64_t epoch = k.writer.position().epoch;
  if (out.kind == LogWriteKind::kAppended) return Status::Ok();
  if (out.kind == LogWriteKind::kCorrupt && RefreshCeiling()) {
    // The epoch found above the ceiling this host knew is one the store
    // granted since: the log is taken again to judge it as a fence.
    Took again = TakeLog(k, main, epoch);
    if (again.fenced || !again.ok) return Status(Code::kFailedPrecondition, "stopped");
    // Taken at our own epoch again: the next round writes the marker anew.
    return Status(Code::kFailedPrecondition, "the log of " + main.main_path + " is taken again");
  }
  Stopped(k, main, out, epoch);
  return Status(Code::kFailedPrecondition,
                "the log of " + main.main_path + " refused an object: " +
                    std::string(LogWriteKindName(out.kind)));
}

// ---- shipping ----

Status Replicator::Impl::AppendPendingSegment(KeyLog& k, const FleetFile& main, Capture* capture) {
  if (!k.pending_segment) return Status::Ok();
  PendingSegment& p = *k.pending_segment;
  const std::uint64_t ceiling = Ceiling(k.writer.position().epoch);
  auto appended = p.object ? k.writer.Append(*p.object, ceiling)
                           : k.writer.AppendFile(p.file.get(), p.checksum, ceiling);
  if (!appended.ok()) {
    SpoolPendingSegment(k);
    return appended.status();
  }
  const LogWriteOutcome& out = *appended;
  if (out.kind != LogWriteKind::kAppended) {
    k.DropPending();
    if (capture) capture->MarkGap();
    return Settle(k, main, out);
  }
  const std::uint64_t bytes = p.bytes;
  const std::vector<WallMs> commits = std::move(p.commit_ms);
  k.EndPendingSegment();
  k.last_data = ShippedStamp{out.seq, k.writer.position().prev, {}};
  k.commits_since_snapshot += commits.size();
  if (capture) capture->Shipped();
  const WallMs now = NowMs();
  for (WallMs ms : commits) RecordLag(ms, now);
  counters_.txns_shipped += commits.size();
  counters_.bytes_shipped += bytes;
  ++counters_.segments;
  preparer_.absent().Forget(main.main_path);
  return Status::Ok();
}

void Replicator::Impl::SpoolPendingSegment(KeyLog& k) {
  PendingSegment& p = *k.pending_segment;
  if (!p.object) return;  // spooled already
  if (budget_->TakeSpill(p.bytes)) {
    UniqueFd fd(::openat(root_.get(), std::string(kSpoolDir).c_str(),
                         O_RDWR | O_TMPFILE | O_CLOEXEC, 0600));
    if (fd.valid() && WriteAll(fd.get(), p.object->bytes.data(), p.object->bytes.size()).ok()) {
      p.file = std::move(fd);
      p.object.reset();
      p.spill_held = p.bytes;
      // Held in memory by an earlier failure (the disk was full then): it
      // is on disk now, and counts there only.
      budget_->ReleaseMemory(p.memory_held);
      p.memory_held = 0;
      return;
    }
    budget_->ReleaseSpill(p.bytes);
  }
  // No room on disk: it stays in memory, and counts there.
  if (p.memory_held == 0) {
    budget_->ForceMemory(p.bytes);
    p.memory_held = p.bytes;
  }
}

Status Replicator::Impl::AppendPendingSnapshot(KeyLog& k, const FleetFile& main, Capture* capture) {
  if (!k.pending_snapshot.valid()) return Status::Ok();
  FLEETFS_ASSIGN_OR_RETURN(
      const LogWriteOutcome out,
      k.writer.AppendFile(k.pending_snapshot.get(), k.pending_snapshot_sum,
                          Ceiling(k.writer.position().epoch)));
  if (out.kind != LogWriteKind::kAppended) {
    k.DropPending();
    if (capture) capture->MarkGap();
    return Settle(k, main, out);
  }
  struct stat st{};
  ::fstat(k.pending_snapshot.get(), &st);
  k.pending_snapshot.Reset();
  k.base = true;
  k.last_data = ShippedStamp{out.seq, k.writer.position().prev, {}};
  k.last_snapshot_ms = NowMs();
  k.commits_since_snapshot = 0;
  if (capture) capture->ClearGap(k.pending_gap_mark);
  ++counters_.snapshots;
  counters_.bytes_shipped += static_cast<std::uint64_t>(st.st_size);
  preparer_.absent().Forget(main.main_path);  // shipped: the replica holds it now
  spdlog::info("replica: {} ships a snapshot at sequence {} of epoch {} ({} bytes)", main.main_path,
               out.seq, k.writer.position().epoch, st.st_size);
  Prune(k, main);
  return Status::Ok();
}

Status Replicator::Impl::ShipSegment(Tenant& t) {
  KeyLog& k = t.log();
  if (!k.pending_segment) {
    std::vector<Txn> txns = t.capture().Take();
    if (txns.empty()) return Status::Ok();
    auto encoded = EncodeLogSegment(k.writer.position(), txns);
    if (!encoded.ok()) {
      // Too large for one object: the local file holds them, and a snapshot
      // ships them instead.
      t.capture().Return(std::move(txns));
      t.capture().MarkGap();
      return encoded.status().WithContext("encoding a segment of " + t.main().main_path);
    }
    k.pending_segment = PendingSegment::Of(std::move(*encoded), txns);
  }
  return AppendPendingSegment(k, t.main(), &t.capture());
}

Status Replicator::Impl::ShipSnapshot(Tenant& t, bool periodic) {
  KeyLog& k = t.log();
  FLEETFS_RETURN_IF_ERROR(AppendPendingSegment(k, t.main(), &t.capture()));
  if (k.pending_snapshot.valid()) return AppendPendingSnapshot(k, t.main(), &t.capture());
  FLEETFS_RETURN_IF_ERROR(StageSnapshot(t, periodic));
  if (t.IsDeleted()) {
    // Deleted during the copy: the name may already hold a new file, whose
    // writes this tenant's gate did not hold back. Nothing of it ships.
    k.DropPending();
    return Status(Code::kFailedPrecondition, t.main().main_path + " was deleted during its snapshot");
  }
  FLEETFS_RETURN_IF_ERROR(AppendPendingSegment(k, t.main(), &t.capture()));
  return AppendPendingSnapshot(k, t.main(), &t.capture());
}

void Replicator::Impl::Prune(KeyLog& k, const FleetFile& main) {
  auto pruned = PruneLog(*o_.destination, LogDir(main), NowMs() - o_.retention.count(),
                         Ceiling(k.writer.position().epoch));
  if (!pruned.ok()) {
    spdlog::warn("replica: retention of {}: {}", main.main_path, pruned.status().message());
  } else if (*pruned > 0) {
    spdlog::info("replica: {}: removed {} log objects older than the retention", main.main_path,
                 *pruned);
  }
}

bool Replicator::Impl::Sync(Tenant& t, bool snapshots, bool* deferred) {
  KeyLog& k = t.log();
  std::lock_guard ship(k.mu);
  if (k.stale_base.exchange(false)) {
    k.base = false;
    k.last_data.reset();
  }
  const FleetFile& main = t.main();
  std::optional<std::uint64_t> serving;
  {
    std::lock_guard lock(t.mu_);
    if (t.deleted_) return true;  // its tombstone is shipped on its own
    if (!o_.serving_epoch && t.epoch_ != 0) serving = t.epoch_;
  }
  if (o_.serving_epoch) serving = o_.serving_epoch(main.slot);
  CaptureScan first = t.capture().Scan();  // reads the WAL first
  CaptureScan scan = first;
  bool shipped = false;
  // The caller of Decide does what it names and asks again: a new epoch is
  // check, marker, snapshot, then what was captured meanwhile.
  // Segments do not count against the steps: a backlog larger than one
  // take ships whole in the round (a small capture bound must not cap a
  // tenant's throughput). Between segments the WAL is not read again, so a
  // tenant written flat out drains what it had, and the round moves on to
  // the others instead of chasing its new commits.
  int steps = 0;
  bool rescan = false;
  for (int step = 0; step < 6 && steps < 256; ++step, ++steps) {
    if (t.IsDeleted()) return true;  // deleted meanwhile: its tombstone is shipped on its own
    if (rescan) scan = t.capture().Scan();
    rescan = true;
    MaybeContinue(k, t, serving);
    const bool pending = k.pending_segment.has_value() || k.pending_snapshot.valid();
    // Not while a backlog waits (after an outage): it ships as segments
    // first, so the segment ahead of the snapshot is small.
    const bool snapshot_due = k.base && k.commits_since_snapshot > 0 &&
                              NowMs() - k.last_snapshot_ms >= o_.snapshot_interval.count() &&
                              t.capture().captured_bytes() <= budget_->take_bytes();
    // Nothing written since it was shipped (or checked): nothing to do, at
    // whatever epoch; a tenant merely opened never costs a takeover.
    const bool dirty = scan.unshipped || scan.has_captured || pending;
    if (!dirty && !snapshot_due) break;
    ShipInputs in;
    in.serving_epoch = serving;
    if (k.writer.shipping()) in.log_epoch = k.writer.position().epoch;
    // Read from the file every time, never inferred from the marker: a
    // restore writes its marker before the download, and the stale file it
    // replaces must not ship under that marker meanwhile.
    if (serving && CheckedAt(main, *serving)) in.checked_epoch = serving;
    in.fenced = k.stopped_at != 0 && (!serving || *serving <= k.stopped_at);
    in.unshippable = scan.unshippable;
    in.gap = scan.gap && scan.unshipped;
    in.matches_tail = k.base;
    in.commits_waiting = scan.has_captured || pending;
    in.appendable = pending ? k.pending_segment.has_value() : t.capture().HasShippable();
    in.snapshot_due = snapshot_due;
    const ShipDecision d = Decide(in);
    Status st;
    switch (d.action) {
      case ShipAction::kStop:
        // A log that cannot be trusted stays a failure every round (a
        // round without one would clear it): only a new epoch ends it.
        if (!k.stop_problem.ok()) {
          RecordFailure(k.stop_problem);
          return false;
        }
        // Fenced: another owner holds the key, and what is captured here
        // can never ship (this file is replaced if the key comes back). A
        // stop does not wait for it.
        if (scan.has_captured || scan.unshipped) {
          spdlog::warn("replica: {}: commits made here after epoch {} took the key are dropped",
                       main.main_path, k.stopped_at);
          t.capture().Reset();
        }
        return true;
      case ShipAction::kNothing:
      case ShipAction::kTombstone:  // a deleted tenant is no longer in tenants_
        step = 6;
        continue;
      case ShipAction::kCheck:
        // Nothing ships under an epoch before the file was checked against
        // the log at it: the check is queued ahead of warm-ups (a stop waits
        // for it), and shipping resumes after it.
        Prepare(main, *serving, nullptr, /*warm=*/false);
        return false;
      case ShipAction::kMarker: {
        Took took = TakeLog(k, main, *serving);
        if (!took.ok) {
          if (!took.fenced && took.problem.code() != Code::kFailedPrecondition) st = took.problem;
          else return false;
        } else {
          st = WriteMarker(k, main, *serving, nullptr);
        }
        break;
      }
      case ShipAction::kSnapshot:
        if (!snapshots) {
          if (deferred) *deferred = true;
          return false;
        }
        st = ShipSnapshot(t, in.snapshot_due && !in.gap && k.base);
        break;
      case ShipAction::kSegment:
        st = ShipSegment(t);
        --step;
        rescan = false;
        scan.has_captured = t.capture().HasShippable();  // what is left of the backlog
        break;
    }
    if (st.code() == Code::kFailedPrecondition) {
      spdlog::debug("replica: {}", st.message());  // said where it happened, or not a failure
      return false;
    }
    if (!st.ok()) {
      RecordFailure(st.WithContext("shipping " + main.main_path));
      return false;
    }
    shipped = true;
  }
  // Visited again when the periodic snapshot falls due, though nothing
  // else brings it back (snapshot_due above decides then).
  if (k.base && k.commits_since_snapshot > 0) {
    SnapshotDueAt(main.main_path, k.last_snapshot_ms + o_.snapshot_interval.count());
  }
  if (scan.unshippable) return false;  // what came after the switch waits
  const bool pending = k.pending_segment.has_value() || k.pending_snapshot.valid();
  if (pending) return false;
  // The files' identity before the marker can go: if nothing lands between
  // this and the look after, it is the identity of the shipped state, and
  // the stamp written with it is believed only while it still holds.
  std::optional<FileIdentity> before;
  if ((first.unshipped || shipped) && k.last_data) before = ReadFileIdentity(root_.get(), main.main_path);
  bool settled;
  if (shipped) {
    settled = t.capture().SettleShipped(first);
  } else if (scan.has_captured) {
    return false;
  } else {
    // Nothing left to ship: the unshipped marker goes once the capture
    // holds nothing either (SettleIdle keeps it while a gap waits for a
    // snapshot).
    settled = t.capture().SettleIdle(first);
  }
  if (settled && before && !t.capture().unshipped() && !t.IsDeleted() &&
      ReadFileIdentity(root_.get(), main.main_path) == before) {
    ShippedStamp stamp = *k.last_data;
    stamp.files = *before;
    UniqueFd file(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (file.valid()) (void)WriteShippedStamp(file.get(), stamp, main.main_path);
  }
  return settled;
}

// A snapshot is staged on the backing volume before its upload. Were it
// staged whatever the room, each retry (every sync interval) would fill the
// volume, and the applications' own writes would fail with "database or disk
// is full". It waits instead while it would leave less than the reserve, and
// says so: not the destination's fault, and not a lag of 0.
Status Replicator::Impl::CheckSpoolRoom(const Tenant& t) {
  struct stat st;
  if (::fstatat(root_.get(), t.main().main_path.c_str(), &st, 0) != 0) return Status::Ok();
  const auto [free_bytes, reserve] = BackingRoom();
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

Replicator::Impl::Room Replicator::Impl::BackingRoom() const {
  Room room;
  std::uint64_t volume_bytes = 0;
  if (o_.backing_free_bytes) {
    room.free_bytes = o_.backing_free_bytes();
  } else if (struct statvfs vfs; ::fstatvfs(root_.get(), &vfs) == 0) {
    room.free_bytes = std::uint64_t{vfs.f_bavail} * vfs.f_frsize;
    volume_bytes = std::uint64_t{vfs.f_blocks} * vfs.f_frsize;
  }
  room.reserve = o_.spool_reserve_bytes != 0
                     ? o_.spool_reserve_bytes
                     : std::clamp<std::uint64_t>(volume_bytes / 20, 4ull << 20, 1ull << 30);
  return room;
}

Status Replicator::Impl::StageSnapshot(Tenant& t, bool periodic) {
  KeyLog& k = t.log();
  // Short: the shipping thread serves every tenant, and a hot journal left
  // by a writer that died stays hot until the next opener rolls it back.
  // Every write to the main file and its WAL waits from here until the copy is
  // done, so the copy is one consistent state.
  FLEETFS_RETURN_IF_ERROR(CheckSpoolRoom(t));
  auto held = t.capture().HoldForSnapshot(std::chrono::milliseconds(200));
  if (!held.ok()) return held.status();
  Capture::SnapshotHold hold = std::move(*held);
  const std::uint64_t gap_mark = hold.gap_mark();
  // The commits the copy covers: a periodic snapshot ships them first as a
  // segment (read whole: only a small backlog, which Sync waits for); any
  // other only needs their times.
  std::vector<Txn> before;
  std::vector<WallMs> covered;
  if (periodic) {
    if (hold.CapturedBytes() > budget_->take_bytes()) {
      return Status(Code::kFailedPrecondition,
                    t.main().main_path + " ships its backlog as segments before its snapshot");
    }
    before = hold.TakeCaptured();
  } else {
    covered = hold.ForgetCaptured();
  }
  LogPosition at = k.writer.position();
  std::optional<EncodedLogObject> segment;
  if (periodic && !before.empty()) {
    // The commits since the last segment go first, as their own segment, so
    // a point between them stays restorable; the snapshot follows it.
    if (auto encoded = EncodeLogSegment(at, before); encoded.ok()) {
      at.prev = encoded->checksum;
      ++at.seq;
      segment = std::move(*encoded);
    }
  }
  UniqueFd main(::openat(root_.get(), t.main().main_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!main.valid()) {
    t.capture().MarkGap();  // what was taken is only in the file: the next snapshot covers it
    return ErrnoStatus("opening " + t.main().main_path + " for a snapshot", errno);
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
    for (auto& c : read->txns) {
      page = c.page_size;
      db_size = std::uint64_t{c.db_pages} * c.page_size;
      for (auto& [pgno, data] : c.pages) overlay[pgno] = std::move(data);
    }
  }
  // An unnamed file in the spool directory: it goes away with its descriptor,
  // so a snapshot never stays on the volume after its upload (or a crash).
  UniqueFd out(::openat(root_.get(), std::string(kSpoolDir).c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC,
                        0600));
  if (!out.valid()) {
    t.capture().MarkGap();
    return ErrnoStatus("making a snapshot spool file in " + o_.backing + "/" + std::string(kSpoolDir),
                       errno);
  }
  SnapshotOwner owner{st.st_uid, st.st_gid, st.st_mode & 07777};
  auto sum = WriteLogSnapshot(
      main.get(), db_size, at, NowMs(), owner,
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
  if (!sum.ok()) {
    t.capture().MarkGap();
    return sum.status().WithContext("snapshot of " + t.main().main_path);
  }
  // The hold ends as this returns: the uploads happen after, retried byte
  // for byte until they land.
  if (segment) {
    k.pending_segment = PendingSegment::Of(std::move(*segment), before);
  } else {
    const WallMs now = NowMs();
    for (const Txn& x : before) RecordLag(x.commit_ms, now);
    for (WallMs ms : covered) RecordLag(ms, now);
  }
  k.pending_snapshot = std::move(out);
  k.pending_snapshot_sum = *sum;
  k.pending_gap_mark = gap_mark;
  return Status::Ok();
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
  preparer_.Prepare(main, epoch, std::move(done), warm);
}

PreparerOptions Replicator::Impl::PreparerOptionsFor(const ReplicatorOptions& o) {
  PreparerOptions p;
  p.threads = std::max(1, o.prepare_threads);
  p.warm_parallel = o.warm_parallel;
  p.max_lookup_flights = o.max_lookup_flights;
  p.absent_keys = o.absent_keys;
  p.destination = o.destination;
  p.mode = o.mode;
  p.work = [this](const PrepareJob& job) { return PrepareFile(job); };
  p.serving_epoch = o.serving_epoch;
  // A cached absence answers a lookup only while the name is still missing
  // on the backing volume.
  p.missing_here = [this](const FleetFile& main) {
    struct stat st;
    return ::fstatat(root_.get(), main.main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
           errno == ENOENT;
  };
  return p;
}

int Replicator::Impl::PrepareFile(const PrepareJob& f) {
  const FleetFile& main = f.main;
  std::optional<std::uint64_t> deleted_at;
  {
    std::lock_guard lock(tenants_mu_);
    if (auto it = deleted_.find(main.main_path); it != deleted_.end()) deleted_at = it->second;
  }
  struct stat st;
  const bool exists = ::fstatat(root_.get(), main.main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (!exists && errno != ENOENT) return errno;
  if (exists && !S_ISREG(st.st_mode)) return 0;  // the mount hides it
  std::uint64_t stamp = 0;
  bool unfinished = false;
  if (exists) {
    UniqueFd file(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!file.valid()) return errno;
    if (auto key = ReadKeyStamp(file.get()); key && *key != main.key) {
      spdlog::error("replica: {} says it belongs to '{}', not '{}'; refusing to expose it",
                    main.main_path, *key, main.key);
      return EIO;
    }
    const std::optional<std::uint64_t> stamped = ReadEpochStamp(file.get());
    if (stamped.value_or(0) >= f.epoch) return 0;  // the Preparer answers 0 only while f.epoch is served
    stamp = stamped.value_or(0);
    // Stamped 0 explicitly: a restore that published and then stopped (a
    // crash) before it cleared the stray sidecars and stamped its epoch. It
    // is restored again, sidecars and all, rather than exposed beside them.
    unfinished = stamped && *stamped == 0;
  } else if (!deleted_at) {
    // Missing here. One listing says whether the replica holds anything;
    // nothing is made (no bucket, no file, no log state) unless it does.
    if (!f.warm && preparer_.absent().Contains(main.main_path, f.epoch)) return 0;
    ++counters_.absent_listed;
    auto seqs = ListLog(*o_.destination, LogDir(main));
    if (!seqs.ok()) {
      spdlog::error("replica: cannot tell whether the replica holds {}: {}", main.main_path,
                    seqs.status().message());
      ++counters_.restore_failures;
      return EIO;
    }
    if (seqs->empty()) {
      // Remembered for an epoch still served only: an entry says nothing
      // about another epoch, and could push out one that does.
      if (!StillServed(main, f.epoch)) return NotServed(main, f.epoch, "absent key");
      preparer_.absent().Remember(main.main_path, f.epoch);
      return 0;
    }
  }
  if (!StillServed(main, f.epoch)) return NotServed(main, f.epoch, "takeover");
  // The key's log is taken at this epoch: its tail says whether the file
  // here is current, and the marker after it goes first, so an older owner
  // still shipping finds its next sequence taken and stops: nothing it ships
  // can land under the download.
  bool restore = false, replace = false;
  {
    auto k = LogFor(main);
    std::lock_guard ship(k->mu);
    Took took = TakeLog(*k, main, f.epoch);
    if (!took.ok) {
      if (!took.fenced) {
        spdlog::error("replica: taking the log of {} at epoch {}: {}", main.main_path, f.epoch,
                      took.problem.message());
        ++counters_.restore_failures;
      }
      return EIO;
    }
    const std::uint64_t tail_epoch = took.tail ? took.tail->header.epoch : 0;
    if (deleted_at) {
      // Only data a newer owner wrote after the delete revives the tenant;
      // markers carry none (this host's own takeover writes one).
      auto data = NewestData(main, f.epoch);
      if (!data.ok()) {
        spdlog::error("replica: reading the log of {}: {}", main.main_path, data.status().message());
        return EIO;
      }
      if (!*data || (*data)->kind == LogKind::kTombstone || (*data)->epoch <= *deleted_at) {
        return 0;  // the delete stands; its tombstone ships
      }
      spdlog::info("replica: {} was deleted here at epoch {}, and epoch {} wrote it since; the "
                   "delete is dropped",
                   main.main_path, *deleted_at, (*data)->epoch);
      ForgetDelete(main, std::nullopt);
    }
    if (!took.tail) {
      // Nothing in the log (retention cannot empty one): the file here, if
      // any, is all there is; the shipper takes the log when it ships.
      if (!exists) {
        preparer_.absent().Remember(main.main_path, f.epoch);
        return 0;
      }
    } else {
      // A newer epoch than the file's stamp wrote the key: another owner's
      // (or a stale copy that appeared). Replaced from the log.
      restore = !exists || unfinished || tail_epoch > stamp;
      if (restore && exists && !unfinished && took.tail->header.kind == LogKind::kMarker &&
          IsShippedState(main, f.epoch)) {
        // Only takeovers followed this host's last shipment (nobody wrote
        // since): the file is the log's newest state, kept, not downloaded.
        spdlog::info("replica: {} is the log's newest data; kept at epoch {}", main.main_path,
                     f.epoch);
        restore = false;
      }
      replace = exists && restore;
      Status marked = WriteMarker(*k, main, f.epoch, [&](const LogTail& older) {
        if (exists && older.header.epoch > stamp) restore = replace = true;
      });
      if (!marked.ok()) {
        spdlog::error("replica: marking {} taken at epoch {}: {}", main.main_path, f.epoch,
                      marked.message());
        return EIO;
      }
    }
  }
  if (restore) {
    if (replace) {
      spdlog::warn("replica: {} on disk is stamped epoch {}, the replica's log was written at a "
                   "newer epoch; replacing it from the replica before exposing it at epoch {}",
                   main.main_path, stamp, f.epoch);
    }
    return RestoreInPlace(main, f.epoch, replace);
  }
  // Current: the stamp is raised, only while its epoch is served, and never
  // lowered (a flight of a newer epoch may have raised it meanwhile).
  if (!StillServed(main, f.epoch)) return NotServed(main, f.epoch, "epoch stamp");
  UniqueFd file(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!file.valid()) return errno == ENOENT ? kRaced : errno;
  if (ReadEpochStamp(file.get()).value_or(0) >= f.epoch) return 0;
  if (Status stamped = WriteStamps(file.get(), f.epoch, main.key, main.main_path); !stamped.ok()) {
    // Exposed unstamped, the file would be checked again at every lookup
    // and never shipped under this epoch.
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
  // The marker is in the log already (PrepareFile): an older owner's late
  // object cannot land after it, so the log read now is the whole truth.
  if (!StillServed(main, epoch)) return NotServed(main, epoch, "restore");
  auto outcome = RestoreFromLog(*o_.destination, LogDir(main), std::nullopt, fd.get(), Ceiling(epoch));
  if (!outcome.ok() && outcome.status().code() == Code::kDataLoss && RefreshCeiling()) {
    // An epoch above the ceiling known here may be one the store granted
    // since: read again with the new ceiling, into an empty file.
    if (::ftruncate(fd.get(), 0) == 0) {
      outcome = RestoreFromLog(*o_.destination, LogDir(main), std::nullopt, fd.get(), Ceiling(epoch));
    }
  }
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
  if (outcome->result != LogRestoreResult::kRestored) {
    if (!StillServed(main, epoch)) return lapsed();
    if (!replace) {
      preparer_.absent().Remember(main.main_path, epoch);  // nothing to restore at this epoch
    } else if (outcome->result == LogRestoreResult::kNoReplica) {
      // The log holds no data (markers only, or nothing before a snapshot
      // landed): the file here is all there is. It is kept, and stamped so
      // that no later check at this epoch takes it for a stale copy.
      spdlog::info("replica: the log of {} holds no data; the file here is kept", main.main_path);
      UniqueFd file(::openat(root_.get(), main.main_path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (file.valid() && ReadEpochStamp(file.get()).value_or(0) < epoch) {
        if (!StillServed(main, epoch)) return lapsed();
        if (Status st = WriteStamps(file.get(), epoch, main.key, main.main_path); !st.ok()) {
          spdlog::error("replica: {}", st.message());
          return EIO;
        }
      }
    } else if (outcome->result == LogRestoreResult::kDeleted) {
      ResetTenant(main);
      if (!StillServed(main, epoch)) return lapsed();
      spdlog::warn("replica: {} was deleted by epoch {}; removing the stale local copy",
                   main.main_path, outcome->tail_epoch);
      remove_set(true);
    }
    return 0;
  }
  // Stamped epoch 0 until it is published and its stray sidecars are gone:
  // a lookup that finds it before then is prepared, and so waits for this
  // restore's flight to end, instead of being exposed at once.
  if (!WriteStamps(fd.get(), 0, main.key, main.main_path).ok() ||
      ::fchown(fd.get(), outcome->owner.uid, outcome->owner.gid) != 0 ||
      // The mode comes from an untrusted object: permission bits only, never
      // set-id or sticky bits.
      ::fchmod(fd.get(), (outcome->owner.mode & 0777) != 0 ? (outcome->owner.mode & 0777) : 0644) != 0 ||
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
  spdlog::info("replica: restored {} as of log sequence {} ({} commits after its snapshot, {} bytes) "
               "in {} ms",
               main.main_path, outcome->as_of_seq.value_or(0), outcome->commits, outcome->bytes, ms);
  ++counters_.restores;
  if (replace) ++counters_.stale_replaced;
  return 0;
}

void Replicator::Impl::ResetTenant(const FleetFile& main) {
  auto t = TenantFor(main, false);
  if (!t) return;
  std::lock_guard ship(t->log().mu);
  t->capture().Reset();
  t->log().base = false;
  t->log().last_data.reset();
}

void Replicator::Impl::Warm(Slot first, Slot last, std::uint64_t epoch) {
  preparer_.Warm(first, last, epoch);
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
  // Only an active tenant has commits pending (a write activates it, and it
  // stays until a visit finds nothing left).
  for (const auto& t : ActiveTenants()) {
    if (t->main().slot < first || t->main().slot > last) continue;
    const WallMs o = t->capture().oldest_pending_ms();
    if (o != 0 && (oldest == 0 || o < oldest)) oldest = o;
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
  s.warm_queued = preparer_.warm_queued();
  s.capture_failures = counters_.capture_failures.load();
  s.absent_listed = counters_.absent_listed.load();
  s.prepares_refused = preparer_.prepares_refused();
  s.continued = counters_.continued.load();
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
  if (budget_) {
    s.capture_memory_bytes = budget_->memory_used();
    s.capture_memory_peak = budget_->memory_peak();
    s.capture_memory_limit = budget_->memory_limit();
    s.capture_spill_bytes = budget_->spill_used();
    s.capture_spill_limit = budget_->spill_limit();
    s.capture_spilled = budget_->spilled.load();
    s.dropped_to_snapshot = budget_->drops.load();
    s.oversized_transactions = budget_->oversized.load();
  }
  {
    std::lock_guard lock(tenants_mu_);
    s.tenants = tenants_.size();
  }
  s.tenant_visits = counters_.visits.load();
  // What follows is true of active tenants only (see LagSeconds).
  const auto active = ActiveTenants();
  s.active_tenants = active.size();
  for (const auto& t : active) {
    if (const std::uint64_t needed = t->capture().dropped_bytes(); needed != 0) {
      ++s.snapshot_needed_tenants;
      if (needed > s.snapshot_needed_bytes) {
        s.snapshot_needed_bytes = needed;
        s.snapshot_needed_largest = t->main().main_path;
      }
    }
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
void Replicator::WillDelete(const FleetFile& main, std::uint64_t epoch) {
  impl_->WillDelete(main, epoch);
}
void Replicator::Deleted(const FleetFile& main, std::uint64_t epoch) { impl_->Deleted(main, epoch); }
void Replicator::Warm(Slot first, Slot last, std::uint64_t epoch) { impl_->Warm(first, last, epoch); }
bool Replicator::Flush(MonoTime deadline) { return impl_->Flush(deadline); }
double Replicator::LagSeconds(Slot first, Slot last) const { return impl_->LagSeconds(first, last); }
ReplicationStats Replicator::Stats() const { return impl_->Stats(); }
void Replicator::Stop() { impl_->Stop(); }

}  // namespace fleetfs::replica
