#include "agent/handoff.h"

#include <algorithm>

#include "lease/lease_ttl.h"

namespace fleetfs::agent {
namespace {

void Log(HandoffActions& out, LogLine::Level level, std::string text) {
  out.log.push_back(LogLine{level, std::move(text)});
}

Result<lease::OwnerId> ParseTarget(std::string_view word) {
  auto owner = lease::OwnerId::Make(word);
  if (!owner.ok()) {
    return InvalidArgument("target owner '" + lease::Printable(word) +
                           "': " + owner.status().message());
  }
  return *owner;
}

}  // namespace

Result<ControlRequest> ParseControlRequest(std::string_view text) {
  if (text.size() > kMaxControlRequestBytes) {
    return InvalidArgument("a control request is at most " +
                           std::to_string(kMaxControlRequestBytes) + " bytes; this one has " +
                           std::to_string(text.size()));
  }
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.find('\n') != std::string_view::npos) {
    return InvalidArgument("a control request is one line; this one has several");
  }
  const std::string usage =
      "; a request is 'handoff RANGE to OWNER', 'drain to OWNER', 'drain release' or 'undo'";
  // The owner is the rest of the line after "to ": an owner id may hold
  // inner spaces, and may even read like a keyword, so it is never split or
  // compared with one. The words before it are split by single spaces.
  std::optional<std::string_view> owner;
  std::string_view head = text;
  if (const std::size_t to = text.find(" to "); to != std::string_view::npos) {
    head = text.substr(0, to);
    owner = text.substr(to + 4);
  } else if (text.ends_with(" to")) {
    return InvalidArgument("control request '" + lease::Printable(text) +
                           "': 'to' is followed by the owner" + usage);
  }
  std::vector<std::string_view> words;
  std::size_t start = 0;
  while (true) {
    const std::size_t space = head.find(' ', start);
    words.push_back(head.substr(start, space == std::string_view::npos ? space : space - start));
    if (space == std::string_view::npos) break;
    start = space + 1;
  }
  for (std::string_view word : words) {
    if (word.empty()) {
      return InvalidArgument("control request '" + lease::Printable(text) +
                             "': words are separated by single spaces, with none at either end");
    }
  }
  ControlRequest request;
  const std::string_view verb = words.front();
  if (verb == "handoff") {
    if (words.size() != 2 || !owner) {
      return InvalidArgument("control request 'handoff' takes a range and 'to OWNER'" + usage);
    }
    auto range = lease::SlotRange::Parse(words[1]);
    if (!range.ok()) return range.status();
    FLEETFS_ASSIGN_OR_RETURN(request.to, ParseTarget(*owner));
    request.verb = ControlRequest::Verb::kHandoff;
    request.range = *range;
    return request;
  }
  if (verb == "drain") {
    request.verb = ControlRequest::Verb::kDrain;
    if (words.size() == 1 && owner) {
      FLEETFS_ASSIGN_OR_RETURN(request.to, ParseTarget(*owner));
      return request;
    }
    if (words.size() == 2 && words[1] == "release" && !owner) return request;
    return InvalidArgument("control request 'drain' takes 'to OWNER', or 'release' for no target" +
                           usage);
  }
  if (verb == "undo") {
    if (words.size() != 1 || owner) {
      return InvalidArgument("control request 'undo' takes nothing" + usage);
    }
    request.verb = ControlRequest::Verb::kUndo;
    return request;
  }
  return InvalidArgument("control request '" + lease::Printable(verb.substr(0, 40)) +
                         "' is unknown" + usage);
}

std::string FormatControlRequest(const ControlRequest& request) {
  switch (request.verb) {
    case ControlRequest::Verb::kHandoff:
      return "handoff " + request.range->ToString() + " to " + request.to->str() + "\n";
    case ControlRequest::Verb::kDrain:
      return request.to ? "drain to " + request.to->str() + "\n" : "drain release\n";
    case ControlRequest::Verb::kUndo: return "undo\n";
  }
  return "";
}

std::string Handoffs::FormatMs(Millis ms) { return lease::FormatDuration(ms); }

std::string Handoffs::Describe(lease::SlotRange range, const One& h) {
  return "handoff of range " + range.ToString() +
         (h.to ? " to '" + h.to->str() + "'" : std::string(" (released, no target)"));
}

Status CheckControl(const ControlRequest& request, bool keeps_offers, bool replicating) {
  if (!request.to) return Status::Ok();
  if (!keeps_offers) {
    return InvalidArgument("the store keeps no offers, so a handoff to an owner is not possible "
                           "there; 'fleetfs drain' without --to releases the ranges instead");
  }
  if (!replicating) {
    return InvalidArgument("replication is off (no replica configured), so a handoff to '" +
                           request.to->str() +
                           "' would move no data; configure a replica, or release with "
                           "'fleetfs drain' without --to");
  }
  return Status::Ok();
}

