// Capture: one tenant's changes, as the mount reports them before they reach
// the disk, turned into the committed transactions replication ships
// (DESIGN section 5). The shipper (fleet/replicator.cc) takes what is
// captured; it never reads a tenant's files to find commits itself.
//
// WAL mode. A tenant's committed WAL frames are read (validated as SQLite's
// recovery does) when the shipper asks (Scan), and at the last moment they
// can be: before a WAL restart (a header written at offset 0), truncation or
// delete, which wait meanwhile.
//
// Rollback-journal mode. The byte ranges of the main file written while a
// journal is hot are read back when the journal is finished (deleted,
// truncated to 0 or its header zeroed): that is the commit (or a rollback,
// which ships the old pages back).
//
// Gaps. A capture that could not read what it had to (an I/O error, no
// descriptor), too much captured for the destination to take, or a shipper
// that lost its place marks a gap: the next shipment is a snapshot, and what
// was captured after the gap never goes into the generation before it.
//
// Bounds. A transaction larger than max_txn_bytes is never held: it marks a
// gap, so the snapshot that follows ships it from the file. Captured commits
// wait in memory while the agent's CaptureBudget
// allows (one bound for every tenant: an outage once grew memory by 256 MiB
// per tenant), then in the tenant's spill file (spill_file.h), in commit
// order. Beyond both they are dropped with a gap, logged once per episode
// and reported (dropped_bytes()): the tenant then needs a full snapshot,
// which a destination short of room may never take.
//
// Journal mode OFF or MEMORY. A main-file write with no hot journal while the
// database is not in WAL mode (header bytes 18 and 19 are 2 in WAL mode)
// leaves nothing on disk that marks a transaction's end, so any copy could be
// torn. The tenant is then *unshippable*: logged once (naming the tenant and
// the rule), counted in Stats, and neither a snapshot nor a segment of it is
// shipped. It may ship again once a commit is seen with a journal or a WAL
// (a journal finished, or committed WAL frames); the gap marked on entry
// makes that next shipment a fresh snapshot taken under the write gate, and
// nothing captured in between goes into the old generation.
//
// The write gate. Every change the hooks let through holds the tenant's gate
// shared until it landed; a snapshot holds it alone (HoldForSnapshot) while
// it copies, so the copy is one consistent state. A transaction that begins
// (a journal header written) waits while a snapshot is wanted.
//
// Thread-safety: every method is safe from any thread. The hooks are called
// from FUSE threads at once; the shipper's calls come from its thread. Lock
// order: the gate, then capture_mu_ (the WAL cursor), then mu_ (everything
// else). unshipped(), unshippable() and oldest_pending_ms() read atomics and
// never wait, so the agent's loop may call them during a snapshot.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/layout.h"
#include "fleet/replica/spill_file.h"
#include "fleet/replica_object.h"
#include "fleet/status.h"
#include "fleet/tenant_hooks.h"
#include "fleet/wal_format.h"

namespace fleetfs::replica {

// Under the backing directory: one empty file per tenant with commits not yet
// shipped, so an agent that restarts after a crash ships them.
inline constexpr std::string_view kUnshippedMarkerDir = ".fleetfs/unshipped";

// A tenant's file name in the agent's marker directories ("176-acme.db"):
// its main file's path with the bucket's slash made a dash.
std::string MarkerName(const FleetFile& main);

// The agent's bound on captured commits the destination has not taken,
// shared by every tenant's Capture: in memory up to `memory_bytes`, then in
// spill files up to `spill_bytes` and no further than `spill_room` says the
// backing volume can spare. Bytes are those of the pages written (memory)
// and of the spill records (disk).
//
// Thread-safety: atomics; any thread.
class CaptureBudget {
 public:
  // `spill_room`: bytes the backing volume can give spill files now, beyond
  // what they hold (its free space less the applications' reserve); nullopt
  // when unknown. Unset: only `spill_bytes` bounds them.
  CaptureBudget(std::uint64_t memory_bytes, std::uint64_t spill_bytes,
                std::function<std::optional<std::uint64_t>()> spill_room = nullptr)
      : memory_limit_(memory_bytes), spill_limit_(spill_bytes), spill_room_(std::move(spill_room)) {}

