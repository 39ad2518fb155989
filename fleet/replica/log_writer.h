// LogWriter: one key's writer of its create-only replica log (DESIGN 5).
//
// It holds the key's position: the next sequence, the checksum of the object
// before it, and the epoch it writes under. Every object is a Create at the
// next sequence, so of an old owner and a new one racing for a sequence
// exactly one wins, and no listing is needed before an upload:
//
//   Takeover(epoch)   lists the log once, from the last sequence the writer
//                     knows, and returns the tail (sequence, header,
//                     checksum); the caller restores or checks its file
//                     against it.
//   WriteMarker()     writes the marker at the next sequence. From then on an
//                     older owner's next upload finds its sequence taken.
//   Append(object)    one Create; nothing else in the steady state.
//
// What a taken sequence means is returned as data, never guessed:
// - the object there is ours (its checksum equals ours: an earlier Create
//   that failed after it landed) → appended;
// - its epoch is above ours and at most `max_epoch` → fenced by that epoch;
// - its epoch is above `max_epoch` (above anything the store ever granted),
//   its header is bad, or its epoch is below ours after our marker → corrupt,
//   never a fence;
// - while writing the marker, an older epoch's late object → the caller
//   re-checks its file against that new tail and writes the marker again.
// A fenced or corrupt writer stays so (every later write says the same)
// until a Takeover at a new epoch.
//
// Errors of the destination (Unavailable, IoError) are returned as Status
// and leave the position where it was: the caller retries the same object,
// which either lands or finds its own earlier create.
//
// Nothing ships under an epoch before that epoch's marker (DESIGN 5; issue
// 10 item 1): Append before WriteMarker succeeds is FailedPrecondition.
//
// Thread-safety: one writer per key, used by one thread at a time (a key's
// uploads are sequential); not internally synchronized. Writers of different
// keys, or of one key on different hosts, share a Destination safely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fleet/clock.h"
#include "fleet/replica/destination.h"
#include "fleet/replica/log_object.h"
#include "fleet/status.h"

namespace fleetfs::replica {

// The newest object of a key's log.
struct LogTail {
  std::uint64_t seq = 0;
  LogHeader header;
  std::uint64_t checksum = 0;  // ObjectChecksum of the whole object
};

enum class LogWriteKind {
  kAppended,      // the object is at its sequence; the position moved past it
  kTakenByOlder,  // (marker only) an older epoch's late object took the
                  // sequence: `tail` is it; re-check, then WriteMarker again
  kFenced,        // a newer epoch took the sequence: `fenced_by` is it
  kCorrupt,       // the object at the sequence cannot be trusted: `problem`
};
std::string_view LogWriteKindName(LogWriteKind kind);

struct LogWriteOutcome {
  LogWriteKind kind = LogWriteKind::kAppended;
  std::uint64_t seq = 0;        // the sequence written or found taken
  bool found_own = false;       // kAppended by finding our earlier create
  std::uint64_t fenced_by = 0;  // kFenced
  std::optional<LogTail> tail;  // kTakenByOlder
  Status problem;               // kCorrupt: DataLoss naming the object
};

enum class TakeoverKind {
  kReady,    // `tail` (nullopt: an empty log) is what the caller checks against
  kFenced,   // the tail's epoch is above ours: `fenced_by`
  kCorrupt,  // `problem`
};

struct TakeoverOutcome {
  TakeoverKind kind = TakeoverKind::kReady;
  std::optional<LogTail> tail;
  std::uint64_t fenced_by = 0;
  Status problem;
};

class LogWriter {
 public:
  // `dest` must outlive the writer. `dir` is the key's log directory (its
  // key, LogDir).
  LogWriter(Destination& dest, std::string dir);
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  // Takes the log at `epoch` (≥ 1, ≤ `max_epoch`): one listing from the last
  // sequence this writer knows, then the tail's header and checksum (the
  // tail read whole, streaming). Resets a fenced or corrupt writer.
  Result<TakeoverOutcome> Takeover(std::uint64_t epoch, std::uint64_t max_epoch);

  // Writes the marker at the next sequence after the tail Takeover returned
  // (or after the tail a kTakenByOlder outcome returned). FailedPrecondition
  // without a Takeover.
  Result<LogWriteOutcome> WriteMarker(WallMs now_ms, std::uint64_t max_epoch);

  // Where the next object goes: encode it at this position
  // (EncodeLogSegment(writer.position(), ...), WriteLogSnapshot, ...).
  const LogPosition& position() const { return at_; }
  // True once the marker at the current epoch is written (Append may run).
  bool shipping() const { return state_ == State::kShipping; }

  // Creates `object` (encoded at position()) at the next sequence.
  Result<LogWriteOutcome> Append(const EncodedLogObject& object, std::uint64_t max_epoch);
  // Creates the object in `fd` (a snapshot written at position() by
  // WriteLogSnapshot, whose returned checksum is `checksum`) at the next
  // sequence.
  Result<LogWriteOutcome> AppendFile(int fd, std::uint64_t checksum, std::uint64_t max_epoch);

 private:
  enum class State { kIdle, kTakenOver, kShipping, kFenced, kCorrupt };

  // Checks that `head` is an object encoded at the current position.
  Status CheckOurs(std::string_view head, LogKind* kind) const;
  // After a Create: `created` is its status.
  Result<LogWriteOutcome> Settle(Status created, std::uint64_t checksum, bool marker,
                                 std::uint64_t max_epoch);
  LogWriteOutcome Stop(LogWriteOutcome outcome);
  std::string PathAt(std::uint64_t seq) const;

  Destination& dest_;
  const std::string dir_;
  LogPosition at_;  // key = dir_; epoch, next seq, prev
  State state_ = State::kIdle;
  // The last object this writer knows is in the log (a Takeover lists from it).
  std::optional<std::uint64_t> known_seq_;
  LogWriteOutcome stopped_;  // what a fenced or corrupt writer repeats
};

}  // namespace fleetfs::replica
