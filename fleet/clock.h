// Clocks, injected wherever time is read, so tests move time themselves.
//
// Two kinds of time, never mixed:
// - monotonic time (MonoTime) for a host's own deadlines: local leases, call
//   time limits, refresh timers. It never jumps.
// - wall time (WallMs, milliseconds since the Unix epoch) for what is shared
//   between hosts: lease expiries in the ownership table.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace fleetfs {

using MonoTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;
using WallMs = std::int64_t;

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

// The machine's clocks.
class SystemMonotonicClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return std::chrono::steady_clock::now(); }
};

class SystemWallClock final : public WallClock {
 public:
  WallMs NowMs() const override {
    return std::chrono::duration_cast<Millis>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace fleetfs
