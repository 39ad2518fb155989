#include "fleet/replica/capture.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

// A capture without the agent's budget (tests of the capture alone).
constexpr std::uint64_t kOwnMemoryBytes = 256ull << 20;
constexpr std::uint8_t kJournalMagic[8] = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};
// Database header bytes 18 and 19 (the file format write and read versions):
// 2 in WAL mode, 1 in rollback-journal modes.
constexpr std::uint64_t kDbVersionOffset = 18;
constexpr std::uint8_t kDbVersionWal = 2;

std::uint32_t Be32(const void* p) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         b[3];
}

// Page size from a database header (bytes 16-17; 1 means 65536).
std::uint32_t DbPageSize(int fd) {
  std::uint8_t h[2];
  if (::pread(fd, h, 2, 16) != 2) return 4096;
  std::uint32_t v = (std::uint32_t{h[0]} << 8) | h[1];
  if (v == 1) return 65536;
  if (v < 512 || (v & (v - 1)) != 0) return 4096;
  return v;
}

}  // namespace

std::string MarkerName(const FleetFile& main) {
  std::string m = main.main_path;
  std::replace(m.begin(), m.end(), '/', '-');
  return m;
}

// ---- the agent's budget ----

bool CaptureBudget::TakeMemory(std::uint64_t n) {
  std::uint64_t used = memory_used_.load();
  do {
    if (used + n > memory_limit_) return false;
  } while (!memory_used_.compare_exchange_weak(used, used + n));
  NotePeak(memory_peak_, used + n);
  return true;
}

void CaptureBudget::ForceMemory(std::uint64_t n) { NotePeak(memory_peak_, memory_used_ += n); }

bool CaptureBudget::TakeSpill(std::uint64_t n) {
  // The volume's room first: it shrinks as spill files (and anything else)
  // grow, and is read at most once per record.
  if (spill_room_) {
    if (auto room = spill_room_(); room && *room < n) return false;
  }
  std::uint64_t used = spill_used_.load();
  do {
    if (used + n > spill_limit_) return false;
  } while (!spill_used_.compare_exchange_weak(used, used + n));
  NotePeak(spill_peak_, used + n);
  return true;
}

std::uint64_t CaptureBudget::take_bytes() const {
  return std::clamp<std::uint64_t>(memory_limit_ / 4, 64ull << 10, 64ull << 20);
}