Status Handoffs::Check(lease::SlotRange range, const std::optional<lease::OwnerId>& to,
                       const std::vector<lease::RangeStatus>& status,
                       const lease::OwnerId& self) const {
  if (to && *to == self) {
    return InvalidArgument("target owner '" + to->str() +
                           "' is this agent; a handoff goes to another owner");
  }
  const auto configured = std::find_if(status.begin(), status.end(),
                                       [&](const lease::RangeStatus& st) { return st.range == range; });
  if (configured == status.end()) {
    std::string ranges;
    for (const auto& st : status) ranges += (ranges.empty() ? "" : ",") + st.range.ToString();
    return InvalidArgument("slot range " + range.ToString() +
                           " is not one of this agent's configured ranges (" + ranges +
                           "); a handoff takes exactly a configured range");
  }
  if (auto it = handoffs_.find(range); it != handoffs_.end()) {
    if (it->second.step != StepKind::kAbandoned) {
      return InvalidArgument("slot range " + range.ToString() +
                             " is being handed off already, or was (undo it with "
                             "'fleetfs drain --undo')");
    }
    if (it->second.job_running) {
      return InvalidArgument("slot range " + range.ToString() +
                             ": the previous handoff is still finishing its fences and flush; "
                             "try again in a moment");
    }
  }
  if (!configured->serving) {
    return InvalidArgument("slot range " + range.ToString() +
                           " is not served by this agent now; only a served range is handed off");
  }
  return Status::Ok();
}

Result<Handoffs::DrainPlan> Handoffs::PlanDrain(const std::optional<lease::OwnerId>& to,
                                                const std::vector<lease::RangeStatus>& status,
                                                const lease::OwnerId& self) const {
  DrainPlan plan;
  for (const lease::RangeStatus& st : status) {
    if (st.serving) {
      FLEETFS_RETURN_IF_ERROR(Check(st.range, to, status, self));
      plan.hand_off.push_back(st.range);
    } else if (st.epoch) {
      return InvalidArgument(
          "slot range " + st.range.ToString() +
          " is held but not served now (its renewals fail), so its commits cannot be flushed; "
          "nothing was started: drain again once it serves, or let its lease lapse");
    } else if (st.call_running) {
      return InvalidArgument("slot range " + st.range.ToString() +
                             " has a store call running; nothing was started: try again in "
                             "a moment");
    } else {
      plan.park.push_back(st.range);
    }
  }
  return plan;
}

Status Handoffs::Drain(MonoTime now, const DrainPlan& plan,
                       const std::optional<lease::OwnerId>& to,
                       const std::vector<lease::RangeStatus>& status,
                       const lease::OwnerId& self) {
  for (lease::SlotRange range : plan.hand_off) {
    FLEETFS_RETURN_IF_ERROR(Request(now, range, to, status, self));
  }
  drained_.insert(plan.hand_off.begin(), plan.hand_off.end());
  drained_.insert(plan.park.begin(), plan.park.end());
  return Status::Ok();
}

Status Handoffs::Request(MonoTime now, lease::SlotRange range,
                         const std::optional<lease::OwnerId>& to,
                         const std::vector<lease::RangeStatus>& status,
                         const lease::OwnerId& self) {
  FLEETFS_RETURN_IF_ERROR(Check(range, to, status, self));
  One h;
  h.to = to;
  h.step = StepKind::kDraining;
  h.drain_deadline = now + options_.shutdown_grace;
  handoffs_[range] = std::move(h);
  return Status::Ok();
}

void Handoffs::StartStopWork(MonoTime now, lease::SlotRange range, One& h, std::size_t open,
                             HandoffActions& out) {
  if (open > 0) {
    Log(out, LogLine::Level::kWarn,
        Describe(range, h) + ": " + std::to_string(open) +
            " handles still open after the shutdown grace; fencing them");
  }
  h.step = StepKind::kStopWork;
  h.job_running = true;
  h.stop_deadline = now + options_.flush_limit;
  out.publish = true;
  out.stop_work.push_back(range);
  Wake(out, h.stop_deadline);
}

void Handoffs::Abandon(lease::SlotRange range, One& h, std::string why, HandoffActions& out) {
  h.step = StepKind::kAbandoned;
  h.note = why;
  out.publish = true;
  Log(out, LogLine::Level::kWarn,
      Describe(range, h) + " abandoned: " + why + "; serving the range again");
}

