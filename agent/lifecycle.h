// Lifecycle and ServingPlan: the agent's phases and what it serves, as pure
// step functions on time passed in (DESIGN sections 2 and 6). They decide;
// the libuv shell in agent.cc carries the decisions out (store calls, the
// mount, the thread pool) and feeds back what happened. In the style of
// lease/host_ownership: decisions are returned as data.
//
//   starting ──first refresh ended, mounted──► serving ──SIGTERM──► draining
//      │                                          │                    │
//      └── signal, mount failed ──────────────────┴─ mount gone ───────┤
//                                                                      ▼
//   stopped ◄── released / lapsed ◄── settled ◄── fences, flush ◄── stopping
//   failed  ◄── (the same, after the backing volume failed: stays up, serves
//               nothing, claims nothing, says why; exits at the next signal)
//
// Stopping: everything is hidden and fenced, and the final flush runs on the
// pool while the loop keeps renewing the leases (an unshipped commit must
// not become another host's to restore over). Then the release rule: the
// ranges are released only when nothing committed is left unshipped, no
// store call may still land, and the store confirms within ttl/3; otherwise
// they lapse, and the agent exits with kExitLapsed.
//
// Thread-safety: none; the loop thread owns both.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/status.h"
#include "lease/epoch.h"
#include "lease/host_ownership.h"
#include "lease/slot_range.h"

namespace fleetfs::agent {

// The exit code of `fleetfs mount` after a stop in which held ranges lapse
// instead of being released (commits left unshipped, a store call that may
// still land, or a store that did not confirm): a new owner waits up to a
// ttl, and may restore an older state than this host wrote.
inline constexpr int kExitLapsed = 5;

enum class Phase { kStarting, kServing, kDraining, kStopping, kStopped, kFailed };
std::string_view PhaseName(Phase phase);

// ---- what to serve ----

struct PlannedRange {
  lease::SlotRange range = lease::SlotRange::All();
  lease::Epoch epoch;
  std::uint64_t period = 0;  // new whenever the range is served again after a gap
  MonoTime valid_until{};    // the local lease's end
  bool accepting = true;     // false while it drains before a handoff

  bool operator==(const PlannedRange&) const = default;
};

struct WithdrawnRange {
  lease::SlotRange range = lease::SlotRange::All();
  lease::Epoch epoch;
  std::string why;
};

struct ServingChange {
  std::vector<PlannedRange> served;     // publish these, in configured order
  std::vector<PlannedRange> started;    // served under a new period from now
  std::vector<PlannedRange> warm;       // a new epoch here: restore its tenants in the background
  std::vector<WithdrawnRange> withdrawn;  // no longer served: hide and fence
};

// Which ranges to publish, each with a period: a view token is (epoch,
// period), so a handle opened before a gap in serving is fenced even when
// the range comes back at the same epoch.
class ServingPlan {
 public:
  // `serve` false (stopping) withdraws everything. `draining` ranges are
  // served but take no new opens; `withheld` ones (a handoff past its
  // drain) are withdrawn, though the lease is held.
  ServingChange Update(const std::vector<lease::RangeStatus>& status, bool serve, MonoTime now,
                       const std::set<lease::SlotRange>& draining = {},
                       const std::set<lease::SlotRange>& withheld = {});

