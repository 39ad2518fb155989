// Reading a key's replica log (DESIGN 5, "The replica log"): its listing,
// one object's header or chain checksum, a restore to a point in time, and
// the retention plan that keeps every commit within retention restorable.
//
// A restore lists the log once, reads headers from the tail backwards to the
// newest snapshot at or before the point in time, then reads that snapshot
// and the objects after it in sequence order, verifying the chain (each
// object's `prev` is the checksum of the one before) and applying segments.
// Markers carry no data; a tombstone ends the key and a later snapshot
// revives it. Epochs never decrease along a log (the newest epoch is its
// tail): a decrease is corruption. Objects are untrusted: every error is
// DataLoss (or the destination's own code) and names the object.
//
// Memory: one segment at a time; a snapshot streams to the output file.
//
// Thread-safety: functions over a Destination, which is thread-safe;
// PlanRetention is pure.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/replica/destination.h"
#include "fleet/replica/log_object.h"
#include "fleet/status.h"

namespace fleetfs::replica {

// The sequences in log directory `dir` that sort after `after` (nullopt: the
// whole log), ascending: one listing. FailedPrecondition when the directory
// holds the old layout's generations; DataLoss naming an entry that is no log
// object.
Result<std::vector<std::uint64_t>> ListLog(Destination& dest, std::string_view dir,
                                           std::optional<std::uint64_t> after = std::nullopt);

// The header of object `seq` of log `dir`: one ranged read of
// kMaxLogHeaderBytes, checked against the key, the sequence of its name and
// `max_epoch` (the highest epoch the store ever granted). Errors name the
// object.
Result<LogHeader> ReadLogHeader(Destination& dest, std::string_view dir, std::uint64_t seq,
                                std::uint64_t max_epoch);

// An object's header with its chain checksum (ObjectChecksum of all its
// bytes), read streaming: the whole object once, never whole in memory.
// Checks the header as ReadLogHeader does and that the object is as long as
// its header declares.
struct LogObjectSum {
  LogHeader header;
  std::uint64_t checksum = 0;
};
Result<LogObjectSum> ReadLogObjectSum(Destination& dest, std::string_view dir, std::uint64_t seq,
                                      std::uint64_t max_epoch);

enum class LogRestoreResult { kRestored, kNoReplica, kDeleted };
std::string_view LogRestoreResultName(LogRestoreResult r);

struct LogRestoreOutcome {
  LogRestoreResult result = LogRestoreResult::kNoReplica;
  // The log's tail when it was listed (none for an empty log): its newest
  // epoch, which a new owner's marker must not be below.
  std::optional<std::uint64_t> tail_seq;
  std::uint64_t tail_epoch = 0;
  // The tail's chain checksum, when the restore read through to the tail
  // (always without a point in time): what a writer continuing the log
  // needs as `prev`.
  std::optional<std::uint64_t> tail_checksum;
  // The object whose state was restored: the last one applied (a segment,
  // the snapshot, or a marker after them), or the tombstone for kDeleted.
  std::optional<std::uint64_t> as_of_seq;
  WallMs as_of_ms = 0;        // the last commit applied (or the snapshot's, or the deletion)
  std::uint64_t commits = 0;  // transactions applied after the snapshot
  std::uint64_t bytes = 0;    // database size
  SnapshotOwner owner;        // of the file the snapshot was taken from
};

// Called with the object bytes read so far and the total to read.
using LogProgress = std::function<void(std::uint64_t done, std::uint64_t total)>;

// Rebuilds the database of log `dir` into `out_fd` (an empty file the caller
// owns, open for reading and writing): the log's newest state, or at `at_ms`
// the state after every commit up to that time.
// - kNoReplica: the log is empty, holds no snapshot, or began after `at_ms`;
// - kDeleted: a tombstone (at or before `at_ms`) follows the snapshot taken;
// both leave `out_fd` empty.
// FailedPrecondition when `at_ms` falls before what retention kept (the log
// begins after sequence 0 and no kept snapshot is that old). On any error
// `out_fd` holds no database and the caller discards it.
Result<LogRestoreOutcome> RestoreFromLog(Destination& dest, std::string_view dir,
                                         std::optional<WallMs> at_ms, int out_fd,
                                         std::uint64_t max_epoch,
                                         const LogProgress& progress = nullptr);

// Retention: the sequences to delete from a log whose headers are `headers`
// (ascending sequence; the listing's whole log) so that every state at or
// after `cutoff_ms` stays restorable: everything before the newest snapshot
// whose as-of is at or before the cutoff. Nothing when there is no such
// snapshot; never the tail. Ascending, so a prune that stops halfway leaves
// a log that still restores.
std::vector<std::uint64_t> PlanRetention(const std::vector<LogHeader>& headers, WallMs cutoff_ms);

// The shell around PlanRetention: lists the log, reads every header, and
// removes what the plan names, oldest first. Returns how many it removed.
Result<int> PruneLog(Destination& dest, std::string_view dir, WallMs cutoff_ms,
                     std::uint64_t max_epoch);

}  // namespace fleetfs::replica
