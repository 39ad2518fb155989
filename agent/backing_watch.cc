#include "agent/backing_watch.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fleet/unique_fd.h"
#include "lease/lease_ttl.h"

namespace fleetfs::agent {
namespace {

std::string ErrnoText(int err) {
  std::string name = err == EROFS    ? "EROFS"
                     : err == EIO    ? "EIO"
                     : err == ENOSPC ? "ENOSPC"
                                     : "errno " + std::to_string(err);
  return std::string(std::strerror(err)) + " (" + name + ")";
}

// A probe failing this way means the volume itself does not take writes.
bool VolumeFails(const ProbeResult& r) { return r.read_only || r.err == EROFS || r.err == EIO; }

}  // namespace

bool IsBackingWriteOp(vfs::Op op) {
  switch (op) {
    case vfs::Op::kWrite:
    case vfs::Op::kFsync:
    case vfs::Op::kSetattr:
    case vfs::Op::kCreate:
    case vfs::Op::kUnlink:
    case vfs::Op::kFallocate: return true;
    default: return false;
  }
}

BackingErrors BackingErrorsOf(const vfs::VfsStats& stats) {
  BackingErrors e;
  constexpr auto kErofs = static_cast<std::size_t>(vfs::ErrKind::kErofs);
  constexpr auto kEio = static_cast<std::size_t>(vfs::ErrKind::kEio);
  constexpr auto kEnospc = static_cast<std::size_t>(vfs::ErrKind::kEnospc);
  for (std::size_t i = 0; i < vfs::kOpCount; ++i) {
    const auto& row = stats.errors[i];
    e.erofs += row[kErofs].load(std::memory_order_relaxed);
    if (!IsBackingWriteOp(static_cast<vfs::Op>(i))) continue;
    e.eio_writes += row[kEio].load(std::memory_order_relaxed);
    e.enospc_writes += row[kEnospc].load(std::memory_order_relaxed);
  }
  return e;
}

ProbeResult ProbeBacking(const std::string& backing) {
  ProbeResult r;
  struct statvfs vfs {};
  if (::statvfs(backing.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY) != 0) {
    r.read_only = true;
    r.err = EROFS;
    r.step = "statvfs of " + backing + " says it is mounted read-only";
    return r;
  }
  // The agent's own directory (made by the volume lock, mode 0700): no local
  // user can put a file of theirs here.
  const std::string path = backing + "/.fleetfs/write-probe";
  auto failed = [&](int err, const char* step, bool remove) {
    r.err = err;
    r.step = std::string(step) + " " + path;
    if (remove) ::unlink(path.c_str());
    return r;
  };
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return failed(errno, "creating", false);
  const char byte = 'p';
  const ssize_t n = ::pwrite(fd.get(), &byte, 1, 0);
  if (n != 1) return failed(n < 0 ? errno : EIO, "writing", true);
  if (::fsync(fd.get()) != 0) return failed(errno, "syncing", true);
  if (::close(fd.Release()) != 0) return failed(errno, "closing", true);
  if (::unlink(path.c_str()) != 0) return failed(errno, "removing", false);
  return r;
}

std::string_view BackingStateName(BackingState state) {
  switch (state) {
    case BackingState::kOk: return "ok";
    case BackingState::kFull: return "full";
    case BackingState::kFailed: return "failed";
  }
  return "unknown";
}

std::string BackingWatch::ErrorsSeen() const {
  std::string out;
  auto add = [&](std::uint64_t n, const char* what) {
    if (n == 0) return;
    out += (out.empty() ? "" : ", ") + std::to_string(n) + what;
  };
  add(seen_.erofs, " operations through the mount failed with EROFS");
  add(seen_.eio_writes, " writes through the mount failed with EIO");
  return out;
}

BackingWatch::Decision BackingWatch::Observe(MonoTime now, const BackingErrors& totals) {
  Decision out;
  const std::uint64_t new_enospc =
      totals.enospc_writes > seen_.enospc_writes ? totals.enospc_writes - seen_.enospc_writes : 0;
  if (totals.erofs > seen_.erofs || totals.eio_writes > seen_.eio_writes) suspect_ = true;
  seen_ = totals;
  if (new_enospc > 0) {
    // One entry per observation at most, so the window stays small.
    if (!enospc_.empty() && enospc_.back().first == now) {
      enospc_.back().second += new_enospc;
    } else {
      enospc_.emplace_back(now, new_enospc);
    }
  }
  const bool was_full = report_.state == BackingState::kFull;
  UpdateState(now);
  if (report_.state == BackingState::kFull && !full_logged_) {
    full_logged_ = true;
    out.log.push_back({true, report_.reason + "; still serving what it can"});
  } else if (was_full && report_.state == BackingState::kOk) {
    full_logged_ = false;
    out.log.push_back({false, "the backing volume " + options_.backing +
                                  " took writes again: no ENOSPC for " +
                                  lease::FormatDuration(options_.full_window)});
  }
  if (suspect_ && !failed() && !probe_running_ && now >= next_probe_) {
    suspect_ = false;
    probe_running_ = true;
    next_probe_ = now + options_.probe_interval;
    ++report_.probes;
    out.probe = true;
  }
  return out;
}

std::optional<std::string> BackingWatch::Probed(MonoTime now, const ProbeResult& result,
                                                std::vector<LogLine>* log) {
  probe_running_ = false;
  if (failed()) return std::nullopt;
  if (!VolumeFails(result)) {
    ++report_.probes_clear;
    if (log != nullptr) {
      std::string what = result.err == 0 ? "writes fine"
                                         : "answers " + ErrnoText(result.err) + " (" +
                                               result.step + "), which is no volume failure";
      log->push_back({true, ErrorsSeen() + ", but a probe of the backing volume " +
                                options_.backing + " " + what +
                                ": the errors come from those files, not the volume; "
                                "still serving"});
    }
    UpdateState(now);
    return std::nullopt;
  }
  std::string why = "the backing volume " + options_.backing +
                    (result.read_only || result.err == EROFS ? " is read-only" : " fails writes") +
                    ": " + result.step +
                    (result.read_only ? "" : " failed: " + ErrnoText(result.err));
  const std::string seen = ErrorsSeen();
  if (!seen.empty()) why += "; " + seen;
  report_.state = BackingState::kFailed;
  report_.reason = why;
  return why;
}

void BackingWatch::UpdateState(MonoTime now) {
  while (!enospc_.empty() && now - enospc_.front().first >= options_.full_window) {
    enospc_.pop_front();
  }
  std::uint64_t recent = 0;
  for (const auto& [when, n] : enospc_) recent += n;
  report_.enospc_recent = recent;
  if (failed()) return;  // stays failed: only a restart clears it
  if (recent > 0) {
    report_.state = BackingState::kFull;
    report_.reason = "the backing volume " + options_.backing + " is full: " +
                     std::to_string(recent) + " writes failed with ENOSPC in the last " +
                     lease::FormatDuration(options_.full_window);
  } else {
    report_.state = BackingState::kOk;
    report_.reason.clear();
  }
}

}  // namespace fleetfs::agent
