// Fence: makes the kernel forget what a withdrawn range exposed, once no
// operation can still reach it.
//
// Publishing a view that withdraws ranges (lapsed, lost, served again under
// another token) queues a fence job. The fence thread waits until no
// operation holds a view published before (so writes already inside have
// finished or failed), then tells the kernel to forget the entries and
// cached pages of those ranges' files. A -shm file's pages are not dropped
// (that would unmap SQLite's shared memory under a fenced process: SIGBUS);
// its wal-index headers are zeroed in the kernel's cached page instead (see
// fence.cc). A range served anew also makes the kernel forget the absent
// names cached while it was served before.
//
// The kernel is reached through KernelNotifier (a FUSE session in the mount,
// a recorder in tests), always from the fence thread: a notification sent
// from a thread answering a request can deadlock.
//
// Thread-safety: every public method is safe from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fleet/clock.h"
#include "fleet/layout.h"
#include "vfs/negative_names.h"
#include "vfs/serving_view.h"
#include "vfs/vfs_stats.h"

namespace fleetfs::vfs {

// What the fence tells the kernel (fuse_lowlevel_notify_*).
class KernelNotifier {
 public:
  virtual ~KernelNotifier() = default;
  // Forget the cached entry `name` in directory `parent` (present or absent).
  virtual void InvalEntry(std::uint64_t parent, std::string_view name) = 0;
  // Forget the attributes and every cached page of `ino`.
  virtual void InvalInode(std::uint64_t ino) = 0;
  // Replace cached bytes of `ino` at `offset` with `data` (not the file's).
  virtual void Store(std::uint64_t ino, std::uint64_t offset, std::string_view data) = 0;
};

// A file the kernel may cache, as the fence needs it.
struct FenceTarget {
  std::uint64_t ino = 0;
  EntryName entry;  // its name in its bucket
  FileRole role = FileRole::kMain;
  // For -shm: the backing file's size, if known (the wal-index headers are
  // zeroed only when the file holds them, so its size never grows).
  std::optional<std::uint64_t> size;
};

// What the fence asks of the mount.
class FencedFiles {
 public:
  virtual ~FencedFiles() = default;
  // Every file the kernel knows in one of `ranges`.
  virtual std::vector<FenceTarget> FilesIn(const std::vector<ServedRange>& ranges) = 0;
  // The absent names cached in `claimed` that the kernel must forget (they
  // are forgotten by the mount as they are returned).
  virtual std::vector<EntryName> ForgetAbsentIn(const std::vector<ServedRange>& claimed) = 0;
  // Open handles in slots first..last (for the log and the stats).
  virtual std::size_t OpenHandlesIn(Slot first, Slot last) = 0;
};

struct FenceJob {
  std::vector<ServedRange> withdrawn;  // ranges to fence
  std::vector<ServedRange> claimed;    // ranges served anew: forget their absent names
  std::vector<EntryName> entries;      // names to forget (sidecars of a deleted tenant)
};

// Both header copies of SQLite's wal-index (2 x 48 bytes at offset 0 of -shm).
inline constexpr std::size_t kWalIndexHeaderBytes = 2 * 48;

class Fence {
 public:
  // All four must outlive the fence.
  Fence(KernelNotifier& notifier, FencedFiles& files, const MonotonicClock& clock,
        VfsStats& stats)
      : notifier_(notifier), files_(files), clock_(clock), stats_(stats) {}
  ~Fence() { Stop(); }
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;

  // Starts the fence thread.
  void Start();
  // Runs the jobs still queued, then ends the thread.
  void Stop();

  // `old` was just replaced by `next` at `now`: queues the fence of every
  // range `next` withdraws and the forgetting of every range it serves anew.
  // Jobs queued from now on wait until nobody holds `old` any more.
  void Replaced(std::shared_ptr<const ServingView> old, const ServingView& next, MonoTime now);
  // Queues a job that waits for no view (names to forget).
  void Queue(FenceJob job);
  // Blocks until every job queued so far is done (or the fence stopped).
  void Wait();

 private:
  void Loop();
  void Run(const FenceJob& job);
  // True once no view replaced before holds an operation in flight.
  bool OldViewsGone();

  KernelNotifier& notifier_;
  FencedFiles& files_;
  const MonotonicClock& clock_;
  VfsStats& stats_;

  std::mutex mu_;  // guards everything below down to thread_; taken alone
  std::condition_variable cv_;
  std::deque<FenceJob> jobs_;
  // Views replaced that an operation in flight may still hold.
  std::vector<std::weak_ptr<const ServingView>> old_views_;
  std::uint64_t queued_ = 0;
  std::uint64_t done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fleetfs::vfs
