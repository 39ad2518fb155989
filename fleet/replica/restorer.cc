// The prepare work: what a Preparer's job runs (fleet/replica/preparer.h
// schedules it) to check a main file against its key's log before the mount
// exposes it, and to restore it in place when the log is newer; staleness is
// read from the file's epoch stamp. Replicator::Impl and the types it keeps
// are in fleet/replica/replicator_impl.h.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"
#include "fleet/replica/replicator_impl.h"
#include "fleet/slot.h"

namespace fleetfs::replica {

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
  const auto took = o_.mono->Now() - started;
  counters_.restore_time.Observe(std::chrono::duration_cast<std::chrono::nanoseconds>(took));
  auto ms = std::chrono::duration_cast<Millis>(took).count();
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
  t->log().Forget();
}

void Replicator::Impl::Warm(Slot first, Slot last, std::uint64_t epoch) {
  preparer_.Warm(first, last, epoch);
}

}  // namespace fleetfs::replica