  // True when `n` more bytes fit in memory (they are then held).
  bool TakeMemory(std::uint64_t n);
  // Held whatever the bound: what must stay in memory (a segment that can
  // neither land nor be spooled, transactions handed back).
  void ForceMemory(std::uint64_t n);
  void ReleaseMemory(std::uint64_t n) { memory_used_ -= n; }
  // True when `n` more bytes fit on disk (they are then held).
  bool TakeSpill(std::uint64_t n);
  void ReleaseSpill(std::uint64_t n) { spill_used_ -= n; }

  // The most one Take hands the shipper: a quarter of the memory bound,
  // within [64 KiB, 64 MiB], so a segment being built or uploaded adds
  // little to it, and a backlog drains in objects of a sensible size.
  std::uint64_t take_bytes() const;

  std::uint64_t memory_limit() const { return memory_limit_; }
  std::uint64_t spill_limit() const { return spill_limit_; }
  std::uint64_t memory_used() const { return memory_used_.load(); }
  std::uint64_t memory_peak() const { return memory_peak_.load(); }
  std::uint64_t spill_used() const { return spill_used_.load(); }
  std::uint64_t spill_peak() const { return spill_peak_.load(); }

  // Counted by the captures.
  std::atomic<std::uint64_t> spilled{0};  // transactions written to spill files
  std::atomic<std::uint64_t> drops{0};    // times a tenant's captured commits were dropped
  // Transactions larger than a capture holds (max_txn_bytes), shipped in
  // snapshots instead.
  std::atomic<std::uint64_t> oversized{0};
  // Set from the first spill until shipping drains every spill file: the
  // first of an episode is logged, once for the agent.
  std::atomic<bool> spilling{false};

 private:
  void NotePeak(std::atomic<std::uint64_t>& peak, std::uint64_t now);

  const std::uint64_t memory_limit_;
  const std::uint64_t spill_limit_;
  const std::function<std::optional<std::uint64_t>()> spill_room_;
  std::atomic<std::uint64_t> memory_used_{0};
  std::atomic<std::uint64_t> memory_peak_{0};
  std::atomic<std::uint64_t> spill_used_{0};
  std::atomic<std::uint64_t> spill_peak_{0};
};

struct CaptureOptions {
  int root = -1;                    // the backing directory; must outlive the capture
  const WallClock* wall = nullptr;  // commit times; must outlive the capture
  // Shared by every tenant of the agent. Unset: a budget of the capture's
  // own, 256 MiB in memory and no spill.
  std::shared_ptr<CaptureBudget> budget;
  // Called once per capture that failed (each forces a snapshot), with the
  // capture's lock held: it must only count.
  std::function<void()> on_failure;
  // Called when the tenant may have something to ship that the shipper has
  // not looked at (a write, a gap, a mark), once until the shipper's next
  // ClearActive, with the capture's lock held: it must only record. The
  // shipper visits only such tenants, so its work follows the writes, not
  // the tenants ever seen.
  std::function<void()> on_active;
  // The most one transaction's pages may take in memory while it is read.
  // A larger one (a bulk load, a VACUUM) is not held: it is counted
  // (on_failure is not called) and the next shipment is a snapshot, which
  // reads the file as it copies.
  std::uint64_t max_txn_bytes = 64ull << 20;
};

// What the shipper reads at the start of a round, in one look.
struct CaptureScan {
  bool has_captured = false;  // transactions wait to be taken
  bool gap = false;           // the next shipment must be a snapshot
  bool unshipped = false;     // the tenant's unshipped marker is set
  bool unshippable = false;   // journal mode OFF or MEMORY: nothing of it may ship
  bool quiet = false;         // nothing was written since the previous Scan
  std::uint64_t writes = 0;   // changes seen, as of this scan
};

class Capture final : public TenantWatch {
 public:
  class SnapshotHold;

  // Reads what is on disk now: a WAL in use, or a hot journal left by a crash.
  Capture(CaptureOptions options, FleetFile main);
  // Gives back to the budget what it holds, and removes its spill file.
  ~Capture() override;
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  // TenantWatch: before a change reaches the main file, -wal or -journal.
  WriteGuard BeforeWrite(FileRole role, std::uint64_t offset, const char* data,
                         std::size_t size) override;
  WriteGuard BeforeTruncate(FileRole role, std::uint64_t size) override;
  WriteGuard BeforeUnlink(FileRole role) override;

  const FleetFile& main() const { return main_; }

  // ---- for the shipper ----

