#include "fleet/replicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fleet/replica/log_names.h"
#include "fleet/replica/replicator_impl.h"
#include "fleet/replica/spill_file.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {

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
  {
    auto log = LogFor(main);
    log->stale_base = true;  // a tenant made again starts from a snapshot
    // Shown no more: the file it described is gone (last_data is the
    // shipper's, under the log's mu; the next round drops it).
    log->shown_seq = 0;
    log->shown_ms = 0;
  }
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

// ---- the active tenants ----

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

std::vector<TenantReplication> Replicator::Impl::TenantStates(
    const std::vector<std::string>& also) const {
  std::vector<std::string> paths;
  {
    std::lock_guard lock(active_mu_);
    paths.reserve(active_.size() + also.size());
    for (const auto& [path, n] : active_) paths.push_back(path);
  }
  paths.insert(paths.end(), also.begin(), also.end());
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  std::vector<std::pair<std::shared_ptr<Tenant>, std::shared_ptr<KeyLog>>> found(paths.size());
  {
    std::lock_guard lock(tenants_mu_);
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (auto it = tenants_.find(paths[i]); it != tenants_.end()) found[i].first = it->second;
      if (auto it = logs_.find(paths[i]); it != logs_.end()) found[i].second = it->second;
    }
  }
  std::vector<TenantReplication> out;
  out.reserve(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const auto& [t, log] = found[i];
    if (!t && !log) continue;
    TenantReplication r{paths[i], 0, 0, 0, false};
    if (log) {
      r.shipped_seq = log->shown_seq.load();
      r.shipped_ms = r.shipped_seq != 0 ? log->shown_ms.load() : 0;
    }
    if (t) {
      r.pending_since_ms = t->capture().oldest_pending_ms();
      r.unshippable = t->capture().unshippable();
    }
    out.push_back(std::move(r));
  }
  return out;
}

ReplicationStats Replicator::Impl::Stats() const {
  ReplicationStats s;
  s.txns_shipped = counters_.txns_shipped.load();
  s.bytes_shipped = counters_.bytes_shipped.load();
  s.snapshots = counters_.snapshots.load();
  s.segments = counters_.segments.load();
  s.upload_failures = counters_.upload_failures.load();
  s.restores = counters_.restores.load();
  s.restore_time = counters_.restore_time.Snapshot();
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
bool Replicator::FlushRange(MonoTime deadline, Slot first, Slot last) {
  return impl_->FlushRange(deadline, first, last);
}
double Replicator::LagSeconds(Slot first, Slot last) const { return impl_->LagSeconds(first, last); }
ReplicationStats Replicator::Stats() const { return impl_->Stats(); }
std::vector<TenantReplication> Replicator::TenantStates(const std::vector<std::string>& also) const {
  return impl_->TenantStates(also);
}
void Replicator::Stop() { impl_->Stop(); }

}  // namespace fleetfs::replica
