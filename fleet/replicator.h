// Replicator: ships every served tenant's commits to the replica destination,
// and prepares main files before the mount exposes them (DESIGN sections 4-5).
//
// Capture (fleet/replica/capture.h). The mount calls the TenantWatch hooks
// before a change reaches a backing file; each tenant's Capture turns them
// into committed transactions (WAL frames read at the last moment they can
// be, journaled commits read back when the journal ends), held until the
// shipper takes them; a commit waits at most for that local copy. They are
// held in memory up to one bound for the whole agent (capture_memory_bytes),
// beyond it in per-tenant spill files under BACKING/.fleetfs/spill/ up to a
// second (capture_spill_bytes, and what the volume can spare); beyond both a
// tenant's are dropped and it needs a full snapshot, which Stats reports
// (issue 10 item 11). A segment whose upload failed waits in a spool file,
// not in memory.
// A tenant whose journal mode leaves no trace of a transaction's end (OFF,
// MEMORY) is not shipped at all until it commits with a journal or WAL again.
//
// Shipping. One thread, every sync interval: per tenant with something to
// ship, a pure decision (fleet/replica/ship_decision.h) over its state, the
// epoch served and its key's log, carried out and asked again. Each key has
// one create-only log (fleet/replica/log_writer.h): under a new epoch the
// file is checked against the log, a marker is written at the next
// sequence, then a snapshot; after it, one segment per round of what was
// captured. No listing precedes an upload: an old owner's next create finds
// its sequence taken by a newer marker, and that object's epoch stops the
// tenant and calls on_newer_epoch, which drops the range through the fence
// floor. A snapshot holds the tenant's write gate while it copies to a local
// spool file, so the writes that would change it wait; the upload happens
// after. An object whose create got no answer is retried byte for byte.
//
// Deletes. A delete through the mount is recorded under
// BACKING/.fleetfs/deleted/ and ships as a tombstone in the key's log; until
// then the key answers absent unless the log shows a newer owner's objects
// after the delete.
//
// Prepare (fleet/replica/preparer.h). Lookups of main files are prepared on
// worker threads, one flight per key and epoch however many lookups wait (a
// lookup at a newer epoch never joins an older epoch's flight, and a flight
// answers 0, raises a stamp or publishes a restore only while its epoch is
// served); a warm-up after a claim restores a range's tenants in the
// background a few at a time, behind lookups. A key
// missing here costs one listing of the replica and creates nothing unless
// there is something to restore; its absence is remembered for the epoch (at
// one epoch only this host writes the key's replica), so a repeated lookup
// of an absent name is answered without a job. A restore is built in an
// unnamed spool file and published only while its epoch is still served,
// checked again immediately before the link that publishes it.
//
// A tenant with commits not yet shipped has a marker under
// BACKING/.fleetfs/unshipped/, so an agent that restarts after a crash ships
// them (from a snapshot) even if nobody writes again.
//
// The implementation: Replicator::Impl in fleet/replica/replicator_impl.h;
// start, stop, the hooks and the figures in fleet/replicator.cc; shipping in
// fleet/replica/shipper.cc; the prepare work in fleet/replica/restorer.cc.
//
// Thread-safety: every public method is safe from any thread. Stats() and
// LagSeconds() read counters and numbers each tenant publishes, under no lock
// that I/O can hold, so the agent's loop may call them during a snapshot.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "fleet/histogram.h"
#include "fleet/layout.h"
#include "fleet/replica/destination.h"
#include "fleet/status.h"
#include "fleet/tenant_hooks.h"