  // Reads the WAL's commits not yet captured, then looks at the state once.
  CaptureScan Scan();
  // A round that found nothing to ship: forgets commit frames whose chain
  // never became valid when nothing was written for a whole round (a writer
  // that died mid-commit), and removes the unshipped marker when nothing is
  // pending. True when nothing is left to ship.
  bool SettleIdle(const CaptureScan& scan);
  // After a shipment: removes the marker when nothing is pending and nothing
  // was written since `scan`. True when nothing is left to ship.
  bool SettleShipped(const CaptureScan& scan);
  // True when Take would return something.
  bool HasShippable();
  // Takes, oldest first, the captured transactions that may go into the
  // current generation (none captured after a gap), from memory then from
  // the spill file, about budget take_bytes() at most (at least one). They
  // are the caller's now, out of the budget; the lag still counts them until
  // Shipped or Return.
  std::vector<Txn> Take();
  // They cannot ship as taken: back in front, in order (held in memory).
  void Return(std::vector<Txn> txns);
  // Bytes captured and not taken, in memory and spilled.
  std::uint64_t captured_bytes();
  // Their upload landed.
  void Shipped();
  // The next shipment must be a snapshot, and nothing captured so far goes
  // into the current generation.
  void MarkGap();
  // A snapshot copied when the gap count was `gap_mark` is at the
  // destination: the gap is filled, unless another was marked since.
  void ClearGap(std::uint64_t gap_mark);
  // An earlier run left this tenant's marker: it has commits not yet shipped.
  void MarkUnshipped();
  // The tenant was deleted: what is captured is dropped, the marker removed.
  void Drop();
  // The main file was replaced (a restore): everything is forgotten, and the
  // next shipment is a snapshot.
  void Reset();
  // The shipper looks at the tenant now: the next change calls on_active
  // again. Called before its Scan, so a change during the visit is never
  // taken for one it saw.
  void ClearActive() { active_.store(false); }
  // Waits (at most `journal_wait`) for an open transaction to end, then holds
  // the write gate alone and captures the WAL: the tenant's files do not
  // change until the hold ends. kFailedPrecondition when a transaction stays
  // open or the tenant is unshippable.
  Result<SnapshotHold> HoldForSnapshot(Millis journal_wait);

  // Read without a lock.
  // Since captured commits were dropped (both bounds full) until the
  // snapshot that fills the gap ships: the main file's size then, the
  // snapshot the tenant needs; 0 otherwise.
  std::uint64_t dropped_bytes() const { return dropped_bytes_pub_.load(); }
  bool unshipped() const { return unshipped_.load(); }
  bool unshippable() const { return unshippable_pub_.load(); }
  WallMs oldest_pending_ms() const { return oldest_pending_ms_.load(); }

 private:
  void NoteWriteLocked();
  // Tells the shipper (on_active) once per visit that there is something to
  // look at. Needs no lock.
  void FlagActive();
  // Counts commits handed to an upload (or a snapshot) in the lag.
  void NoteTakenLocked(const std::vector<Txn>& txns);
  // A commit of `ms` (0: unknown) is in an upload or snapshot not yet landed.
  void NoteOlderTakenLocked(WallMs ms);
  void NoteInSnapshotLocked(WallMs ms);
  void PublishLocked();
  void CaptureFailedLocked(std::string_view what, const std::string& why);
  void MarkGapLocked(std::size_t keep);
  void OversizedLocked(WallMs commit_ms);
  // A commit seen with a journal or a WAL: an unshippable tenant ships again.
  void CommittedWithJournalLocked();
  // Pushes the transactions a WAL read gave (under capture_mu_); takes mu_.
  void PushCommitted(std::vector<wal::CommittedTxn> txns);
  void RemoveMarkerLocked();
  void LearnWalPageSize();
  void PushLocked(Txn txn);
  // Both bounds are full when `incoming` comes: what is captured goes with
  // it, and a gap is marked.
  void DropCapturedLocked(const Txn& incoming);
  // Forgets everything captured (memory and spill), releasing the budget.
  void ClearCapturedLocked();
  std::size_t CountLocked() const { return captured_.size() + spill_.size(); }
  void CaptureWal();
  void FinishJournalLocked();
  // A main-file write at `offset` with no hot journal and no WAL.
  void UnjournaledWriteLocked(std::uint64_t offset, const char* data, std::size_t size);
  bool InWalMode(std::uint64_t offset, const char* data, std::size_t size) const;