HandoffActions Handoffs::StopWorkDone(MonoTime now, lease::SlotRange range, bool all_shipped,
                                      bool may_call_store) {
  (void)now;
  HandoffActions out;
  auto it = handoffs_.find(range);
  if (it == handoffs_.end()) return out;
  it->second.job_running = false;
  if (it->second.step != StepKind::kStopWork) return out;  // abandoned: too late
  if (!all_shipped) {
    Abandon(range, it->second, "committed transactions are not all shipped to the replica", out);
    return out;
  }
  if (!may_call_store) {
    // The range is still held: the shutdown's release (or lapse) takes it
    // with the others, under the same rule.
    it->second.step = StepKind::kDone;
    it->second.note = "the agent is stopping; the range goes with its release, not offered";
    Log(out, LogLine::Level::kInfo,
        Describe(range, it->second) + ": fenced, and every commit is shipped; " +
            it->second.note);
    return out;
  }
  Log(out, LogLine::Level::kInfo,
      Describe(range, it->second) + ": fenced, and every commit is shipped; releasing");
  it->second.step = StepKind::kReleasing;
  out.release.push_back(range);
  return out;
}

HandoffActions Handoffs::ReleaseWaits(MonoTime now, lease::SlotRange range) {
  HandoffActions out;
  auto it = handoffs_.find(range);
  if (it == handoffs_.end() || it->second.step != StepKind::kReleasing) return out;
  it->second.step = StepKind::kReleaseWait;
  it->second.undone = false;  // nothing was sent, so nothing was unparked
  Wake(out, now + Millis(20));
  return out;
}

HandoffActions Handoffs::Released(MonoTime now, lease::SlotRange range, bool sent,
                                  const Result<bool>& answer) {
  HandoffActions out;
  auto it = handoffs_.find(range);
  if (it == handoffs_.end() || it->second.step != StepKind::kReleasing) return out;
  One& h = it->second;
  if (h.undone) {
    // HostOwnership unparked the range at this answer: keeping the handoff
    // would withhold a range this host claims again (held, never served).
    // An offer the store took still stands: it refuses this host's claim
    // until the target takes the range or the window ends.
    std::string answered = !sent          ? "nothing was held"
                           : !answer.ok() ? "the store did not confirm (" +
                                                answer.status().message() + ")"
                           : !*answer     ? "the store no longer held it for this agent"
                           : h.to         ? "the offer to '" + h.to->str() + "' stands its window"
                                          : "released";
    Log(out, LogLine::Level::kInfo,
        Describe(range, h) + " undone while it was out (" + answered +
            "); claiming the range again");
    handoffs_.erase(it);
    out.publish = true;
    out.claim.push_back(range);
    return out;
  }
  h.step = StepKind::kDone;
  if (!sent) {
    h.note = "the range was not held; nothing to release";
  } else if (!answer.ok()) {
    // Parked all the same: not served here, and its lease lapses within a ttl.
    h.note = "the store did not confirm (" + answer.status().message() +
             "); the lease lapses within a ttl instead";
    Log(out, LogLine::Level::kWarn, Describe(range, h) + ": " + h.note);
    return out;
  } else if (!*answer) {
    h.note = "the store no longer held the range for this agent at its epoch";
  } else {
    h.note = h.to ? "offered to '" + h.to->str() + "'" : "released";
    if (h.to) h.offer_end = now + options_.offer_window;
  }
  Log(out, LogLine::Level::kInfo, Describe(range, h) + ": done, " + h.note);
  return out;
}

std::set<lease::SlotRange> Handoffs::draining() const {
  std::set<lease::SlotRange> out;
  for (const auto& [range, h] : handoffs_) {
    if (h.step == StepKind::kDraining) out.insert(range);
  }
  return out;
}

std::set<lease::SlotRange> Handoffs::withheld() const {
  std::set<lease::SlotRange> out;
  for (const auto& [range, h] : handoffs_) {
    if (h.step != StepKind::kDraining && h.step != StepKind::kAbandoned) out.insert(range);
  }
  return out;
}

bool Handoffs::running() const {
  return std::any_of(handoffs_.begin(), handoffs_.end(), [](const auto& entry) {
    return entry.second.step != StepKind::kDone && entry.second.step != StepKind::kAbandoned;
  });
}

std::vector<HandoffStatus> Handoffs::Report() const {
  std::vector<HandoffStatus> out;
  for (const auto& [range, h] : handoffs_) {
    HandoffStatus st;
    st.range = range;
    st.to = h.to ? h.to->str() : "";
    switch (h.step) {
      case StepKind::kDraining: st.state = "draining"; break;
      case StepKind::kStopWork: st.state = "fencing"; break;
      case StepKind::kReleasing:
      case StepKind::kReleaseWait: st.state = "releasing"; break;
      case StepKind::kDone: st.state = "done"; break;
      case StepKind::kAbandoned: st.state = "abandoned"; break;
    }
    st.note = h.note;
    out.push_back(std::move(st));
  }
  return out;
}

