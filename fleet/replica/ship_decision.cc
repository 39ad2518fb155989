#include "fleet/replica/ship_decision.h"

namespace fleetfs::replica {

std::string_view ShipActionName(ShipAction action) {
  switch (action) {
    case ShipAction::kNothing:
      return "nothing";
    case ShipAction::kCheck:
      return "check";
    case ShipAction::kMarker:
      return "marker";
    case ShipAction::kSnapshot:
      return "snapshot";
    case ShipAction::kSegment:
      return "segment";
    case ShipAction::kTombstone:
      return "tombstone";
    case ShipAction::kStop:
      return "stop";
  }
  return "unknown";
}

ShipDecision Decide(const ShipInputs& in) {
  if (in.fenced) return {ShipAction::kStop, "a newer epoch took the log"};
  // Commits acknowledged under the log's epoch ship under it even after the
  // lease ended (a lapse, a new epoch not yet checked): losing them would
  // lose acknowledged commits, and a newer owner's marker refuses them.
  const bool appendable = in.log_epoch && in.appendable && in.matches_tail;
  if (appendable && (!in.serving_epoch || *in.serving_epoch > *in.log_epoch)) {
    return {ShipAction::kSegment, "commits of the log's epoch ship under it first"};
  }
  if (!in.serving_epoch) return {ShipAction::kNothing, "the key is not served here"};
  const std::uint64_t epoch = *in.serving_epoch;
  if (in.log_epoch && *in.log_epoch > epoch) {
    return {ShipAction::kNothing, "the log was taken at a newer epoch than the one served"};
  }
  // Item 1: nothing ships under an epoch before the file was checked against
  // the log under it, even once the marker is written (a restore writes it
  // before its download, and the stale file it replaces is still there).
  if (in.checked_epoch != epoch) {
    return {ShipAction::kCheck, "the file is not yet checked against the log at this epoch"};
  }
  if (in.log_epoch != epoch) {
    return {ShipAction::kMarker, "the file was checked at this epoch; the log is not yet taken"};
  }
  if (in.deleted) return {ShipAction::kTombstone, "the file was deleted"};
  if (in.unshippable) {
    if (appendable) return {ShipAction::kSegment, "commits from before the switch still ship"};
    return {ShipAction::kNothing, "the journal mode leaves no trace of a transaction's end"};
  }
  if (in.gap) {
    if (appendable) return {ShipAction::kSegment, "commits from before the gap ship first"};
    return {ShipAction::kSnapshot, "a capture failed: the commits have a gap"};
  }
  if (!in.matches_tail)
    return {ShipAction::kSnapshot, "the file is not the state of the log's tail"};
  if (in.snapshot_due) return {ShipAction::kSnapshot, "a snapshot is due"};
  if (in.commits_waiting) return {ShipAction::kSegment, "commits are waiting"};
  return {ShipAction::kNothing, "nothing to ship"};
}

}  // namespace fleetfs::replica
