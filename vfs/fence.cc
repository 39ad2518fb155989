#include "vfs/fence.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace fleetfs::vfs {

void Fence::Start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stop_) return;
  thread_ = std::thread([this] { Loop(); });
}

void Fence::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Fence::Replaced(std::shared_ptr<const ServingView> old, const ServingView& next,
                     MonoTime now) {
  std::vector<ServedRange> withdrawn = old->WithdrawnBy(next, now);
  std::vector<ServedRange> claimed = next.WithdrawnBy(*old, now);  // served anew
  std::lock_guard lock(mu_);
  std::erase_if(old_views_, [](const auto& w) { return w.expired(); });
  old_views_.push_back(old);
  old.reset();
  if (!withdrawn.empty() || !claimed.empty()) {
    jobs_.push_back(FenceJob{std::move(withdrawn), std::move(claimed), {}});
    ++queued_;
    cv_.notify_all();
  }
}

void Fence::Queue(FenceJob job) {
  std::lock_guard lock(mu_);
  jobs_.push_back(std::move(job));
  ++queued_;
  cv_.notify_all();
}

void Fence::Wait() {
  std::unique_lock lock(mu_);
  std::uint64_t target = queued_;
  cv_.wait(lock, [&] { return done_ >= target || stop_; });
}

void Fence::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    FenceJob job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    Run(job);
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

bool Fence::OldViewsGone() {
  std::lock_guard lock(mu_);
  std::erase_if(old_views_, [](const auto& w) { return w.expired(); });
  return old_views_.empty();
}

void Fence::Run(const FenceJob& job) {
  MonoTime started = clock_.Now();
  if (!job.withdrawn.empty() || !job.claimed.empty()) {
    // Operations that loaded an older view may still be writing: the fence
    // counts as done only once each of them has finished or failed.
    int polls = 0;
    while (!OldViewsGone()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (++polls % 5000 == 0) {  // every second
        spdlog::warn("vfs: a fence still waits for operations in flight after {} s",
                     polls / 5000);
      }
    }
  }
  // Now no operation can reach these ranges' files. Tell the kernel to
  // forget their names and pages.
  std::vector<FenceTarget> targets = files_.FilesIn(job.withdrawn);
  for (const FenceTarget& t : targets) {
    notifier_.InvalEntry(t.entry.parent, t.entry.name);
    if (t.role != FileRole::kShm) {
      notifier_.InvalInode(t.ino);
    } else if (t.size && *t.size >= kWalIndexHeaderBytes) {
      // A WAL reader whose wal-index header is unchanged reads from its own
      // cache and the -shm mapping, without one file operation, so a fence
      // alone would not stop it. Zeroing both header copies in the kernel's
      // cached page (not in the backing file, which stays as it was) makes
      // every connection's next transaction recover the index from the -wal
      // file, and that read fails with ESTALE. A connection of a later
      // serving period recovers it correctly. A smaller file holds nothing a
      // reader could trust, and its size must not grow.
      static const char kZeros[kWalIndexHeaderBytes] = {};
      notifier_.Store(t.ino, 0, std::string_view(kZeros, sizeof kZeros));
    }
  }
  for (const EntryName& e : job.entries) notifier_.InvalEntry(e.parent, e.name);
  if (!job.claimed.empty()) {
    // Absent names cached while these ranges were served before must not
    // hide files that are there now.
    std::vector<EntryName> absent = files_.ForgetAbsentIn(job.claimed);
    for (const EntryName& e : absent) notifier_.InvalEntry(e.parent, e.name);
    if (!absent.empty()) {
      spdlog::info("vfs: a claim made the kernel forget {} cached absent names", absent.size());
    }
  }
  if (!job.withdrawn.empty()) {
    auto took = std::chrono::duration_cast<std::chrono::microseconds>(clock_.Now() - started);
    stats_.fences.fetch_add(job.withdrawn.size(), std::memory_order_relaxed);
    for (const ServedRange& r : job.withdrawn) {
      std::size_t open = files_.OpenHandlesIn(r.first, r.last);
      stats_.handles_fenced.fetch_add(open, std::memory_order_relaxed);
      spdlog::info("vfs: fenced range {}-{} epoch {}: {} open handles, {} names forgotten, in {} us",
                   r.first, r.last, r.token.epoch, open, targets.size(), took.count());
    }
  }
}

}  // namespace fleetfs::vfs
