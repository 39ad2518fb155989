// What the mount tells replication about a tenant's files before a change
// reaches the disk, and what it asks of it before a main file is exposed.
// The mount (vfs/) calls these; fleet/'s Replicator implements them; the
// agent wires the two, so vfs knows nothing of replicas.
//
// Thread-safety: implementations are called from FUSE threads at once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "fleet/layout.h"

namespace fleetfs {

// A lock that many writes share and a snapshot takes alone. A waiting
// snapshot goes before new writes, so a busy tenant cannot starve it.
class WriteGate {
 public:
  // Called after each shared hold ends (its change landed, or failed), on
  // the writer's thread, with no lock held. Set before any hold.
  void OnLanded(std::function<void()> landed) { landed_ = std::move(landed); }
  void LockShared() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !exclusive_ && exclusive_waiting_ == 0; });
    ++shared_;
  }
  void UnlockShared() {
    {
      std::lock_guard lock(mu_);
      if (--shared_ == 0) cv_.notify_all();
    }
    if (landed_) landed_();
  }
  void Lock() {
    std::unique_lock lock(mu_);
    ++exclusive_waiting_;
    cv_.wait(lock, [&] { return !exclusive_ && shared_ == 0; });
    --exclusive_waiting_;
    exclusive_ = true;
  }
  void Unlock() {
    std::lock_guard lock(mu_);
    exclusive_ = false;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;  // guards the three below
  std::condition_variable cv_;
  int shared_ = 0;
  int exclusive_waiting_ = 0;
  bool exclusive_ = false;
  std::function<void()> landed_;
};

// Held by the mount from just before a change reaches the backing file until
// the call returned. Releases the capture lock (if any) first, then the gate.
class WriteGuard {
 public:
  WriteGuard() = default;
  WriteGuard(WriteGate* gate, std::unique_lock<std::mutex> held)
      : gate_(gate), held_(std::move(held)) {}
  WriteGuard(WriteGuard&&) = default;
  WriteGuard& operator=(WriteGuard&&) = default;

 private:
  struct GateRelease {
    void operator()(WriteGate* g) const { g->UnlockShared(); }
  };
  std::unique_ptr<WriteGate, GateRelease> gate_;  // destroyed after held_
  std::unique_lock<std::mutex> held_;
};

// One tenant's changes: its main file, -wal and -journal.
class TenantWatch {
 public:
  virtual ~TenantWatch() = default;
  virtual WriteGuard BeforeWrite(FileRole role, std::uint64_t offset, const char* data,
                                 std::size_t size) = 0;
  virtual WriteGuard BeforeTruncate(FileRole role, std::uint64_t size) = 0;
  virtual WriteGuard BeforeUnlink(FileRole role) = 0;
};

class TenantHooks {
 public:
  virtual ~TenantHooks() = default;
  // The watch of the tenant that `file` (main, -wal or -journal) belongs to,
  // opened under `epoch`; nullptr for the other roles.
  virtual std::shared_ptr<TenantWatch> Watch(const FleetFile& file, std::uint64_t epoch) = 0;
  // Makes the main file ready to be exposed under `epoch`: restores it when
  // it is missing and the replica holds it, replaces it when another owner
  // wrote a newer epoch, and raises its epoch stamp. `done` gets 0 (then the
  // file is there, or rightly absent) or an errno, exactly once, on any
  // thread, possibly before Prepare returns.
  virtual void Prepare(const FleetFile& main, std::uint64_t epoch,
                       std::function<void(int err)> done) = 0;
  // The main file is about to be deleted through the mount under `epoch`:
  // called before the unlink, so a record of the delete is on disk before
  // the file is gone (a crash between the two must not bring it back). The
  // unlink may still fail; Deleted follows only if it did not.
  virtual void WillDelete(const FleetFile& main, std::uint64_t epoch) { (void)main, (void)epoch; }
  // The main file was deleted through the mount under `epoch`: a tombstone.
  virtual void Deleted(const FleetFile& main, std::uint64_t epoch) = 0;
};

}  // namespace fleetfs