void CaptureBudget::NotePeak(std::atomic<std::uint64_t>& peak, std::uint64_t now) {
  std::uint64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// ---- the capture ----

Capture::Capture(CaptureOptions options, FleetFile main)
    : o_(std::move(options)),
      main_(std::move(main)),
      budget_(o_.budget ? o_.budget : std::make_shared<CaptureBudget>(kOwnMemoryBytes, 0)),
      spill_(o_.root, std::string(kSpillDir) + "/" + MarkerName(main_)) {
  // The hooks flag the tenant before a change lands; a shipper that began
  // its visit between that and the landing may have scanned without it, so
  // the end of each write flags it again (a WAL frame is read from the file,
  // not from the hook).
  gate_.OnLanded([this] {
    if (!dropped_pub_.load()) FlagActive();
  });
  // What is on disk now: a WAL in use, or a hot journal left by a crash.
  struct stat st;
  wal_exists_ = ::fstatat(o_.root, (main_.main_path + "-wal").c_str(), &st, 0) == 0;
  UniqueFd j(::openat(o_.root, (main_.main_path + "-journal").c_str(), O_RDONLY | O_CLOEXEC));
  std::uint8_t magic[8] = {};
  journal_hot_ = j.valid() && ::pread(j.get(), magic, 8, 0) == 8 &&
                 std::memcmp(magic, kJournalMagic, 8) == 0;
}

Capture::~Capture() {
  std::lock_guard lock(mu_);
  ClearCapturedLocked();
}

// ---- the hooks ----

WriteGuard Capture::BeforeWrite(FileRole role, std::uint64_t off, const char* data,
                                std::size_t size) {
  if (role == FileRole::kJournal && off == 0 && size >= 8 &&
      std::memcmp(data, kJournalMagic, 8) == 0) {
    // A transaction begins: it waits while a snapshot is wanted, before it
    // takes the gate, so the snapshot can take the gate once it ends.
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !want_snapshot_; });
      if (!journal_hot_) dirty_.clear();
      journal_hot_ = true;
      NoteWriteLocked();
    }
    gate_.LockShared();
    return WriteGuard(&gate_, {});
  }
  gate_.LockShared();
  std::unique_lock lock(mu_);
  NoteWriteLocked();
  switch (role) {
    case FileRole::kMain:
      if (journal_hot_) {
        dirty_.emplace_back(off, size);
      } else if (!wal_exists_) {
        UnjournaledWriteLocked(off, data, size);
      }
      return WriteGuard(&gate_, {});
    case FileRole::kWal:
      wal_exists_ = true;
      if (off == 0) {
        // A new log header: a restart (or the first). The last moment to
        // capture the old log's commits; the write waits, and the capture
        // lock is held until it lands so no reader sees half of it.
        lock.unlock();
        std::unique_lock capture(capture_mu_);
        CaptureWal();
        lock.lock();
        commit_seen_.clear();  // what is left belongs to no commit
        PublishLocked();
        if (size >= wal::kHeaderSize) wal_page_size_ = Be32(data + 8);
        return WriteGuard(&gate_, std::move(capture));
      }
      if (wal_page_size_ == 0) LearnWalPageSize();
      if (wal_page_size_ != 0 && off >= wal::kHeaderSize && size >= 8 &&
          (off - wal::kHeaderSize) % (wal::kFrameHeaderSize + wal_page_size_) == 0 &&
          Be32(data + 4) != 0) {
        commit_seen_.emplace(off, o_.wall->NowMs());  // the commit time, for point-in-time
        PublishLocked();
      }
      return WriteGuard(&gate_, {});
    case FileRole::kJournal:
      if (off == 0 && size >= 8 && std::all_of(data, data + 8, [](char c) { return c == 0; })) {
        FinishJournalLocked();  // PERSIST: a zeroed header is the commit
      }
      return WriteGuard(&gate_, {});
    default:
      return WriteGuard(&gate_, {});
  }
}

WriteGuard Capture::BeforeTruncate(FileRole role, std::uint64_t size) {
  gate_.LockShared();
  if (role == FileRole::kWal) {
    std::unique_lock capture(capture_mu_);
    CaptureWal();
    std::lock_guard lock(mu_);
    NoteWriteLocked();
    if (size == 0) {
      cursor_ = {};
      commit_seen_.clear();
      PublishLocked();
    }
    return WriteGuard(&gate_, std::move(capture));
  }
  std::unique_lock lock(mu_);
  NoteWriteLocked();
  if (role == FileRole::kJournal && size == 0) FinishJournalLocked();  // TRUNCATE mode
  // A gap, counted: a continuation of the log (ClearGap of the gaps at the
  // start) must never clear it.
  if (role == FileRole::kMain && !journal_hot_ && !wal_exists_) MarkGapLocked(captured_.size());
  PublishLocked();
  return WriteGuard(&gate_, {});
}

WriteGuard Capture::BeforeUnlink(FileRole role) {
  gate_.LockShared();
  if (role == FileRole::kWal) {
    std::unique_lock capture(capture_mu_);
    CaptureWal();
    std::lock_guard lock(mu_);
    cursor_ = {};
    commit_seen_.clear();
    PublishLocked();
    wal_exists_ = false;
    wal_page_size_ = 0;
    return WriteGuard(&gate_, std::move(capture));
  }
  std::unique_lock lock(mu_);
  if (role == FileRole::kJournal) FinishJournalLocked();  // DELETE mode
  return WriteGuard(&gate_, {});
}

// ---- for the shipper ----

CaptureScan Capture::Scan() {
  {
    std::lock_guard capture(capture_mu_);
    CaptureWal();
  }
  std::lock_guard lock(mu_);
  CaptureScan s;
  s.has_captured = CountLocked() > 0;
  s.gap = need_generation_;
  s.unshipped = marker_present_;
  s.unshippable = unshippable_;
  s.writes = writes_seen_;
  s.quiet = writes_seen_ == writes_last_scan_;
  writes_last_scan_ = writes_seen_;
  return s;
}

