#include "agent/lifecycle.h"

#include <algorithm>

#include "lease/lease_ttl.h"

namespace fleetfs::agent {
namespace {

// How often a phase that waits on something outside (handles closing, a
// release landing) looks again.
constexpr Millis kPoll{20};

void Log(Actions& out, LogLine::Level level, std::string text) {
  out.log.push_back(LogLine{level, std::move(text)});
}
void Info(Actions& out, std::string text) { Log(out, LogLine::Level::kInfo, std::move(text)); }
void Warn(Actions& out, std::string text) { Log(out, LogLine::Level::kWarn, std::move(text)); }
void Error(Actions& out, std::string text) { Log(out, LogLine::Level::kError, std::move(text)); }

}  // namespace

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kStarting: return "starting";
    case Phase::kServing: return "serving";
    case Phase::kDraining: return "draining";
    case Phase::kStopping: return "stopping";
    case Phase::kStopped: return "stopped";
    case Phase::kFailed: return "failed";
  }
  return "unknown";
}

// ---- ServingPlan ----

ServingChange ServingPlan::Update(const std::vector<lease::RangeStatus>& status, bool serve,
                                  MonoTime now, const std::set<lease::SlotRange>& draining,
                                  const std::set<lease::SlotRange>& withheld) {
  ServingChange change;
  std::map<lease::SlotRange, PlannedRange> next;
  if (serve) {
    for (const lease::RangeStatus& st : status) {
      if (!st.serving || !st.epoch || withheld.contains(st.range)) continue;
      auto before = published_.find(st.range);
      PlannedRange p;
      p.range = st.range;
      p.epoch = *st.epoch;
      p.valid_until = st.valid_until;
      p.accepting = !draining.contains(st.range);
      // The same period only while it was served without a gap: published
      // last time, at the same epoch, and its local lease not ended since.
      if (before != published_.end() && before->second.epoch == p.epoch &&
          now < before->second.valid_until) {
        p.period = before->second.period;
      } else {
        p.period = next_period_++;
        change.started.push_back(p);
        if (before == published_.end() || before->second.epoch != p.epoch) {
          change.warm.push_back(p);
        }
      }
      next[st.range] = p;
      change.served.push_back(p);
    }
  }
  for (const auto& [range, p] : published_) {
    auto after = next.find(range);
    if (after != next.end() && after->second.period == p.period) continue;
    std::string why = !serve                       ? "the agent is stopping"
                      : withheld.contains(range)   ? "it is being handed off"
                      : now >= p.valid_until       ? "its local lease ended"
                                                   : "it was lost";
    change.withdrawn.push_back(WithdrawnRange{range, p.epoch, std::move(why)});
  }
  published_ = std::move(next);
  return change;
}

// ---- Lifecycle ----

bool Lifecycle::renews() const {
  switch (phase_) {
    case Phase::kStarting:
    case Phase::kServing:
    case Phase::kDraining: return true;
    // While the fences and the flush run, the leases are kept: commits not
    // shipped yet must not become another host's to restore over.
    case Phase::kStopping: return stop_step_ == StopStep::kStopWork;
    case Phase::kStopped:
    case Phase::kFailed: return false;
  }
  return false;
}

void Lifecycle::Wake(Actions& out, MonoTime at) const { out.wake = std::min(out.wake, at); }

void Lifecycle::SetExit(int code, std::string reason) {
  if (exit_code_ != 0) return;  // the first reason is the one to tell
  exit_code_ = code;
  exit_reason_ = std::move(reason);
}

