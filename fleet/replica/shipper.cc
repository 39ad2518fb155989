// The shipper: the upload thread and its rounds, carrying out each tenant's
// ShipDecision (fleet/replica/ship_decision.h): segments, snapshots staged
// in the spool and their room, retention, tombstones, and the key's log
// (takeovers, markers, what a refused create means). Replicator::Impl and
// the types it keeps are in fleet/replica/replicator_impl.h.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>

#include "fleet/fd_io.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"
#include "fleet/replica/replicator_impl.h"
#include "fleet/replica/ship_decision.h"
#include "fleet/wal_format.h"

namespace fleetfs::replica {
namespace {

// Whether `slot` is one a round limited to `only` works (every slot without).
bool InOnly(const std::optional<std::pair<Slot, Slot>>& only, Slot slot) {
  return !only || (slot >= only->first && slot <= only->second);
}

}  // namespace

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

bool Replicator::Impl::Round(std::optional<std::pair<Slot, Slot>> only) {
  const std::uint64_t failures_before = failures_seen_.load();
  // A range's flush ships that range's tombstones only: another range's
  // (a slow or failing replica for its keys) must not spend the deadline of
  // a handoff it has no part in.
  UploadTombstones(only);
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
  if (only) {
    // A range's flush works only that range's tenants, so a backlog
    // elsewhere cannot run out its deadline. The others stay active for the
    // loop's round (a deleted one too: its slot is not known here).
    std::erase_if(
        visits, [&](const Visit& v) { return !v.tenant || !InOnly(only, v.tenant->main().slot); });
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
    clean = clean && std::none_of(tombstones_.begin(), tombstones_.end(),
                                  [&](const Tombstone& t) { return InOnly(only, t.main.slot); });
  }
  // A failure is cleared by a round in which nothing that reached the
  // destination failed: not by another tenant's upload that landed (one
  // key's directory may fail every round while the others work), and never
  // by a probe (a full disk takes an empty probe file and refuses every real
  // object; clearing on the probe made /health flap every round).
  // A range's round saw only some tenants: it says nothing of the others'.
  if (!only && failures_seen_.load() == failures_before) RecordSuccess();
  return clean;
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
void Replicator::Impl::UploadTombstones(std::optional<std::pair<Slot, Slot>> only) {
  std::vector<Tombstone> todo;
  {
    std::lock_guard lock(tenants_mu_);
    for (const Tombstone& t : tombstones_) {
      if (InOnly(only, t.main.slot)) todo.push_back(t);
    }
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
  k.shown_seq = stamp->seq;  // when it landed is not known
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
  k.Landed(out.seq, k.writer.position().prev, NowMs());
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
  k.Landed(out.seq, k.writer.position().prev, NowMs());
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
  if (!k.pending_segment && k.pending_snapshot.valid()) {
    // A snapshot staged after the last object (a periodic one whose
    // segment landed, a backlog written during the outage since) lands
    // first: a segment taken now would take the sequence the snapshot is
    // encoded at, and the log would refuse the snapshot every round after.
    return AppendPendingSnapshot(k, t.main(), &t.capture());
  }
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
    k.pending_owner = t.capture_;
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
    k.Forget();
  }
  const FleetFile& main = t.main();
  std::optional<std::uint64_t> serving;
  {
    std::lock_guard lock(t.mu_);
    if (t.deleted_) return true;  // its tombstone is shipped on its own
    if (!o_.serving_epoch && t.epoch_ != 0) serving = t.epoch_;
  }
  if (o_.serving_epoch) serving = o_.serving_epoch(main.slot);
  if ((k.pending_segment || k.pending_snapshot.valid()) && !k.PendingOf(t.capture_)) {
    if (!snapshots && k.pending_snapshot.valid()) {
      // A whole database's upload: after every tenant's segments.
      if (deferred) *deferred = true;
      return false;
    }
    // Taken from a file since deleted (the tenant was made again before its
    // tombstone shipped). They may have landed already, so they are retried
    // byte for byte, as that file's history; but none is this file's base
    // (a segment of its commits after the old snapshot would restore a
    // database that never was), and no mark of that capture's applies to
    // this one: its own snapshot goes next.
    Status st = AppendPendingSegment(k, main, nullptr);
    if (st.ok()) st = AppendPendingSnapshot(k, main, nullptr);
    k.base = false;
    k.Forget();
    if (st.code() == Code::kFailedPrecondition) return false;
    if (!st.ok()) {
      RecordFailure(st.WithContext("shipping what " + main.main_path + " held before its delete"));
      return false;
    }
  }
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
        if (!snapshots && !k.pending_segment && k.pending_snapshot.valid()) {
          // ShipSegment would land the staged snapshot first (a whole
          // database's upload): after every tenant's segments, like any
          // other snapshot.
          if (deferred) *deferred = true;
          return false;
        }
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
  // A gap opened since the round chose a periodic snapshot (the hold's own
  // capture met a transaction too large to hold, or a WAL restart captured
  // one meanwhile): what is captured no longer follows the log's last
  // object as a segment, so the snapshot covers all of it.
  if (periodic && hold.GapOpen()) periodic = false;
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
  // Where the newest committed version of each page is in the log: read
  // from it as the copy goes, so a log of any size (a bulk load) is never
  // held in memory.
  wal::CommittedIndex overlay;
  UniqueFd walfd(::openat(root_.get(), (t.main().main_path + "-wal").c_str(), O_RDONLY | O_CLOEXEC));
  if (!walfd.valid() && errno != ENOENT) {
    // Without the log's commits the copy would not be the committed state.
    Status s = ErrnoStatus("opening the WAL of " + t.main().main_path + " for a snapshot", errno);
    hold.CaptureFailed();
    return s;
  }
  if (walfd.valid()) {
    auto index = wal::IndexCommitted(walfd.get());
    if (!index.ok()) {
      Status s = index.status().WithContext("reading the WAL of " + t.main().main_path +
                                            " for a snapshot");
      hold.CaptureFailed();
      return s;
    }
    overlay = std::move(*index);
    if (overlay.db_pages != 0) {
      // SQLite writes every page a database grows by into the log, so the
      // size its last commit names is at most the file and the log's frames
      // together (SQLite's own checkpoint calls more corruption, with 64 KiB
      // of slack). More was written by hand (a terabyte of zeros copied would
      // stall every tenant's shipping): refused, never copied, and a gap
      // marked (what was taken for a segment ahead of it is in the file).
      const std::uint64_t limit =
          db_size + 65536 + overlay.committed_frames * std::uint64_t{overlay.page_size};
      if (std::uint64_t{overlay.db_pages} * overlay.page_size > limit) {
        hold.CaptureFailed();
        return Status(Code::kDataLoss,
                      "the WAL of " + t.main().main_path + " says the database has " +
                          std::to_string(overlay.db_pages) + " pages of " +
                          std::to_string(overlay.page_size) + " bytes after its last commit, " +
                          "more than the file and the log hold (" + std::to_string(limit) +
                          " bytes); it is not a log SQLite wrote, and no snapshot is taken of it");
      }
      db_size = std::uint64_t{overlay.db_pages} * overlay.page_size;
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
  const std::uint64_t page = overlay.page_size;
  int overlay_errno = 0;  // a page of the log that could not be read
  auto sum = WriteLogSnapshot(
      main.get(), db_size, at, NowMs(), owner,
      [&](std::uint64_t off, char* buf, std::size_t n) {
        if (overlay.pages.empty() || page == 0 || overlay_errno != 0) return;
        for (std::uint64_t p = off / page; p * page < off + n; ++p) {
          auto it = overlay.pages.find(static_cast<std::uint32_t>(p + 1));
          if (it != overlay.pages.end() && p * page >= off) {
            const std::size_t len = std::min<std::uint64_t>(page, off + n - p * page);
            const ssize_t got =
                ::pread(walfd.get(), buf + (p * page - off), len, static_cast<off_t>(it->second));
            if (got != static_cast<ssize_t>(len)) {
              overlay_errno = got < 0 ? errno : EIO;  // short: the log shrank under the hold
              return;
            }
          }
        }
      },
      out.get());
  if (sum.ok() && overlay_errno != 0) {
    // The copy is not the committed state: not shipped.
    Status s = ErrnoStatus("reading the WAL of " + t.main().main_path + " for a snapshot",
                           overlay_errno);
    hold.CaptureFailed();
    return s;
  }
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
  k.pending_owner = t.capture_;
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

bool Replicator::Impl::RangeShipped(Slot first, Slot last) const {
  std::vector<std::shared_ptr<Tenant>> in_range;
  {
    std::lock_guard lock(tenants_mu_);
    for (const Tombstone& t : tombstones_) {
      if (t.main.slot >= first && t.main.slot <= last) return false;
    }
    for (const auto& [path, tenant] : tenants_) {
      if (tenant->main().slot >= first && tenant->main().slot <= last) in_range.push_back(tenant);
    }
  }
  for (const auto& tenant : in_range) {
    const Capture& c = tenant->capture();
    if (c.unshipped() || c.oldest_pending_ms() != 0 || c.dropped_bytes() != 0) return false;
  }
  return true;
}

bool Replicator::Impl::FlushRange(MonoTime deadline, Slot first, Slot last) {
  while (true) {
    // Only this range's tenants are worked and must be clean (others may go
    // on being written, or hold a backlog, meanwhile).
    if (Round(std::pair{first, last}) || RangeShipped(first, last)) return true;
    if (o_.mono->Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace fleetfs::replica