bool Capture::SettleIdle(const CaptureScan& scan) {
  std::lock_guard lock(mu_);
  if (writes_seen_ != scan.writes) return false;  // written since the scan: another round
  if (scan.quiet && !commit_seen_.empty()) {
    // A commit frame whose chain never became valid, with no write for a
    // whole round: a writer that died mid-commit. It never commits.
    commit_seen_.clear();
    PublishLocked();
  }
  if (!journal_hot_ && commit_seen_.empty() && !need_generation_ && CountLocked() == 0) {
    RemoveMarkerLocked();
  }
  return !marker_present_ || !need_generation_;
}

bool Capture::SettleShipped(const CaptureScan& scan) {
  std::lock_guard lock(mu_);
  if (CountLocked() == 0 && !need_generation_ && writes_seen_ == scan.writes && !journal_hot_ &&
      commit_seen_.empty()) {
    RemoveMarkerLocked();
    return true;
  }
  return CountLocked() == 0 && !need_generation_;
}

bool Capture::HasShippable() {
  std::lock_guard lock(mu_);
  return CountLocked() > 0 && shippable_ > 0;
}

std::vector<Txn> Capture::Take() {
  std::lock_guard lock(mu_);
  const std::uint64_t most = budget_->take_bytes();
  const std::size_t n = std::min(CountLocked(), shippable_);
  std::vector<Txn> txns;
  std::uint64_t bytes = 0;
  while (txns.size() < n && (txns.empty() || bytes < most)) {
    if (!captured_.empty()) {
      const std::uint64_t b = captured_.front().Bytes();
      captured_bytes_ -= b;
      budget_->ReleaseMemory(b);
      bytes += b;
      txns.push_back(std::move(captured_.front()));
      captured_.pop_front();
      continue;
    }
    auto txn = spill_.Pop();
    if (!txn.ok()) {
      // What is left there is lost here (the main file still holds it): the
      // ones taken still ship, nothing after them does.
      // Their time is known without the file: the snapshot that fills the
      // gap ships them, and they are pending since then, not since now.
      NoteOlderTakenLocked(spill_.front_ms());
      budget_->ReleaseSpill(spill_.disk_bytes());
      spill_.Clear();
      if (shippable_ != SIZE_MAX) shippable_ -= txns.size();
      NoteTakenLocked(txns);  // before the gap, which folds them into its time
      CaptureFailedLocked("spilled commits", txn.status().message());
      PublishLocked();
      return txns;
    }
    bytes += txn->Bytes();
    txns.push_back(std::move(*txn));
  }
  budget_->ReleaseSpill(spill_.Trim());
  if (budget_->spill_used() == 0 && budget_->spilling.exchange(false)) {
    spdlog::info("replica: every spilled commit is taken; captured commits are held in memory "
                 "again");
  }
  if (shippable_ != SIZE_MAX) shippable_ -= txns.size();
  NoteTakenLocked(txns);
  return txns;
}

void Capture::Return(std::vector<Txn> txns) {
  std::lock_guard lock(mu_);
  for (auto it = txns.rbegin(); it != txns.rend(); ++it) {
    const std::uint64_t b = it->Bytes();
    captured_bytes_ += b;
    budget_->ForceMemory(b);  // rare (a segment that cannot be encoded), and a gap follows
    captured_.push_front(std::move(*it));
  }
  if (shippable_ != SIZE_MAX) shippable_ += txns.size();
  taken_oldest_ms_ = 0;  // captured_ holds them again
  FlagActive();
  PublishLocked();
}

std::uint64_t Capture::captured_bytes() {
  std::lock_guard lock(mu_);
  return captured_bytes_ + spill_.live_bytes();
}

void Capture::Shipped() {
  std::lock_guard lock(mu_);
  taken_oldest_ms_ = 0;
  PublishLocked();
}

void Capture::MarkGap() {
  std::lock_guard lock(mu_);
  MarkGapLocked(0);
  PublishLocked();
}

