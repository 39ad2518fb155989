#include "lease/host_ownership.h"

#include <algorithm>
#include <cassert>

#include "lease/lease_ttl.h"

namespace fleetfs::lease {

std::string_view OutcomeName(RangeOutcome outcome) {
  switch (outcome) {
    case RangeOutcome::kNotYet: return "starting";
    case RangeOutcome::kClaimed: return "claimed";
    case RangeOutcome::kRenewed: return "renewed";
    case RangeOutcome::kLost: return "lost";
    case RangeOutcome::kWaiting: return "waiting";
    case RangeOutcome::kFailed: return "failed";
    case RangeOutcome::kTimedOut: return "timed-out";
    case RangeOutcome::kStillRunning: return "still-running";
    case RangeOutcome::kHandedOff: return "handed-off";
  }
  return "unknown";
}

Result<HostOwnership> HostOwnership::Make(OwnerId owner, std::vector<SlotRange> ranges,
                                          Millis ttl) {
  FLEETFS_RETURN_IF_ERROR(CheckConfiguredRanges(ranges));
  FLEETFS_RETURN_IF_ERROR(CheckTtl(ttl));
  return HostOwnership(std::move(owner), std::move(ranges), ttl);
}

HostOwnership::HostOwnership(OwnerId owner, std::vector<SlotRange> ranges, Millis ttl)
    : owner_(std::move(owner)), ttl_(ttl) {
  for (SlotRange range : ranges) states_.emplace_back(range);
}

std::vector<SlotRange> HostOwnership::ranges() const {
  std::vector<SlotRange> ranges;
  for (const auto& state : states_) ranges.push_back(state.range);
  return ranges;
}

std::vector<StoreCall> HostOwnership::BeginRefresh(MonoTime now) {
  assert(!refresh_open_ && "a refresh is ended before the next begins");
  std::vector<StoreCall> calls;
  if (stopping_) return calls;
  refresh_open_ = true;
  for (auto& state : states_) {
    if (state.parked) continue;
    state.holder.reset();
    state.failure.clear();
    if (state.pending) {
      state.outcome = RangeOutcome::kStillRunning;
      state.failure = kStillRunningText;
      continue;
    }
    StoreCall call;
    call.id = next_call_id_++;
    call.range = state.range;
    if (state.held) {
      call.kind = StoreCall::Kind::kRenew;
      call.epoch = *state.held;
    } else {
      call.kind = StoreCall::Kind::kClaim;
      call.floor = state.floor;
    }
    state.pending = call;
    // The send time, not the answer time, bounds the local lease: the store's
    // lease can only have started after it.
    state.pending_sent = now;
    state.pending_in_refresh = true;
    // `outcome` keeps the last answer until this call answers or times out:
    // status shows it meanwhile, so a waiting range does not read as "not
    // claimed yet" (and a standby's /health fail) during every call.
    calls.push_back(call);
  }
  return calls;
}

bool HostOwnership::AllAnswered() const {
  return std::none_of(states_.begin(), states_.end(), [](const RangeState& state) {
    return state.pending && state.pending_in_refresh;
  });
}

void HostOwnership::Answer(std::uint64_t id, const Result<Decision>& answer) {
  auto it = std::find_if(states_.begin(), states_.end(), [&](const RangeState& state) {
    return state.pending && state.pending->id == id;
  });
  if (it == states_.end()) return;
  RangeState& state = *it;
  const StoreCall call = *state.pending;
  const bool in_refresh = state.pending_in_refresh && refresh_open_;
  state.pending.reset();
  state.pending_in_refresh = false;
  if (!in_refresh || stopping_) {
    // Late: a grant sent this long ago must not extend the local lease, and
    // nothing is served once stopping. A loss still drops the range.
    if (answer.ok() && std::holds_alternative<Lost>(*answer)) state.held.reset();
    return;
  }
  Apply(state, call, answer);
}

void HostOwnership::Apply(RangeState& state, const StoreCall& call,
                          const Result<Decision>& answer) {
  if (!answer.ok()) {
    state.outcome = RangeOutcome::kFailed;
    state.failure = answer.status().message();
    return;
  }
  const Decision& decision = *answer;
  if (const auto* grant = std::get_if<Grant>(&decision)) {
    // A replicator saw a newer epoch while the call ran.
    if (grant->epoch.value() < state.floor) {
      state.held.reset();
      state.outcome = RangeOutcome::kLost;
      return;
    }
    const MonoTime valid_until = state.pending_sent + (ttl_ - refresh_interval());
    if (call.kind == StoreCall::Kind::kRenew) {
      // The renew named the held epoch; only Lose drops it meanwhile, and then
      // the floor is above it and the branch above took the grant.
      assert(state.held == grant->epoch);
      state.valid_until = std::max(state.valid_until, valid_until);
      state.outcome = RangeOutcome::kRenewed;
    } else {
      state.held = grant->epoch;
      state.valid_until = valid_until;
      state.outcome = RangeOutcome::kClaimed;
    }
    return;
  }
  if (const auto* held = std::get_if<Held>(&decision)) {
    state.outcome = RangeOutcome::kWaiting;
    state.holder = *held;
    return;
  }
  state.held.reset();
  state.outcome = RangeOutcome::kLost;
}

RefreshReport HostOwnership::EndRefresh() {
  RefreshReport report;
  for (auto& state : states_) {
    if (state.pending && state.pending_in_refresh) {
      // It runs on; its range makes no new call until it answers.
      state.pending_in_refresh = false;
      state.outcome = RangeOutcome::kTimedOut;
      state.failure = kTimedOutText;
    }
    switch (state.outcome) {
      case RangeOutcome::kClaimed: report.claimed.emplace_back(state.range, *state.held); break;
      case RangeOutcome::kRenewed: report.renewed.push_back(state.range); break;
      case RangeOutcome::kLost: report.lost.push_back(state.range); break;
      case RangeOutcome::kWaiting: report.waiting.push_back({state.range, *state.holder}); break;
      case RangeOutcome::kFailed:
      case RangeOutcome::kTimedOut:
      case RangeOutcome::kStillRunning:
        report.failed.emplace_back(state.range, state.failure);
        break;
      case RangeOutcome::kNotYet:
      case RangeOutcome::kHandedOff: break;
    }
  }
  refresh_open_ = false;
  last_report_ = report;
  return report;
}

std::optional<Epoch> HostOwnership::EpochFor(Slot slot, MonoTime now) const {
  for (const auto& state : states_) {
    if (state.range.Contains(slot)) {
      if (state.held && now < state.valid_until && !stopping_) return state.held;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::vector<std::pair<SlotRange, Epoch>> HostOwnership::Serving(MonoTime now) const {
  std::vector<std::pair<SlotRange, Epoch>> serving;
  if (stopping_) return serving;
  for (const auto& state : states_) {
    if (state.held && now < state.valid_until) serving.emplace_back(state.range, *state.held);
  }
  return serving;
}

std::optional<SlotRange> HostOwnership::Lose(Slot slot, Epoch newer) {
  for (auto& state : states_) {
    if (!state.range.Contains(slot)) continue;
    state.floor = std::max(state.floor, newer.value());
    if (state.held && *state.held < newer) {
      state.held.reset();
      state.outcome = RangeOutcome::kLost;
      return state.range;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<MonoTime> HostOwnership::NextLapse(MonoTime now) const {
  std::optional<MonoTime> next;
  for (const auto& state : states_) {
    if (state.held && state.valid_until > now && (!next || state.valid_until < *next)) {
      next = state.valid_until;
    }
  }
  return next;
}

MonoTime HostOwnership::NextWake(MonoTime refresh_started, MonoTime now) const {
  const MonoTime refresh = refresh_started + refresh_interval();
  const auto lapse = NextLapse(now);
  return lapse ? std::min(*lapse, refresh) : refresh;
}

bool HostOwnership::AnyLapsed(MonoTime now) const {
  return std::any_of(states_.begin(), states_.end(), [&](const RangeState& state) {
    return state.held && now >= state.valid_until;
  });
}

bool HostOwnership::Unsettled() const {
  return marked_unsettled_ ||
         std::any_of(states_.begin(), states_.end(),
                     [](const RangeState& state) { return state.pending.has_value() || state.handoff_call; });
}

ReleasePlan HostOwnership::PlanRelease(bool all_shipped) {
  stopping_ = true;
  ReleasePlan plan;
  std::vector<ReleaseCall> held;
  for (auto& state : states_) {
    if (state.held) held.push_back({state.range, *state.held});
    state.held.reset();
  }
  if (Unsettled()) {
    plan.lapse_reason = "a store call may still land and extend a lease";
  } else if (!all_shipped) {
    plan.lapse_reason = "committed transactions are not all shipped to the replica";
  } else {
    plan.calls = std::move(held);
  }
  return plan;
}

Result<HostOwnership::HandoffStart> HostOwnership::StartHandoff(SlotRange range) {
  for (auto& state : states_) {
    if (state.range != range) continue;
    HandoffStart start;
    if (state.pending || state.handoff_call) {
      start.wait = true;
      return start;
    }
    if (state.held) {
      start.release = ReleaseCall{state.range, *state.held};
      state.handoff_call = true;
    }
    state.unpark_when_answered = false;
    state.held.reset();
    state.parked = true;
    state.outcome = RangeOutcome::kHandedOff;
    state.holder.reset();
    state.failure.clear();
    return start;
  }
  return InvalidArgument("slot range " + range.ToString() +
                         " is not one of this agent's configured ranges; a handoff takes "
                         "exactly a configured range");
}

void HostOwnership::HandoffAnswered(SlotRange range) {
  for (auto& state : states_) {
    if (state.range != range || !state.handoff_call) continue;
    state.handoff_call = false;
    if (state.unpark_when_answered) {
      state.unpark_when_answered = false;
      Unpark(range);
    }
  }
}

bool HostOwnership::ParkUnheld(SlotRange range) {
  for (auto& state : states_) {
    if (state.range != range) continue;
    if (state.held || state.pending || state.handoff_call) return false;
    state.parked = true;
    state.outcome = RangeOutcome::kHandedOff;
    state.holder.reset();
    state.failure.clear();
    return true;
  }
  return false;
}

void HostOwnership::Unpark(SlotRange range) {
  for (auto& state : states_) {
    if (state.range == range && state.parked && state.handoff_call) {
      state.unpark_when_answered = true;
    } else if (state.range == range && state.parked) {
      state.parked = false;
      state.outcome = RangeOutcome::kNotYet;
    }
  }
}

void HostOwnership::UnparkAll() {
  for (auto& state : states_) Unpark(state.range);
}

bool HostOwnership::parked(SlotRange range) const {
  return std::any_of(states_.begin(), states_.end(), [&](const RangeState& state) {
    return state.range == range && state.parked;
  });
}

std::vector<SlotRange> HostOwnership::UnheldRanges() const {
  std::vector<SlotRange> out;
  if (stopping_) return out;
  for (const auto& state : states_) {
    if (!state.held) out.push_back(state.range);
  }
  return out;
}

std::vector<RangeStatus> HostOwnership::Status(MonoTime now) const {
  std::vector<RangeStatus> out;
  for (const auto& state : states_) {
    RangeStatus status;
    status.range = state.range;
    status.epoch = state.held;
    status.serving = !stopping_ && state.held && now < state.valid_until;
    if (status.serving) {
      status.lease_left = std::chrono::duration_cast<Millis>(state.valid_until - now);
      status.valid_until = state.valid_until;
    }
    status.last = state.outcome;
    status.holder = state.holder;
    status.failure = state.failure;
    status.call_running = state.pending.has_value() || state.handoff_call;
    status.fence_floor = state.floor;
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace fleetfs::lease
