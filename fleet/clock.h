// Clocks, injected wherever time is read, so tests move time themselves.
//
// Three kinds of time, never mixed:
// - monotonic time (MonoTime) for a host's own deadlines: local leases, call
//   time limits, refresh timers. It never jumps; the machine's is the boot
//   clock (SystemMonotonicClock says why).
// - boot time (BootMs, CLOCK_BOOTTIME in milliseconds, with the boot id) for
//   lease expiries in the SQLite control database, shared by the agents of
//   one host. It never steps, counts time spent suspended, and means nothing
//   outside its boot: a time of another boot id is of a boot that has ended.
// - wall time (WallMs, milliseconds since the Unix epoch) for display and for
//   commit times (point-in-time restores). No safety decision reads it: an
//   operator's `date -s` moves it any way at any moment.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fleet/status.h"

namespace fleetfs {

using MonoTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;
using WallMs = std::int64_t;
using BootMs = std::int64_t;

class MonotonicClock {
 public:
  virtual ~MonotonicClock() = default;
  virtual MonoTime Now() const = 0;
};

class WallClock {
 public:
  virtual ~WallClock() = default;
  virtual WallMs NowMs() const = 0;
};

// The host's boot clock and the id of the boot it counts from.
class BootClock {
 public:
  virtual ~BootClock() = default;
  virtual BootMs NowMs() const = 0;
  // /proc/sys/kernel/random/boot_id: differs for every boot of every host.
  virtual std::string BootId() const = 0;
};

// The machine's clocks.
//
// The agent's monotonic time is CLOCK_BOOTTIME, not CLOCK_MONOTONIC: the
// SQLite store measures lease expiries on the boot clock, which counts time
// spent suspended, and CLOCK_MONOTONIC does not. A host suspended past its
// lease must find its local lease ended on resume, as the store already does;
// on CLOCK_MONOTONIC it would serve up to 2/3 ttl while another agent of the
// host claims. Times of this clock are compared only with each other, never
// with std::chrono::steady_clock::now().
class SystemMonotonicClock final : public MonotonicClock {
 public:
  MonoTime Now() const override;
};

// CLOCK_REALTIME, plus the test-only offset of FLEETFS_TEST_WALL_OFFSET_FILE
// (see CheckTestWallOffset).
class SystemWallClock final : public WallClock {
 public:
  WallMs NowMs() const override;
};

// The host's CLOCK_BOOTTIME and this boot's id, read once: a process never
// outlives its boot.
//
// The host's, not the process's: inside a time namespace CLOCK_BOOTTIME is
// shifted by the namespace's offset while the boot id is the same, so two
// agents of one host would write expiries in frames apart by the offset (one
// shifted back 10 minutes could claim over a live lease). The offset of the
// process's namespace (/proc/self/timens_offsets, fixed for the process's
// life) is taken back out.
class SystemBootClock final : public BootClock {
 public:
  // Unavailable naming the file when the boot id cannot be read; DataLoss
  // when the time namespace offsets cannot be parsed.
  static Result<std::unique_ptr<SystemBootClock>> Make();
  BootMs NowMs() const override;
  std::string BootId() const override { return boot_id_; }
  std::int64_t time_namespace_offset_ms() const { return offset_ms_; }

 private:
  SystemBootClock(std::string boot_id, std::int64_t offset_ms)
      : boot_id_(std::move(boot_id)), offset_ms_(offset_ms) {}
  const std::string boot_id_;
  const std::int64_t offset_ms_;
};

inline constexpr const char* kTimeNamespaceOffsetsPath = "/proc/self/timens_offsets";

// The boottime offset in ms from the text of /proc/self/timens_offsets
// ("monotonic S N" and "boottime S N" lines); 0 when no boottime line.
Result<std::int64_t> ParseBootTimeOffsetMs(std::string_view text);

// TEST ONLY. When the environment variable FLEETFS_TEST_WALL_OFFSET_FILE
// names a file, SystemWallClock adds the signed integer milliseconds written
// in it to the real wall time (a missing file means 0). It exists because
// tests must step the wall clock under running agents (a `date -s` either
// way must change no lease decision), and nothing else can do that to a
// process without moving the whole machine's clock: a time namespace offsets
// CLOCK_MONOTONIC and CLOCK_BOOTTIME, never CLOCK_REALTIME.
//
// Called once at startup: InvalidArgument naming the file when it exists and
// does not hold one integer. A file that turns malformed at run time is
// ignored (the last good offset stays) with one warning. Write the file by
// rename, so no reader sees it half-written.
Status CheckTestWallOffset();

}  // namespace fleetfs
