// Replicator::Impl: the replicator's state and the types it keeps per key
// (KeyLog, PendingSegment) and per tenant (Tenant), shared by the files that
// carry out its work: fleet/replicator.cc (start and stop, the mount's hooks,
// the active tenants, what operators see, the public face),
// fleet/replica/shipper.cc (the shipping thread, tombstones, the key's log)
// and fleet/replica/restorer.cc (prepare: checks and restores). Private to
// fleet/: nothing outside it includes this.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fleet/histogram.h"
#include "fleet/replica/capture.h"
#include "fleet/replica/log_object.h"
#include "fleet/replica/log_writer.h"
#include "fleet/replica/preparer.h"
#include "fleet/replicator.h"
#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {

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
  // Restores published: from the start of the restore to its publication.
  CallHistogram restore_time;
};

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
  bool FlushRange(MonoTime deadline, Slot first, Slot last);
  // Whether no tenant of [first, last] has a commit or a tombstone left to ship.
  bool RangeShipped(Slot first, Slot last) const;
  double LagSeconds(Slot first, Slot last) const;
  ReplicationStats Stats() const;
  std::vector<TenantReplication> TenantStates(const std::vector<std::string>& also) const;

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
  // `only`: visit just the tenants and tombstones whose slot is in [first,
  // last] (a range's flush); true then means those are clean.
  bool Round(std::optional<std::pair<Slot, Slot>> only = std::nullopt);
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
  // Ships the tombstones not yet at the destination; with `only`, those of
  // keys whose slot is in [first, last].
  void UploadTombstones(std::optional<std::pair<Slot, Slot>> only);
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
  // last_data's sequence and when it landed (0: unknown), for operators,
  // read without mu (TenantStates).
  std::atomic<std::uint64_t> shown_seq{0};
  std::atomic<WallMs> shown_ms{0};
  void Landed(std::uint64_t seq, std::uint64_t prev, WallMs now) {
    last_data = ShippedStamp{seq, prev, {}};
    shown_seq = seq;
    shown_ms = now;
  }
  // The log's base or history no longer belongs to the file (a delete, a
  // new capture, a restore): nothing this host shipped describes it now, so
  // operators are no longer shown it either.
  void Forget() {
    last_data.reset();
    shown_seq = 0;
    shown_ms = 0;
  }
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
  // The capture (the tenant's incarnation) the pending objects were taken
  // from: a tenant deleted and made again gets a new one, and the old
  // file's objects are neither its base nor its commits.
  std::weak_ptr<Capture> pending_owner;
  bool PendingOf(const std::shared_ptr<Capture>& c) const {
    return !pending_owner.owner_before(c) && !c.owner_before(pending_owner);
  }
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

}  // namespace fleetfs::replica
