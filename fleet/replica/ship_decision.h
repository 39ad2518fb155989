// What a key's replicator ships next: a pure decision over what it knows
// (DESIGN 5; issue 10 items 1 and 12). The caller gathers the inputs, does
// the I/O the decision names (LogWriter, capture, the check), updates the
// inputs and asks again; nothing here touches a file or the destination.
//
// The rules, first match wins:
//   fenced (a newer epoch took the log)             → stop
//   not served, or served above the log's epoch,
//     with appendable commits                       → segment (at the log's epoch)
//   not served                                      → nothing
//   the log taken at a newer epoch than served      → nothing (the view lags)
//   the file not yet checked at the served epoch    → check
//   the log not yet taken at the served epoch       → marker
//   deleted through the mount                       → tombstone
//   unshippable (journal_mode OFF or MEMORY)        → segment if appendable
//                                                     (from before the switch),
//                                                     else nothing
//   a capture failed (a gap in the commits)         → segment if appendable
//                                                     (from before the gap),
//                                                     else snapshot
//   the file is not the log tail's state            → snapshot
//   a snapshot is due                               → snapshot
//   commits waiting                                 → segment
//   otherwise                                       → nothing
//
// So nothing ships under a new epoch before the file was checked against the
// log under that epoch and the marker written (item 1), and a restart whose
// file is the tail's state continues the log with segments, with no
// snapshot it does not need (item 12).
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fleetfs::replica {

struct ShipInputs {
  // The epoch the key is served at now; nullopt when this host does not serve it.
  std::optional<std::uint64_t> serving_epoch;
  // The epoch whose marker this host wrote in the key's log (LogWriter::shipping).
  std::optional<std::uint64_t> log_epoch;
  // The epoch at which the local file was last checked (or restored) against
  // the log.
  std::optional<std::uint64_t> checked_epoch;
  // The log's writer found a newer epoch at its sequence.
  bool fenced = false;
  // The file was deleted through the mount and its tombstone is not shipped.
  bool deleted = false;
  // journal_mode OFF or MEMORY: a transaction's end leaves no trace, so
  // nothing is shipped that could be torn.
  bool unshippable = false;
  // A capture failed: the commits waiting do not follow the log's tail.
  bool gap = false;
  // The state the log's tail leaves is the local file's before the commits
  // waiting (the checksum of the shipped state matches).
  bool matches_tail = false;
  // Captured commits not yet shipped.
  bool commits_waiting = false;
  // Of them, some follow the log's tail with no gap between (captured before
  // any gap, after a snapshot under this host's marker): the log can take
  // them as a segment at its epoch whatever is served now, since a newer
  // owner's marker refuses them at the destination.
  bool appendable = false;
  // The snapshot interval passed and segments were shipped since the last
  // snapshot.
  bool snapshot_due = false;
};

enum class ShipAction {
  kNothing,
  kCheck,   // check (or restore) the file against the log at the serving epoch
  kMarker,  // take the log over: LogWriter::WriteMarker
  kSnapshot,
  kSegment,
  kTombstone,
  kStop,  // fenced: ship nothing more, report the epoch
};
std::string_view ShipActionName(ShipAction action);

struct ShipDecision {
  ShipAction action = ShipAction::kNothing;
  std::string_view why;  // the rule that decided, for logs and status
};

ShipDecision Decide(const ShipInputs& in);

}  // namespace fleetfs::replica