std::vector<lease::SlotRange> Handoffs::Undo() {
  std::vector<lease::SlotRange> out;
  drained_.clear();
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    if (it->second.step == StepKind::kDone || it->second.step == StepKind::kAbandoned) {
      out.push_back(it->first);
      // Kept while its job runs, so a new handoff waits for that job.
      it = it->second.job_running ? std::next(it) : handoffs_.erase(it);
    } else {
      if (it->second.step == StepKind::kReleasing) it->second.undone = true;
      ++it;
    }
  }
  return out;
}

bool Handoffs::AwaitsOfferEnd(MonoTime now) const {
  return std::any_of(handoffs_.begin(), handoffs_.end(), [&](const auto& entry) {
    const One& h = entry.second;
    return h.step == StepKind::kDone && h.offer_end && now >= *h.offer_end;
  });
}

std::vector<lease::SlotRange> Handoffs::OffersNotTaken(MonoTime now,
                                                       const lease::OwnershipTable& table,
                                                       const lease::OwnerId& self,
                                                       std::int64_t store_now,
                                                       std::vector<LogLine>& log) {
  std::vector<lease::SlotRange> out;
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    One& h = it->second;
    bool lapsed = false;
    if (h.step == StepKind::kDone && h.offer_end && now >= *h.offer_end) {
      const auto overlapping = [&](auto&& also) {
        return std::any_of(table.rows().begin(), table.rows().end(),
                           [&](const lease::OwnershipRow& row) {
                             return row.range.Overlaps(it->first) && also(row);
                           });
      };
      if (overlapping([&](const lease::OwnershipRow& row) { return row.owner != self; })) {
        // Taken (the target's row, live or since lapsed, or anyone's after
        // the window): the range stays parked here, and the offer poll need
        // not read the rows for it any more.
        h.offer_end.reset();
      } else {
        lapsed = !overlapping([&](const lease::OwnershipRow& row) {
          return row.lease_expires_ms > store_now ||
                 (row.offered_to && row.offer_expires_ms > store_now);
        });
      }
    }
    if (!lapsed) {
      ++it;
      continue;
    }
    log.push_back(LogLine{LogLine::Level::kWarn,
                          Describe(it->first, h) + ": nobody took the offer within " +
                              FormatMs(options_.offer_window) +
                              "; claiming the range again"});
    out.push_back(it->first);
    it = handoffs_.erase(it);
  }
  return out;
}

bool Handoffs::Forget(lease::SlotRange range) {
  if (drained_.contains(range)) return false;
  auto it = handoffs_.find(range);
  if (it == handoffs_.end()) return true;
  if (it->second.step != StepKind::kDone && it->second.step != StepKind::kAbandoned) return false;
  if (it->second.job_running) return false;
  handoffs_.erase(it);
  return true;
}

bool OfferWatch::Due(MonoTime now, const std::vector<lease::SlotRange>& unheld) {
  if (reading_ || unheld.empty() || now < last_ + interval_) return false;
  reading_ = true;
  last_ = now;
  return true;
}

MonoTime OfferWatch::next(const std::vector<lease::SlotRange>& unheld) const {
  if (reading_ || unheld.empty()) return MonoTime::max();
  return last_ + interval_;
}

std::vector<lease::SlotRange> OfferWatch::Answered(const Result<lease::OwnershipTable>& table,
                                                   const std::vector<lease::SlotRange>& unheld,
                                                   const lease::OwnerId& self,
                                                   std::int64_t store_now) {
  reading_ = false;
  std::vector<lease::SlotRange> offered;
  if (!table.ok()) return offered;  // the refresh reports a failing store
  const auto& rows = table->rows();
  auto standing = [&](const lease::OwnershipRow& row) {
    return row.offered_to && *row.offered_to == self && row.offer_expires_ms > store_now &&
           row.lease_expires_ms <= store_now;
  };
  std::set<std::pair<lease::SlotRange, lease::Epoch>> still;
  for (const lease::OwnershipRow& row : rows) {
    if (standing(row)) still.insert({row.range, row.epoch});
  }
  // Offers gone from the store are forgotten; the rest are reported once.
  std::erase_if(reported_, [&](const auto& key) { return still.count(key) == 0; });
  for (lease::SlotRange range : unheld) {
    for (const lease::OwnershipRow& row : rows) {
      if (!standing(row)) continue;
      const bool inside = range.first() <= row.range.first() && row.range.last() <= range.last();
      if (!inside) continue;
      if (row.range != range) {
        const bool other_live = std::any_of(rows.begin(), rows.end(), [&](const auto& other) {
          return !(other.range == row.range) && other.range.Overlaps(range) &&
                 (other.lease_expires_ms > store_now || other.OfferedAwayFrom(self, store_now));
        });
        if (other_live) continue;
      }
      if (!reported_.insert({row.range, row.epoch}).second) continue;
      offered.push_back(range);
      break;
    }
  }
  return offered;
}

}  // namespace fleetfs::agent