void Capture::ClearGap(std::uint64_t gap_mark) {
  std::lock_guard lock(mu_);
  if (gaps_ != gap_mark) return;  // a gap after the copy: the next shipment is a snapshot again
  // The snapshot holds every commit taken before its copy (no upload is
  // taken while a snapshot waits to land: the shipper lands it before it
  // takes another segment).
  taken_oldest_ms_ = 0;
  snapshot_oldest_ms_ = 0;
  need_generation_ = false;
  shippable_ = SIZE_MAX;  // captured after the copy: the new generation takes them
  unshipped_since_ms_ = 0;  // the next write starts it again
  if (drop_episode_) {
    drop_episode_ = false;
    dropped_bytes_pub_.store(0);
    spdlog::info("replica: {} shipped the snapshot it needed after its captured commits were "
                 "dropped; it ships segments again",
                 main_.main_path);
  }
  PublishLocked();
}

void Capture::MarkUnshipped() {
  std::lock_guard lock(mu_);
  marker_present_ = true;
  unshipped_.store(true);
  if (unshipped_since_ms_ == 0) unshipped_since_ms_ = o_.wall->NowMs();
  FlagActive();
  PublishLocked();
}

void Capture::Drop() {
  std::lock_guard lock(mu_);
  dropped_ = true;
  dropped_pub_.store(true);
  ClearCapturedLocked();
  taken_oldest_ms_ = 0;  // deleted: nothing of it ships any more
  snapshot_oldest_ms_ = 0;
  drop_episode_ = false;
  dropped_bytes_pub_.store(0);
  PublishLocked();
  RemoveMarkerLocked();
}

void Capture::Reset() {
  std::lock_guard capture(capture_mu_);
  std::lock_guard lock(mu_);
  cursor_ = {};
  commit_seen_.clear();
  ClearCapturedLocked();
  drop_episode_ = false;  // another file: what it needs is its own
  dropped_bytes_pub_.store(0);
  journal_hot_ = false;
  dirty_.clear();
  wal_exists_ = false;
  wal_page_size_ = 0;
  MarkGapLocked(0);
  unshippable_ = false;  // another file: its own writes tell its mode
  unshippable_pub_.store(false);
  cv_.notify_all();
  RemoveMarkerLocked();
}

Result<Capture::SnapshotHold> Capture::HoldForSnapshot(Millis journal_wait) {
  auto refused = [&](std::string why) {
    want_snapshot_ = false;
    cv_.notify_all();
    return Status(Code::kFailedPrecondition, std::move(why));
  };
  const std::string unshippable =
      main_.main_path + " is written with no journal on disk and not in WAL mode (journal_mode "
                        "OFF or MEMORY): a snapshot could be torn, so none is taken";
  {
    std::unique_lock lock(mu_);
    if (unshippable_) return refused(unshippable);
    want_snapshot_ = true;
    // Short: the shipping thread serves every tenant, and a hot journal left
    // by a writer that died stays hot until the next opener rolls it back.
    if (!cv_.wait_for(lock, journal_wait, [&] { return !journal_hot_; })) {
      return refused("a transaction on " + main_.main_path +
                     " is open (or its journal is hot); the snapshot waits for the next round");
    }
  }
  // Every write to the main file and its WAL waits from here until the hold
  // ends, so the copy is one consistent state.
  gate_.Lock();
  std::unique_lock capture(capture_mu_);
  CaptureWal();
  std::unique_lock lock(mu_);
  if (unshippable_) {
    // Written so between the wait and the gate.
    Status st = refused(unshippable);
    lock.unlock();
    capture.unlock();
    gate_.Unlock();
    return st;
  }
  return SnapshotHold(this, std::move(capture), gaps_);
}

Capture::SnapshotHold::SnapshotHold(SnapshotHold&& other) noexcept
    : c_(other.c_), capture_(std::move(other.capture_)), gap_mark_(other.gap_mark_) {
  other.c_ = nullptr;
}

Capture::SnapshotHold::~SnapshotHold() {
  if (c_ == nullptr) return;
  {
    std::lock_guard lock(c_->mu_);
    c_->want_snapshot_ = false;
    c_->cv_.notify_all();
  }
  capture_.unlock();
  c_->gate_.Unlock();
}

