#include "fleet/replica/log_writer.h"

#include <utility>

#include "fleet/fd_io.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"

namespace fleetfs::replica {
namespace {

std::string N(std::uint64_t v) { return std::to_string(v); }

LogWriteOutcome Outcome(LogWriteKind kind, std::uint64_t seq) {
  LogWriteOutcome out;
  out.kind = kind;
  out.seq = seq;
  return out;
}
LogWriteOutcome FencedAt(std::uint64_t seq, std::uint64_t by) {
  LogWriteOutcome out = Outcome(LogWriteKind::kFenced, seq);
  out.fenced_by = by;
  return out;
}
LogWriteOutcome CorruptAt(std::uint64_t seq, Status problem) {
  LogWriteOutcome out = Outcome(LogWriteKind::kCorrupt, seq);
  out.problem = std::move(problem);
  return out;
}

}  // namespace

std::string_view LogWriteKindName(LogWriteKind kind) {
  switch (kind) {
    case LogWriteKind::kAppended:
      return "appended";
    case LogWriteKind::kTakenByOlder:
      return "taken by an older epoch";
    case LogWriteKind::kFenced:
      return "fenced";
    case LogWriteKind::kCorrupt:
      return "corrupt";
  }
  return "unknown";
}

LogWriter::LogWriter(Destination& dest, std::string dir) : dest_(dest), dir_(std::move(dir)) {
  at_.key = dir_;
}

std::string LogWriter::PathAt(std::uint64_t seq) const { return LogObjectPath(dir_, seq); }

LogWriteOutcome LogWriter::Stop(LogWriteOutcome outcome) {
  state_ = outcome.kind == LogWriteKind::kFenced ? State::kFenced : State::kCorrupt;
  stopped_ = outcome;
  return outcome;
}

Result<TakeoverOutcome> LogWriter::Takeover(std::uint64_t epoch, std::uint64_t max_epoch) {
  if (epoch == 0 || epoch > max_epoch) {
    return InvalidArgument("taking replica log " + QuotedName(dir_) + " at epoch " + N(epoch) +
                           ": an epoch is 1 to the highest the store granted (" + N(max_epoch) +
                           ")");
  }
  // From the last object this writer knows, inclusive: the tail is at or
  // after it (retention never removes a tail).
  std::optional<std::uint64_t> after;
  if (known_seq_ && *known_seq_ > 0) after = *known_seq_ - 1;
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, ListLog(dest_, dir_, after));
  TakeoverOutcome out;
  LogPosition at{dir_, epoch, 0, 0};
  if (!seqs.empty()) {
    auto sum = ReadLogObjectSum(dest_, dir_, seqs.back(), max_epoch);
    if (!sum.ok()) {
      if (sum.status().code() != Code::kDataLoss) return sum.status();
      Stop(CorruptAt(seqs.back(), sum.status()));
      out.kind = TakeoverKind::kCorrupt;
      out.problem = sum.status();
      return out;
    }
    if (sum->header.epoch > epoch) {
      Stop(FencedAt(seqs.back(), sum->header.epoch));
      out.kind = TakeoverKind::kFenced;
      out.fenced_by = sum->header.epoch;
      return out;
    }
    out.tail = LogTail{seqs.back(), sum->header, sum->checksum};
    at.seq = seqs.back() + 1;
    at.prev = sum->checksum;
    known_seq_ = seqs.back();
  }
  at_ = at;
  state_ = State::kTakenOver;
  return out;
}

Result<LogWriteOutcome> LogWriter::WriteMarker(WallMs now_ms, std::uint64_t max_epoch) {
  if (state_ == State::kFenced || state_ == State::kCorrupt) return stopped_;
  if (state_ != State::kTakenOver) {
    return Status(
        Code::kFailedPrecondition,
        "replica log " + QuotedName(dir_) +
            ": a marker is written once, after a Takeover and the check against its tail");
  }
  FLEETFS_ASSIGN_OR_RETURN(const EncodedLogObject marker, EncodeLogMarker(at_, now_ms));
  return Settle(dest_.Create(PathAt(at_.seq), marker.bytes), marker.checksum, /*marker=*/true,
                max_epoch);
}

Status LogWriter::CheckOurs(std::string_view head, LogKind* kind) const {
  auto h = Summarize(head, LogExpectation{dir_, at_.seq, at_.epoch, std::nullopt});
  if (!h.ok()) {
    return InvalidArgument("the object to append to replica log " + QuotedName(dir_) +
                           " is not encoded at its position (sequence " + N(at_.seq) + ", epoch " +
                           N(at_.epoch) + "): " + h.status().message());
  }
  if (h->prev != at_.prev) {
    return InvalidArgument("the object to append at sequence " + N(at_.seq) + " of replica log " +
                           QuotedName(dir_) + " follows another object than the log's tail");
  }
  if (h->kind == LogKind::kMarker) {
    return InvalidArgument("a marker is written by WriteMarker, not appended");
  }
  *kind = h->kind;
  return Status::Ok();
}

