// VfsStats: counters of the mount's operations, and their latency, read by
// the agent's metrics.
//
// Thread-safety: relaxed atomics (Histogram's are too); a reader sees each counter's own recent
// value, not a consistent cut across counters.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "fleet/histogram.h"

namespace fleetfs::vfs {

enum class Op {
  kLookup, kGetattr, kSetattr, kOpen, kCreate, kRead, kWrite, kFsync, kFlush, kRelease,
  kUnlink, kOpendir, kReaddir, kStatfs, kFallocate, kRefused, kCount
};
std::string_view OpName(Op op);

// The errnos the contract names, and the rest.
// EIO, ENOSPC and EROFS from a backing call tell the agent the backing
// volume fails (agent/backing_watch).
enum class ErrKind {
  kEnoent, kEremote, kEperm, kEstale, kEacces, kEio, kEnospc, kErofs, kOther, kCount
};
std::string_view ErrKindName(ErrKind kind);
ErrKind ErrKindOf(int err);

inline constexpr std::size_t kOpCount = static_cast<std::size_t>(Op::kCount);
inline constexpr std::size_t kErrKindCount = static_cast<std::size_t>(ErrKind::kCount);

struct VfsStats {
  std::array<std::atomic<std::uint64_t>, kOpCount> ops{};
  std::array<std::array<std::atomic<std::uint64_t>, kErrKindCount>, kOpCount> errors{};
  // Operations refused because their handle's range is no longer served.
  std::atomic<std::uint64_t> fenced{0};
  // Ranges fenced, and how many open handles they had.
  std::atomic<std::uint64_t> fences{0};
  std::atomic<std::uint64_t> handles_fenced{0};
  // Per op, from the handler's start to its reply (a deferred lookup or open
  // until the reply its restore let it send).
  std::array<Histogram, kOpCount> latency{};

  void Count(Op op) { ops[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed); }
  void Observe(Op op, std::chrono::nanoseconds took) {
    latency[static_cast<std::size_t>(op)].Observe(took);
  }
  void CountError(Op op, int err) {
    errors[static_cast<std::size_t>(op)][static_cast<std::size_t>(ErrKindOf(err))].fetch_add(
        1, std::memory_order_relaxed);
  }
};

}  // namespace fleetfs::vfs