namespace fleetfs::replica {

struct ReplicatorOptions {
  std::string backing;  // absolute path of the backing directory
  FleetMode mode = FleetMode::kTenant;
  std::shared_ptr<Destination> destination;
  const WallClock* wall = nullptr;       // must outlive the replicator
  const MonotonicClock* mono = nullptr;  // must outlive the replicator
  Millis sync_interval{1000};
  Millis snapshot_interval{3600 * 1000};
  Millis retention{72 * 3600 * 1000};
  int prepare_threads = 4;
  int warm_parallel = 2;
  // Keys remembered as absent from the replica (least recently used go first).
  std::size_t absent_keys = 65536;
  // Lookups' prepare flights at once (queued or running; warm-ups apart).
  // Beyond it a lookup of another key is answered EAGAIN at once: never 0,
  // whose "absent" could make an application create an empty database over
  // a replica. Bounds the queue a flood of distinct absent names can build
  // ahead of real first opens.
  std::size_t max_lookup_flights = 4096;
  // Free bytes on the backing volume; nullopt when unknown. Default: statvfs.
  std::function<std::optional<std::uint64_t>()> backing_free_bytes;
  // A snapshot is staged on the backing volume only if this much stays free
  // for the applications after it; 0: 5% of the volume, at least 4 MiB and
  // at most 1 GiB. A snapshot that would eat into it waits, and says why.
  std::uint64_t spool_reserve_bytes = 0;
  // Captured commits the destination has not taken, held in memory for all
  // tenants together; beyond it they spill to disk. The segment being built
  // or uploaded (a quarter of it at most, taken out of it) comes on top.
  std::uint64_t capture_memory_bytes = 256ull << 20;
  // Spilled commits (and segments waiting for a retry) on the backing
  // volume, for all tenants together; never more than the volume can spare
  // while keeping the spool's reserve. Beyond it (and the memory bound) a
  // tenant's captured commits are dropped: it needs a full snapshot. 0: no
  // spill.
  std::uint64_t capture_spill_bytes = 4ull << 30;
  // The most one transaction's pages are held while it is captured; a larger
  // one ships in a snapshot read from the file (CaptureOptions).
  std::uint64_t max_txn_bytes = 64ull << 20;
  // The epoch this host serves `slot` at now, if it serves it; nullopt once
  // the local lease has ended (the agent answers from its refresher, which
  // reads the monotonic clock). Asked again right before a restore publishes.
  std::function<std::optional<std::uint64_t>(Slot)> serving_epoch;
  // The destination holds a newer epoch of a tenant in `slot`.
  std::function<void(Slot slot, std::uint64_t newer)> on_newer_epoch;
  // The highest epoch the ownership store ever granted (its counter). An
  // object of a key's log above it is corruption, never a fence; read at
  // start and again only when an object claims a higher epoch. Unset: no
  // epoch is judged forged (tests; the agent always sets it).
  std::function<Result<std::uint64_t>()> epoch_ceiling;
};

struct ReplicationStats {
  std::uint64_t txns_shipped = 0;
  std::uint64_t bytes_shipped = 0;
  std::uint64_t snapshots = 0;
  std::uint64_t segments = 0;
  std::uint64_t upload_failures = 0;
  std::uint64_t restores = 0;
  std::uint64_t restore_failures = 0;
  std::uint64_t stale_replaced = 0;
  std::uint64_t tombstones = 0;
  std::uint64_t newer_epochs = 0;
  std::uint64_t warm_queued = 0;
  std::uint64_t capture_failures = 0;  // captures that could not read; each forces a snapshot
  std::uint64_t absent_listed = 0;     // lookups of keys missing here that listed the replica
  std::uint64_t prepares_refused = 0;  // lookups answered EAGAIN: too many flights at once
  // Restarts whose file was the log's newest data: segments continued the
  // log with no snapshot (issue 10 item 12).
  std::uint64_t continued = 0;
  std::size_t tenants = 0;  // every tenant seen since the start
  // Tenants the shipper visits each round (written, or with something left
  // to ship), and visits made: a round's work follows these, not `tenants`.
  std::size_t active_tenants = 0;
  std::uint64_t tenant_visits = 0;
  std::size_t unshipped_tenants = 0;
  // Tenants written with journal_mode OFF or MEMORY (no journal on disk, not
  // in WAL mode): nothing of them ships until they commit with a journal or
  // WAL again, then from a fresh snapshot. One of them, named.
  std::size_t unshippable_tenants = 0;
  std::string unshippable_example;
  std::string failing;  // the last upload error while uploads fail; empty when they work
  // Why a snapshot could not be staged on the backing volume (too little
  // room left for the applications); empty when snapshots stage.
  std::string staging_blocked;
  // Captured commits held now (memory: page bytes; spill: file bytes), the
  // most held in memory at once, and the bounds.
  std::uint64_t capture_memory_bytes = 0;
  std::uint64_t capture_memory_peak = 0;
  std::uint64_t capture_memory_limit = 0;
  std::uint64_t capture_spill_bytes = 0;
  std::uint64_t capture_spill_limit = 0;
  std::uint64_t capture_spilled = 0;  // transactions written to spill files
  // Times a tenant's captured commits were dropped because both bounds were
  // full (each makes it need a full snapshot).
  std::uint64_t dropped_to_snapshot = 0;
  // Transactions larger than max_txn_bytes, shipped in snapshots instead.
  std::uint64_t oversized_transactions = 0;
  // Tenants that need a full snapshot because their captured commits were
  // dropped, until it ships; the largest of them, and its size (what the
  // destination must take in one object before it is replicated again).
  std::size_t snapshot_needed_tenants = 0;
  std::string snapshot_needed_largest;
  std::uint64_t snapshot_needed_bytes = 0;
  // Restores published, by how long each took (download, replay, publish).
  HistogramSnapshot restore_time;
  double lag_p50_s = 0;  // commit to shipped, over the last shipped commits
  double lag_p99_s = 0;
};

// What the replicator knows of one tenant now, for `fleetfs ls` and
// `fleetfs inspect`: its newest data object this agent shipped (since it
// started) and its oldest commit not yet shipped.
struct TenantReplication {
  std::string main_path;
  std::uint64_t shipped_seq = 0;  // 0: nothing shipped by this agent
  WallMs shipped_ms = 0;          // when it landed; 0 when unknown
  WallMs pending_since_ms = 0;    // oldest commit not yet shipped; 0: none
  bool unshippable = false;       // journal mode OFF or MEMORY (see Capture)
};

class Replicator final : public TenantHooks {
 public:
  static Result<std::unique_ptr<Replicator>> Start(ReplicatorOptions options);
  ~Replicator() override;