Actions Lifecycle::Step(MonoTime now, const Observed& seen) {
  Actions out;
  switch (phase_) {
    case Phase::kStarting:
      // The first claim has answered (or timed out): mount what it gave.
      if (seen.refreshes_ended > 0) out.mount = true;
      break;
    case Phase::kServing:
      out.publish = true;
      break;
    case Phase::kDraining:
      out.publish = true;
      if (seen.open_handles == 0 || now >= drain_deadline_) {
        if (seen.open_handles > 0) {
          Warn(out, std::to_string(seen.open_handles) +
                        " handles still open after the shutdown grace; fencing them");
        }
        BeginStop(now, out);
      } else {
        Wake(out, std::min(now + kPoll, drain_deadline_));
      }
      break;
    case Phase::kStopping:
      switch (stop_step_) {
        case StopStep::kStopWork:
          if (now >= stop_work_deadline_) {
            Warn(out, "the fences and the final flush did not end within " +
                          lease::FormatDuration(options_.ttl) + "; the ranges lapse");
            all_shipped_ = false;
            stop_step_ = StopStep::kSettling;
            lapse_reason_ = "the fences and the final flush did not end in time";
            Decide(now, seen, out);
          } else {
            Wake(out, stop_work_deadline_);
          }
          break;
        case StopStep::kSettling: Decide(now, seen, out); break;
        case StopStep::kReleasing:
          if (seen.released >= releases_sent_) {
            Info(out, "released " + std::to_string(releases_sent_) +
                          " ranges; other hosts may claim them at once");
            End(out);
          } else if (now >= release_deadline_) {
            std::string why = "the store confirmed " + std::to_string(seen.released) + " of " +
                              std::to_string(releases_sent_) + " releases within " +
                              lease::FormatDuration(options_.ttl / 3);
            Warn(out, why + "; the rest lapse");
            SetExit(kExitLapsed, "ranges lapse instead of being released: " + why);
            End(out);
          } else {
            Wake(out, std::min(now + kPoll, release_deadline_));
          }
          break;
        case StopStep::kNone: break;
      }
      break;
    case Phase::kStopped:
    case Phase::kFailed: break;
  }
  return out;
}

Actions Lifecycle::Mounted(MonoTime now, const Status& mounted, const Observed& seen) {
  (void)seen;
  Actions out;
  if (phase_ != Phase::kStarting) return out;
  if (!mounted.ok()) {
    Error(out, mounted.message());
    SetExit(1, mounted.message());
    BeginStop(now, out);
    return out;
  }
  phase_ = Phase::kServing;
  out.publish = true;
  return out;
}

Actions Lifecycle::Signal(MonoTime now, std::string_view name, const Observed& seen) {
  Actions out;
  const std::string what(name);
  switch (phase_) {
    case Phase::kStarting:
      Info(out, what + " before the first claim answered: stopping");
      BeginStop(now, out);
      break;
    case Phase::kServing: {
      phase_ = Phase::kDraining;
      drain_deadline_ = now + options_.shutdown_grace;
      Info(out, what + ": no new opens; " + std::to_string(seen.open_handles) +
                    " open handles get up to " + lease::FormatDuration(options_.shutdown_grace) +
                    " to close");
      Actions step = Step(now, seen);
      out.log.insert(out.log.end(), step.log.begin(), step.log.end());
      out.publish = true;
      out.stop_work = step.stop_work;
      out.wake = step.wake;
      break;
    }
    case Phase::kDraining:
      Info(out, what + " again: not waiting for open handles");
      BeginStop(now, out);
      break;
    case Phase::kStopping: Info(out, what + " again: already stopping"); break;
    case Phase::kFailed:
      Info(out, what + ": stopping");
      phase_ = Phase::kStopped;
      out.finish = true;
      break;
    case Phase::kStopped: break;
  }
  return out;
}

Actions Lifecycle::SessionEnded(MonoTime now, const Observed& seen) {
  (void)seen;
  Actions out;
  const std::string why = "the mount is gone (unmounted from outside)";
  switch (phase_) {
    case Phase::kStarting:
    case Phase::kServing:
    case Phase::kDraining:
      // Nothing can be served without the mount: release so another host can.
      Error(out, why + "; stopping");
      SetExit(1, why);
      BeginStop(now, out);
      break;
    case Phase::kFailed:
      Error(out, why + "; stopping");
      phase_ = Phase::kStopped;
      out.finish = true;
      break;
    case Phase::kStopping:
    case Phase::kStopped: break;
  }
  return out;
}

