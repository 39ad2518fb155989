// BackingWatch: does the backing volume take writes? Decided from the
// mount's error counters and, before anything drastic, a probe of the volume
// itself (DESIGN sections 6 and 7: a full or read-only disk gets a clear
// error, and the agent keeps serving what it safely can).
//
// The rules:
// - ENOSPC from a write-type operation: the volume is full. Reported (health
//   503, status) until `full_window` after the last one; the ranges stay
//   served, since reads and whatever still fits work.
// - EROFS from any operation, or EIO from a write-type operation, makes the
//   volume suspect, nothing more: a local user can provoke EIO on a file of
//   their own (a symlinked bucket, a restore that fails), and one hostile
//   file must not hand every range away. The shell then probes the volume
//   itself (ProbeBacking: statvfs, then create, write, fsync and remove a
//   file under BACKING/.fleetfs, a directory only root can touch). Only a
//   probe that finds the volume read-only or failing with EROFS or EIO makes
//   it failed: the agent stops serving and releases (Lifecycle::
//   BackingFailed). A probe that writes fine clears the suspicion; probes
//   run at most once per `probe_interval`, however many errors arrive.
//
// Thread-safety: none; the loop thread owns it. ProbeBacking does blocking
// I/O and runs on the pool.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fleet/clock.h"
#include "vfs/vfs_stats.h"

namespace fleetfs::agent {

// Operations that write to a backing file or directory.
bool IsBackingWriteOp(vfs::Op op);

// The counters the watch reads: totals since the mount.
struct BackingErrors {
  std::uint64_t erofs = 0;          // any operation
  std::uint64_t eio_writes = 0;     // write-type operations
  std::uint64_t enospc_writes = 0;  // write-type operations
};
// Relaxed atomic reads: cheap enough for the loop.
BackingErrors BackingErrorsOf(const vfs::VfsStats& stats);

// What a probe of the volume found.
struct ProbeResult {
  bool read_only = false;  // statvfs says ST_RDONLY
  int err = 0;             // errno of the step that failed; 0 when the probe wrote
  std::string step;        // the step that failed, naming the file
};
// Blocking I/O: statvfs of `backing`, then create, write, fsync and remove
// `backing`/.fleetfs/write-probe. Never on the loop thread.
ProbeResult ProbeBacking(const std::string& backing);

enum class BackingState { kOk, kFull, kFailed };
std::string_view BackingStateName(BackingState state);

// What operators see; a value.
struct BackingReport {
  BackingState state = BackingState::kOk;
  std::string reason;              // empty while kOk
  std::uint64_t enospc_recent = 0;  // ENOSPC of write-type operations within the window
  std::uint64_t probes = 0;         // probes of the volume run
  std::uint64_t probes_clear = 0;   // probes that found the volume writing fine

  bool operator==(const BackingReport&) const = default;
};

struct BackingWatchOptions {
  std::string backing;
  Millis full_window{30000};
  Millis probe_interval{5000};
};

class BackingWatch {
 public:
  struct LogLine {
    bool warn = false;  // else info
    std::string text;
  };
  struct Decision {
    bool probe = false;  // run ProbeBacking on the pool, then call Probed()
    std::vector<LogLine> log;
  };

  explicit BackingWatch(BackingWatchOptions options) : options_(std::move(options)) {}

  // The mount's counters now (totals, never smaller than before).
  Decision Observe(MonoTime now, const BackingErrors& totals);
  // The probe asked for ended. Returns why the volume is failed when the
  // probe confirms it (first time only); nullopt otherwise.
  std::optional<std::string> Probed(MonoTime now, const ProbeResult& result,
                                    std::vector<LogLine>* log);

  const BackingReport& report() const { return report_; }
  bool failed() const { return report_.state == BackingState::kFailed; }

 private:
  void UpdateState(MonoTime now);
  std::string ErrorsSeen() const;

  BackingWatchOptions options_;
  BackingErrors seen_;                 // totals at the last Observe
  bool suspect_ = false;               // EROFS or write EIO not yet probed
  bool probe_running_ = false;
  MonoTime next_probe_{};              // no probe before this
  std::deque<std::pair<MonoTime, std::uint64_t>> enospc_;  // (when, how many), oldest first
  bool full_logged_ = false;
  BackingReport report_;
};

}  // namespace fleetfs::agent