  std::shared_ptr<TenantWatch> Watch(const FleetFile& file, std::uint64_t epoch) override;
  void Prepare(const FleetFile& main, std::uint64_t epoch,
               std::function<void(int err)> done) override;
  void WillDelete(const FleetFile& main, std::uint64_t epoch) override;
  void Deleted(const FleetFile& main, std::uint64_t epoch) override;

  // Restores in the background the tenants of [first, last] that the replica
  // holds and that are missing or stale here.
  void Warm(Slot first, Slot last, std::uint64_t epoch);
  // Captures and ships everything now; true when no tenant at all (served
  // now or not) has commits left unshipped. Blocks until done or `deadline`
  // (at least one pass).
  bool Flush(MonoTime deadline);
  // The same for the tenants of [first, last] only (a handoff of one range
  // while others are written): true when none of them has a commit or a
  // tombstone left unshipped.
  bool FlushRange(MonoTime deadline, Slot first, Slot last);
  // Seconds since the oldest commit not yet shipped in [first, last]; 0 when
  // everything is shipped.
  double LagSeconds(Slot first, Slot last) const;
  ReplicationStats Stats() const;
  // The active tenants (written, or with something left to ship) and those
  // of `also` (the agent's tenants with open handles) that replication
  // knows; sorted by path, one entry each. Its size follows those tenants,
  // never every tenant shipped since the start: tenants_mu_ is held only to
  // copy their pointers, as every open takes it too.
  std::vector<TenantReplication> TenantStates(const std::vector<std::string>& also = {}) const;
  void Stop();

  class Impl;

 private:
  explicit Replicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fleetfs::replica