bool Capture::SnapshotHold::GapOpen() {
  std::lock_guard lock(c_->mu_);
  return c_->need_generation_ || c_->shippable_ != SIZE_MAX;
}

std::uint64_t Capture::SnapshotHold::CapturedBytes() {
  std::lock_guard lock(c_->mu_);
  return c_->captured_bytes_ + c_->spill_.live_bytes();
}

std::vector<Txn> Capture::SnapshotHold::TakeCaptured() {
  std::lock_guard lock(c_->mu_);
  std::vector<Txn> txns(std::make_move_iterator(c_->captured_.begin()),
                        std::make_move_iterator(c_->captured_.end()));
  while (!c_->spill_.empty()) {
    auto txn = c_->spill_.Pop();
    if (!txn.ok()) {
      // The snapshot covers them all the same; only the segment ahead of it
      // (a periodic snapshot's) loses the points in time after this one.
      spdlog::warn("replica: {}: {}", c_->main_.main_path, txn.status().message());
      break;
    }
    txns.push_back(std::move(*txn));
  }
  // What the spill could not give back is in the snapshot: pending until it
  // lands, from the oldest of it (its time is known without the file).
  if (!c_->spill_.empty()) c_->NoteInSnapshotLocked(c_->spill_.front_ms());
  c_->ClearCapturedLocked();
  // In the segment ahead of the snapshot (or in the snapshot): pending
  // until it lands.
  c_->NoteTakenLocked(txns);
  if (c_->shippable_ != SIZE_MAX) c_->shippable_ = 0;
  c_->PublishLocked();
  return txns;
}

std::vector<WallMs> Capture::SnapshotHold::ForgetCaptured() {
  std::lock_guard lock(c_->mu_);
  std::vector<WallMs> times;
  times.reserve(c_->CountLocked());
  for (const Txn& t : c_->captured_) times.push_back(t.commit_ms);
  if (auto spilled = c_->spill_.CommitTimes(); spilled.ok()) {
    times.insert(times.end(), spilled->begin(), spilled->end());
  } else if (!c_->spill_.empty()) {
    // Their times are lost with the file, not the commits (the snapshot
    // covers them): pending from the oldest, which is known without it.
    c_->NoteInSnapshotLocked(c_->spill_.front_ms());
  }
  c_->ClearCapturedLocked();
  // The snapshot ships them: pending until it lands (ClearGap).
  for (WallMs ms : times) c_->NoteInSnapshotLocked(ms);
  if (c_->shippable_ != SIZE_MAX) c_->shippable_ = 0;
  c_->PublishLocked();
  return times;
}

void Capture::SnapshotHold::CaptureFailed() {
  std::lock_guard lock(c_->mu_);
  c_->MarkGapLocked(c_->CountLocked());
  if (c_->o_.on_failure) c_->o_.on_failure();
}

// ---- inside ----

void Capture::NoteOlderTakenLocked(WallMs ms) {
  if (ms != 0 && (taken_oldest_ms_ == 0 || ms < taken_oldest_ms_)) taken_oldest_ms_ = ms;
}

void Capture::NoteInSnapshotLocked(WallMs ms) {
  if (ms != 0 && (snapshot_oldest_ms_ == 0 || ms < snapshot_oldest_ms_)) snapshot_oldest_ms_ = ms;
}