  const CaptureOptions o_;
  const FleetFile main_;
  const std::shared_ptr<CaptureBudget> budget_;  // o_.budget, or the capture's own
  WriteGate gate_;
  std::mutex capture_mu_;  // serializes reading the WAL; guards cursor_
  wal::WalCursor cursor_;

  std::mutex mu_;               // guards everything below
  std::condition_variable cv_;  // journal_hot_ and want_snapshot_ changes
  std::uint32_t wal_page_size_ = 0;
  std::map<std::uint64_t, WallMs> commit_seen_;  // commit frame offset -> first seen
  bool wal_exists_ = false;
  bool journal_hot_ = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> dirty_;
  bool want_snapshot_ = false;
  // Captured, oldest first: captured_ (in memory, charged to the budget),
  // then spill_ (once anything is spilled, every later commit is too, until
  // it empties, so commit order holds).
  std::deque<Txn> captured_;
  std::uint64_t captured_bytes_ = 0;  // of captured_
  SpillFile spill_;
  // Captured commits were dropped and the snapshot that fills the gap has
  // not shipped: logged once per such episode.
  bool drop_episode_ = false;
  bool need_generation_ = true;
  WallMs unshipped_since_ms_ = 0;  // the first write not yet shipped; 0 when all is
  // The oldest commit of those Take handed to an upload that has not landed
  // (0: none): a crash would lose them too, so the lag counts them.
  WallMs taken_oldest_ms_ = 0;
  // The oldest commit that only the snapshot waiting to land holds (one a
  // snapshot hold forgot, or could not read back from the spill): the
  // segment ahead of that snapshot landing (Shipped) does not ship it; its
  // snapshot landing (ClearGap) or a gap (which folds it in) does.
  WallMs snapshot_oldest_ms_ = 0;
  // While a gap is open: how many of captured_ (from the front) may still go
  // into the current generation; SIZE_MAX when no gap limits them.
  std::size_t shippable_ = SIZE_MAX;
  std::uint64_t gaps_ = 0;  // gaps marked so far
  bool unshippable_ = false;
  bool marker_present_ = false;
  bool dropped_ = false;  // deleted: its writes are no longer the tenant's
  std::uint64_t writes_seen_ = 0;
  std::uint64_t writes_last_scan_ = 0;
  std::atomic<bool> active_{false};  // on_active was called since ClearActive
  std::atomic<bool> dropped_pub_{false};  // dropped_, for the gate's landed hook

  // Published under mu_, read without it.
  std::atomic<bool> unshipped_{false};         // marker_present_
  std::atomic<bool> unshippable_pub_{false};   // unshippable_
  std::atomic<WallMs> oldest_pending_ms_{0};   // oldest commit not yet shipped; 0: none
  std::atomic<std::uint64_t> dropped_bytes_pub_{0};
};

// The write gate held alone, and the WAL cursor: nothing of the tenant
// changes until it is destroyed. Move-only.
class Capture::SnapshotHold {
 public:
  SnapshotHold(SnapshotHold&& other) noexcept;
  SnapshotHold& operator=(SnapshotHold&&) = delete;
  ~SnapshotHold();

  // Bytes captured up to now (in memory and spilled).
  std::uint64_t CapturedBytes();
  // A gap is open (marked before or during the hold's own capture): what
  // is captured may not follow the log's last object as a segment.
  bool GapOpen();
  // Everything captured up to now, oldest first: the snapshot covers it.
  // Reads the spill file whole: only for a backlog known to be small.
  std::vector<Txn> TakeCaptured();
  // Everything captured up to now is forgotten (the snapshot covers it);
  // returns the commit times, oldest first.
  std::vector<WallMs> ForgetCaptured();
  // The copy could not read what it needed: a capture failure (a gap).
  void CaptureFailed();
  // The gap count at this hold, for ClearGap once the copy is shipped.
  std::uint64_t gap_mark() const { return gap_mark_; }

 private:
  friend class Capture;
  SnapshotHold(Capture* c, std::unique_lock<std::mutex> capture, std::uint64_t gap_mark)
      : c_(c), capture_(std::move(capture)), gap_mark_(gap_mark) {}
  Capture* c_;
  std::unique_lock<std::mutex> capture_;
  std::uint64_t gap_mark_;
};

}  // namespace fleetfs::replica