Actions Lifecycle::BackingFailed(MonoTime now, std::string why, const Observed& seen) {
  (void)seen;
  Actions out;
  if (!failure_.empty()) return out;
  failure_ = why;
  switch (phase_) {
    case Phase::kStarting:
    case Phase::kServing:
    case Phase::kDraining:
      Error(out, why + "; stopping serving and releasing, so a healthy host can take the ranges");
      SetExit(1, why);
      stand_by_after_stop_ = true;
      BeginStop(now, out);
      break;
    case Phase::kStopping:
      // Stopping anyway: it ends as it would, but not with 0.
      Error(out, why);
      SetExit(1, why);
      break;
    case Phase::kStopped:
    case Phase::kFailed: break;
  }
  return out;
}

void Lifecycle::BeginStop(MonoTime now, Actions& out) {
  phase_ = Phase::kStopping;
  stop_step_ = StopStep::kStopWork;
  // Hide everything now; the fences and the flush run off the loop.
  out.publish = true;
  out.stop_work = true;
  stop_work_deadline_ = now + options_.ttl;
  Wake(out, stop_work_deadline_);
}

Actions Lifecycle::StopWorkDone(MonoTime now, bool all_shipped, const Observed& seen) {
  Actions out;
  if (phase_ != Phase::kStopping || stop_step_ != StopStep::kStopWork) return out;  // too late
  all_shipped_ = all_shipped;
  if (!all_shipped) lapse_reason_ = "committed transactions are not all shipped to the replica";
  stop_step_ = StopStep::kSettling;
  settle_deadline_ = now + options_.ttl / 3;
  Decide(now, seen, out);
  return out;
}

void Lifecycle::Decide(MonoTime now, const Observed& seen, Actions& out) {
  ReleaseDecision decision;
  if (!all_shipped_) {
    decision.lapse_reason = lapse_reason_;
  } else if (!seen.store_call_running) {
    decision.release = true;
  } else if (now >= settle_deadline_) {
    decision.lapse_reason = "a store call may still land and extend a lease";
  } else {
    // No new refresh starts now; the running calls get ttl/3 to land.
    Wake(out, std::min(now + kPoll, settle_deadline_));
    return;
  }
  lapse_reason_ = decision.lapse_reason;
  held_at_decision_ = seen.held_ranges;
  stop_step_ = StopStep::kReleasing;
  out.release = std::move(decision);
}

Actions Lifecycle::ReleaseSent(MonoTime now, std::size_t calls, const Observed& seen) {
  Actions out;
  if (phase_ != Phase::kStopping || stop_step_ != StopStep::kReleasing) return out;
  if (!lapse_reason_.empty()) {
    if (held_at_decision_ > 0) {
      Warn(out, "not releasing: " + lapse_reason_ + "; the ranges lapse");
      SetExit(kExitLapsed, "ranges lapse instead of being released: " + lapse_reason_);
    }
    End(out);
    return out;
  }
  if (calls == 0) {
    Info(out, "no range was held; nothing to release");
    End(out);
    return out;
  }
  releases_sent_ = calls;
  release_deadline_ = now + options_.ttl / 3;
  Actions step = Step(now, seen);
  out.log = std::move(step.log);
  out.finish = step.finish;
  out.wake = step.wake;
  return out;
}

void Lifecycle::End(Actions& out) {
  stop_step_ = StopStep::kNone;
  if (stand_by_after_stop_) {
    phase_ = Phase::kFailed;
    Error(out, "serving nothing and claiming nothing: " + failure_ +
                   "; fix the volume, then restart the agent");
    return;
  }
  phase_ = Phase::kStopped;
  out.finish = true;
}

}  // namespace fleetfs::agent