void Capture::NoteWriteLocked() {
  // A handle that outlived the delete (a connection's last checkpoint) writes
  // a file no longer there to ship: no marker, or every later run would try.
  if (dropped_) return;
  FlagActive();
  ++writes_seen_;
  if (unshipped_since_ms_ == 0) unshipped_since_ms_ = o_.wall->NowMs();
  if (!marker_present_) {
    std::string marker = std::string(kUnshippedMarkerDir) + "/" + MarkerName(main_);
    UniqueFd fd(::openat(o_.root, marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) spdlog::warn("replica: cannot mark {} unshipped: {}", main_.main_path, std::strerror(errno));
    marker_present_ = true;
    unshipped_.store(true);
  }
}

void Capture::FlagActive() {
  // An exchange, never a plain load first: it must see the shipper's latest
  // ClearActive.
  if (!active_.exchange(true) && o_.on_active) o_.on_active();
}

// Publishes the numbers Stats() and LagSeconds() read without mu_: called
// after every change of captured_ or commit_seen_, with mu_ held.
void Capture::PublishLocked() {
  WallMs o = 0;
  auto older = [&o](WallMs ms) {
    if (ms != 0 && (o == 0 || ms < o)) o = ms;
  };
  older(taken_oldest_ms_);
  older(snapshot_oldest_ms_);
  if (!captured_.empty()) {
    older(captured_.front().commit_ms);
  } else if (!spill_.empty()) {
    older(spill_.front_ms());
  }
  if (!commit_seen_.empty()) older(commit_seen_.begin()->second);
  // Changes that only a snapshot can ship (the first ship, a gap, a restart
  // with commits unshipped) are pending since their first write: a snapshot
  // that cannot go out must not read as a lag of 0.
  if (need_generation_ && marker_present_) older(unshipped_since_ms_);
  oldest_pending_ms_.store(o);
}

// A capture could not read what it had to (no descriptor, an I/O error):
// what it missed would be a hole in the replica, so the next shipment
// starts a new generation with a snapshot. Called with mu_ held.
void Capture::CaptureFailedLocked(std::string_view what, const std::string& why) {
  spdlog::error("replica: capturing the {} of {} failed: {}; its next shipment starts a new "
                "generation with a snapshot",
                what, main_.main_path, why);
  // What was captured before the failure still belongs to the generation.
  MarkGapLocked(CountLocked());
  if (o_.on_failure) o_.on_failure();
}

// Called with mu_ held. Of what is captured now, the first `keep` may still
// go into the current generation; nothing captured later does.
void Capture::MarkGapLocked(std::size_t keep) {
  FlagActive();
  need_generation_ = true;
  if (unshipped_since_ms_ == 0) unshipped_since_ms_ = o_.wall->NowMs();
  // An upload dropped with the gap: the snapshot that fills it ships its
  // commits, which are pending since they were made, not since now.
  for (WallMs* ms : {&taken_oldest_ms_, &snapshot_oldest_ms_}) {
    if (*ms != 0) unshipped_since_ms_ = std::min(unshipped_since_ms_, *ms);
    *ms = 0;
  }
  ++gaps_;
  shippable_ = std::min({shippable_, keep, CountLocked()});
}

void Capture::RemoveMarkerLocked() {
  if (unshipped_since_ms_ != 0) {
    unshipped_since_ms_ = 0;
    PublishLocked();
  }
  if (!marker_present_) return;
  std::string marker = std::string(kUnshippedMarkerDir) + "/" + MarkerName(main_);
  ::unlinkat(o_.root, marker.c_str(), 0);
  marker_present_ = false;
  unshipped_.store(false);
}

void Capture::LearnWalPageSize() {
  UniqueFd fd(::openat(o_.root, (main_.main_path + "-wal").c_str(), O_RDONLY | O_CLOEXEC));
  std::uint8_t h[wal::kHeaderSize];
  if (fd.valid() && ::pread(fd.get(), h, sizeof h, 0) == static_cast<ssize_t>(sizeof h)) {
    if (auto header = wal::ParseHeader(h, sizeof h)) wal_page_size_ = header->page_size;
  }
}

void Capture::PushLocked(Txn txn) {
  // Deleted: never shipped, and a tenant made again under the name spills
  // to the same file name.
  if (dropped_) return;
  CommittedWithJournalLocked();
  // The snapshot a drop made necessary grows with the database.
  if (drop_episode_ && txn.db_size > dropped_bytes_pub_.load()) dropped_bytes_pub_.store(txn.db_size);
  const std::uint64_t bytes = txn.Bytes();
  if (spill_.empty() && budget_->TakeMemory(bytes)) {
    captured_bytes_ += bytes;
    captured_.push_back(std::move(txn));
  } else if (budget_->TakeSpill(SpillFile::RecordBytes(txn))) {
    if (Status st = spill_.Append(txn); !st.ok()) {
      budget_->ReleaseSpill(SpillFile::RecordBytes(txn));
      spdlog::error("replica: {}: {}", main_.main_path, st.message());
      DropCapturedLocked(txn);
    } else {
      ++budget_->spilled;
      if (!budget_->spilling.exchange(true)) {
        spdlog::warn("replica: the agent's capture memory ({} bytes) is full of commits the "
                     "destination has not taken; later ones (the first of {}) spill to "
                     "BACKING/{} until shipping drains them",
                     budget_->memory_limit(), main_.main_path, std::string(kSpillDir));
      }
    }
  } else {
    DropCapturedLocked(txn);
  }
  PublishLocked();
}

void Capture::NoteTakenLocked(const std::vector<Txn>& txns) {
  for (const Txn& t : txns) {
    if (t.commit_ms != 0 && (taken_oldest_ms_ == 0 || t.commit_ms < taken_oldest_ms_)) {
      taken_oldest_ms_ = t.commit_ms;
    }
  }
}

void Capture::DropCapturedLocked(const Txn& incoming) {
  const std::uint64_t held = captured_bytes_ + spill_.live_bytes() + incoming.Bytes();
  ClearCapturedLocked();
  MarkGapLocked(0);
  ++budget_->drops;
  // The database after the newest commit: what the snapshot will hold (in
  // WAL mode most of it may still be in the log).
  const std::uint64_t size = std::max<std::uint64_t>(incoming.db_size, 1);
  dropped_bytes_pub_.store(size);
  if (drop_episode_) return;
  drop_episode_ = true;
  spdlog::error("replica: {}: {} bytes of commits the destination has not taken, and the agent's "
                "capture memory ({} bytes) and spill space ({} bytes, or what the backing volume "
                "can spare) are full; they are dropped, and the tenant now needs a full snapshot "
                "of {} bytes: it cannot be replicated until the destination takes an object that "
                "large",
                main_.main_path, held, budget_->memory_limit(), budget_->spill_limit(), size);
}

void Capture::ClearCapturedLocked() {
  captured_.clear();
  budget_->ReleaseMemory(captured_bytes_);
  captured_bytes_ = 0;
  budget_->ReleaseSpill(spill_.disk_bytes());
  spill_.Clear();
}

// Reads the commits the log holds after the cursor. Called with capture_mu_
// held and mu_ not: the log is read without blocking the writes that only
// note a commit time.
void Capture::CaptureWal() {
  UniqueFd fd(::openat(o_.root, (main_.main_path + "-wal").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return;  // no log: nothing to capture
    const int err = errno;
    std::lock_guard lock(mu_);
    CaptureFailedLocked("WAL", std::string("opening it: ") + std::strerror(err));
    return;
  }
  // Read a budget's take at a time, each pushed (and spilled past the
  // bound) before the next is read: however much of the log is unread, no
  // more of it is in memory at once.
  for (bool more = true; more;) {
    auto read = wal::ReadCommitted(fd.get(), cursor_, budget_->take_bytes(), o_.max_txn_bytes);
    if (!read.ok()) {
      std::lock_guard lock(mu_);
      CaptureFailedLocked("WAL", read.status().message());
      return;
    }
    more = read->more;
    PushCommitted(std::move(read->txns));
  }
}

void Capture::PushCommitted(std::vector<wal::CommittedTxn> txns) {
  std::lock_guard lock(mu_);
  const WallMs now = o_.wall->NowMs();
  for (auto& c : txns) {
    Txn t;
    auto seen = commit_seen_.find(c.commit_frame_offset);
    t.commit_ms = seen != commit_seen_.end() ? seen->second : now;
    t.db_size = std::uint64_t{c.db_pages} * c.page_size;
    for (auto& [pgno, data] : c.pages) {
      t.writes.push_back(PageWrite{std::uint64_t{pgno - 1} * c.page_size, std::move(data)});
    }
    commit_seen_.erase(commit_seen_.begin(), commit_seen_.upper_bound(c.commit_frame_offset));
    if (c.oversized) {
      OversizedLocked(t.commit_ms);
      continue;
    }
    PushLocked(std::move(t));
  }
  PublishLocked();
}

// A committed transaction too large to hold: what was captured before it
// still ships as segments, and the snapshot after them carries it.
void Capture::OversizedLocked(WallMs commit_ms) {
  if (dropped_) return;
  CommittedWithJournalLocked();
  if (unshipped_since_ms_ == 0 || commit_ms < unshipped_since_ms_) unshipped_since_ms_ = commit_ms;
  MarkGapLocked(CountLocked());
  ++budget_->oversized;
  spdlog::info("replica: {} committed a transaction larger than one capture holds ({} bytes); "
               "it ships in a snapshot read from the file",
               main_.main_path, o_.max_txn_bytes);
}

void Capture::CommittedWithJournalLocked() {
  if (!unshippable_) return;
  // A commit with a journal or a WAL: transactions' ends are on disk again.
  // The gap marked on entry makes the next shipment a fresh snapshot.
  unshippable_ = false;
  unshippable_pub_.store(false);
  spdlog::warn("replica: {} committed with a journal or WAL again; it ships again, starting "
               "with a snapshot",
               main_.main_path);
}

// The journal is finished: the main file's written ranges are the commit.
void Capture::FinishJournalLocked() {
  if (!journal_hot_) return;
  journal_hot_ = false;
  cv_.notify_all();
  UniqueFd fd(::openat(o_.root, main_.main_path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    dirty_.clear();
    CaptureFailedLocked("journaled commit", std::string("reading the main file: ") +
                                                std::strerror(err));
    return;
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t page = DbPageSize(fd.get());
  std::vector<std::uint64_t> pages;
  for (auto [off, len] : dirty_) {
    for (std::uint64_t p = off / page; p * page < off + len; ++p) pages.push_back(p);
  }
  dirty_.clear();
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  if (o_.max_txn_bytes != 0 && pages.size() * page > o_.max_txn_bytes) {
    OversizedLocked(o_.wall->NowMs());
    return;
  }
  Txn t;
  t.commit_ms = o_.wall->NowMs();
  t.db_size = size;
  for (std::uint64_t p : pages) {
    if (p * page >= size) continue;
    PageWrite w{p * page, std::string(std::min<std::uint64_t>(page, size - p * page), '\0')};
    if (::pread(fd.get(), w.data.data(), w.data.size(), static_cast<off_t>(w.offset)) !=
        static_cast<ssize_t>(w.data.size())) {
      CaptureFailedLocked("journaled commit", std::string("reading the main file: ") +
                                                  std::strerror(errno));
      return;
    }
    t.writes.push_back(std::move(w));
  }
  PushLocked(std::move(t));
}

// Neither journaled nor in a WAL. In WAL mode (a checkpoint whose log is
// gone, say) the next ship is a snapshot, as before; otherwise journal_mode
// is OFF or MEMORY and no transaction's end can be seen: unshippable.
void Capture::UnjournaledWriteLocked(std::uint64_t offset, const char* data, std::size_t size) {
  if (unshippable_) return;
  if (InWalMode(offset, data, size)) {
    MarkGapLocked(captured_.size());
    return;
  }
  unshippable_ = true;
  unshippable_pub_.store(true);
  // What was captured before still belongs to the generation; nothing after.
  MarkGapLocked(CountLocked());
  spdlog::error("replica: {} was written with no journal on disk and not in WAL mode "
                "(journal_mode OFF or MEMORY): no transaction's end is visible, so a copy could "
                "be torn; nothing of it is shipped until it commits with a journal or WAL, then "
                "it ships from a fresh snapshot",
                main_.main_path);
}

// Header bytes 18 and 19, from the write itself when it covers them, else
// from the file. A header that cannot be read is not WAL's.
bool Capture::InWalMode(std::uint64_t offset, const char* data, std::size_t size) const {
  std::uint8_t v[2];
  if (offset <= kDbVersionOffset && offset + size >= kDbVersionOffset + 2) {
    std::memcpy(v, data + (kDbVersionOffset - offset), 2);
  } else {
    UniqueFd fd(::openat(o_.root, main_.main_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid() || ::pread(fd.get(), v, 2, kDbVersionOffset) != 2) return false;
  }
  return v[0] == kDbVersionWal && v[1] == kDbVersionWal;
}

}  // namespace fleetfs::replica