Result<LogWriteOutcome> LogWriter::Append(const EncodedLogObject& object, std::uint64_t max_epoch) {
  if (state_ == State::kFenced || state_ == State::kCorrupt) return stopped_;
  if (state_ != State::kShipping) {
    return Status(Code::kFailedPrecondition,
                  "replica log " + QuotedName(dir_) +
                      ": nothing ships under an epoch before its marker is written");
  }
  LogKind kind;
  FLEETFS_RETURN_IF_ERROR(CheckOurs(object.bytes, &kind));
  if (ObjectChecksum(object.bytes) != object.checksum) {
    return InvalidArgument("the object to append to replica log " + QuotedName(dir_) +
                           " does not have the checksum given with it");
  }
  return Settle(dest_.Create(PathAt(at_.seq), object.bytes), object.checksum, /*marker=*/false,
                max_epoch);
}

Result<LogWriteOutcome> LogWriter::AppendFile(int fd, std::uint64_t checksum,
                                              std::uint64_t max_epoch) {
  if (state_ == State::kFenced || state_ == State::kCorrupt) return stopped_;
  if (state_ != State::kShipping) {
    return Status(Code::kFailedPrecondition,
                  "replica log " + QuotedName(dir_) +
                      ": nothing ships under an epoch before its marker is written");
  }
  std::string head(kMaxLogHeaderBytes, '\0');
  FLEETFS_ASSIGN_OR_RETURN(const std::size_t got, PreadFull(fd, head.data(), head.size(), 0));
  head.resize(got);
  LogKind kind;
  FLEETFS_RETURN_IF_ERROR(CheckOurs(head, &kind));
  return Settle(dest_.CreateFromFile(PathAt(at_.seq), fd), checksum, /*marker=*/false, max_epoch);
}

Result<LogWriteOutcome> LogWriter::Settle(Status created, std::uint64_t checksum, bool marker,
                                          std::uint64_t max_epoch) {
  const std::uint64_t seq = at_.seq;
  auto advance = [&](bool found_own) {
    known_seq_ = seq;
    at_.prev = checksum;
    at_.seq = seq + 1;
    if (marker) state_ = State::kShipping;
    LogWriteOutcome out = Outcome(LogWriteKind::kAppended, seq);
    out.found_own = found_own;
    return out;
  };
  auto corrupt = [&](Status problem) { return Stop(CorruptAt(seq, std::move(problem))); };
  if (created.ok()) return advance(false);
  // Any other failure may have landed: the retry of the same object finds it.
  if (created.code() != Code::kAlreadyExists) return created;

  // The name is taken: its header says by whom.
  auto h = ReadLogHeader(dest_, dir_, seq, max_epoch);
  if (!h.ok()) {
    if (h.status().code() == Code::kDataLoss) return corrupt(h.status());
    return h.status();
  }
  if (h->epoch > at_.epoch) {
    return Stop(FencedAt(seq, h->epoch));
  }
  const bool ours = h->epoch == at_.epoch;
  if (!ours && !marker) {
    // After our marker no older owner can reach this sequence: its uploads
    // are sequential and its next one found our marker's sequence taken.
    return corrupt(DataLoss("replica log object " + dest_.url() + "/" + PathAt(seq) +
                            " is of epoch " + N(h->epoch) + ", below epoch " + N(at_.epoch) +
                            " whose marker comes before it"));
  }
  auto sum = ReadLogObjectSum(dest_, dir_, seq, max_epoch);
  if (!sum.ok()) {
    if (sum.status().code() == Code::kDataLoss) return corrupt(sum.status());
    return sum.status();
  }
  if (ours) {
    if (sum->checksum == checksum) return advance(true);
    return corrupt(DataLoss("replica log object " + dest_.url() + "/" + PathAt(seq) +
                            " is another object of this writer's epoch " + N(at_.epoch) +
                            " than the one it wrote there"));
  }
  // An older owner's late object before our marker: it joins the log if it
  // follows the tail we took, and is the tail the caller re-checks.
  // (Object 0 follows nothing: its header's `prev` was checked to be 0.)
  Status chain = seq == 0 ? Status::Ok() : CheckChain(sum->header, at_.prev);
  if (!chain.ok()) {
    return corrupt(chain.WithContext("replica log object " + dest_.url() + "/" + PathAt(seq)));
  }
  known_seq_ = seq;
  at_.seq = seq + 1;
  at_.prev = sum->checksum;
  LogWriteOutcome out = Outcome(LogWriteKind::kTakenByOlder, seq);
  out.tail = LogTail{seq, sum->header, sum->checksum};
  return out;
}

}  // namespace fleetfs::replica