 private:
  std::map<lease::SlotRange, PlannedRange> published_;
  std::uint64_t next_period_ = 1;
};

// ---- the phases ----

struct LifecycleOptions {
  Millis ttl{30000};
  Millis shutdown_grace{5000};
};

// What the shell saw just before a step.
struct Observed {
  std::uint64_t refreshes_ended = 0;  // refresh reports so far
  bool store_call_running = false;    // a claim or renew may still land
  std::size_t held_ranges = 0;        // ranges held at an epoch, served or not
  std::size_t open_handles = 0;
  std::size_t released = 0;           // releases the store confirmed
};

struct LogLine {
  enum class Level { kInfo, kWarn, kError };
  Level level = Level::kInfo;
  std::string text;
};

struct ReleaseDecision {
  bool release = false;     // false: the ranges lapse
  std::string lapse_reason;  // when not released
};

// What the shell does after a step, in the order of the members.
struct Actions {
  std::vector<LogLine> log;
  bool mount = false;         // mount now, then call Mounted()
  bool publish = false;       // publish the serving plan (everything withdrawn unless serves())
  // On the pool, not the loop: wait for the fences, then flush the replica
  // for at most flush_limit(); then call StopWorkDone().
  bool stop_work = false;
  // Refresher::StartRelease(release); then ReleaseSent() with its call count.
  std::optional<ReleaseDecision> release;
  bool finish = false;        // unmount, close the loop, exit with exit_code()
  MonoTime wake = MonoTime::max();  // step again no later than this
};

class Lifecycle {
 public:
  explicit Lifecycle(LifecycleOptions options) : options_(options) {}

  Phase phase() const { return phase_; }
  // Start a refresh when one is due (claims and renewals go on).
  bool renews() const;
  // Publish the held ranges (else withdraw everything).
  bool serves() const { return phase_ == Phase::kStarting || phase_ == Phase::kServing ||
                               phase_ == Phase::kDraining; }
  // Admit opens of files not open yet.
  bool admits_new_opens() const {
    return phase_ == Phase::kStarting || phase_ == Phase::kServing;
  }
  // How long the final flush may take: two refresh intervals, so at least
  // one renewal lands while it runs. The fences and the flush together get
  // a ttl; after that the ranges lapse.
  Millis flush_limit() const { return options_.ttl * 2 / 3; }
  int exit_code() const { return exit_code_; }
  const std::string& exit_reason() const { return exit_reason_; }
  // Why the agent stood down after a backing failure; empty otherwise.
  const std::string& failure() const { return failure_; }

  // A timer wake, or any answer that may change what is served.
  Actions Step(MonoTime now, const Observed& seen);
  // The mount asked for by Actions::mount is up, or was refused.
  Actions Mounted(MonoTime now, const Status& mounted, const Observed& seen);
  // SIGTERM or SIGINT (`name`).
  Actions Signal(MonoTime now, std::string_view name, const Observed& seen);
  // The FUSE session ended without us (unmounted from outside).
  Actions SessionEnded(MonoTime now, const Observed& seen);
  // The backing volume fails writes in a way no retry fixes (read-only, I/O
  // errors): stop serving and release, so a healthy host can take over.
  Actions BackingFailed(MonoTime now, std::string why, const Observed& seen);
  // The stop work asked for by Actions::stop_work ended.
  Actions StopWorkDone(MonoTime now, bool all_shipped, const Observed& seen);
  // Refresher::StartRelease sent `calls` releases.
  Actions ReleaseSent(MonoTime now, std::size_t calls, const Observed& seen);

 private:
  enum class StopStep { kNone, kStopWork, kSettling, kReleasing };

  void BeginStop(MonoTime now, Actions& out);
  void Decide(MonoTime now, const Observed& seen, Actions& out);
  void End(Actions& out);
  void SetExit(int code, std::string reason);
  void Wake(Actions& out, MonoTime at) const;

  LifecycleOptions options_;
  Phase phase_ = Phase::kStarting;
  StopStep stop_step_ = StopStep::kNone;
  bool stand_by_after_stop_ = false;  // a backing failure: kFailed instead of kStopped
  bool all_shipped_ = false;
  std::size_t held_at_decision_ = 0;
  std::size_t releases_sent_ = 0;
  std::string lapse_reason_;
  MonoTime drain_deadline_{};
  MonoTime stop_work_deadline_{};
  MonoTime settle_deadline_{};
  MonoTime release_deadline_{};
  int exit_code_ = 0;
  std::string exit_reason_;
  std::string failure_;
};

}  // namespace fleetfs::agent
