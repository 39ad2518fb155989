#include "agent/replica_cli.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "agent/config.h"
#include "fleet/layout.h"
#include "fleet/replica/destination.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_object.h"
#include "fleet/replica/log_reader.h"
#include "fleet/unique_fd.h"

namespace fleetfs::agent {
namespace {

using replica::LogHeader;
using replica::LogKind;
using replica::LogRestoreOutcome;
using replica::LogRestoreResult;

constexpr int kOk = 0, kFailure = 1, kBadInput = 2;

// The highest epoch an object may carry. An agent passes the highest epoch
// its ownership store ever granted, so that a forged epoch is corruption and
// never a fence floor. These commands run without a store and raise no fence
// floor from what they read, so no epoch is too high for them; epochs must
// still never decrease along a log, which the reader checks.
constexpr std::uint64_t kAnyEpoch = std::numeric_limits<std::uint64_t>::max();

int Fail(std::ostream& err, const Status& st) {
  err << "fleetfs: " << st.message() << '\n';
  return st.code() == Code::kInvalidArgument ? kBadInput : kFailure;
}

struct Target {
  FleetFile main;
  std::string dir;  // the key's log directory at the destination
  std::shared_ptr<replica::Destination> dest;
};

Result<Target> Open(const ReplicaArgs& args) {
  auto mode = ParseMode(args.mode);
  if (!mode.ok()) return mode.status().WithContext("--mode");
  // The same keys, checked the same way, as the agent's configuration.
  replica::DestinationOptions options;
  FLEETFS_ASSIGN_OR_RETURN(options.s3.endpoint, ParseReplicaEndpoint(args.endpoint));
  FLEETFS_RETURN_IF_ERROR(CheckReplicaRegion(args.region));
  options.s3.region = args.region;
  FLEETFS_ASSIGN_OR_RETURN(options.s3.path_style, ParseReplicaPathStyle(args.path_style));
  FLEETFS_RETURN_IF_ERROR(replica::ValidateDestinationUrl(args.replica));
  FLEETFS_RETURN_IF_ERROR(CheckS3SettingsApply(args.replica, options.s3));
  auto path = MainPathForKey(*mode, args.tenant);
  if (!path.ok()) return path.status();
  auto file = ParseFleetPath(*mode, *path);
  if (!file) return Internal("the path " + *path + " is not a fleet file");
  // Reading must not make the destination: an absent directory is an error.
  // (Opening an s3:// destination makes nothing.)
  if (args.replica.starts_with("file://")) {
    std::string dir = args.replica.substr(std::strlen("file://"));
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return NotFound("replica " + args.replica + ": " + dir + " is not a directory");
    }
  }
  FLEETFS_ASSIGN_OR_RETURN(auto dest, replica::OpenDestination(args.replica, options));
  return Target{*file, replica::LogDir(*file), dest};
}

// "2026-11-29T16:30:00.123" in local time: the form --at takes back. A time
// no calendar shows (a replica object's header is untrusted) is "@<ms>".
std::string LocalTime(WallMs ms) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  char buf[64];
  if (ms < 0 || ::localtime_r(&secs, &tm) == nullptr ||
      std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
    return "@" + std::to_string(ms);
  }
  char millis[8];
  std::snprintf(millis, sizeof millis, ".%03d", static_cast<int>(ms % 1000));
  return std::string(buf) + millis;
}

// The time zone LocalTime writes in ("CET"), for messages.
std::string LocalZone(WallMs ms) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  char buf[16] = "";
  if (::localtime_r(&secs, &tm) == nullptr || std::strftime(buf, sizeof buf, "%Z", &tm) == 0) {
    return "local";
  }
  return buf;
}

// "2026-11-29T16:30:00.123 CET", for messages.
std::string LocalTimeZoned(WallMs ms) {
  std::string time = LocalTime(ms);
  return time.starts_with('@') ? time : time + " " + LocalZone(ms);
}

// "2026-11-29T16:30:00[.123][Z]" (UTC with Z, else local time) or "@<ms since the epoch>".
Result<WallMs> ParseTime(const std::string& text) {
  const std::string rule =
      "--at '" + text +
      "': write YYYY-MM-DDTHH:MM:SS[.mmm] (local time), the same ending in Z (UTC), or "
      "@MILLISECONDS since the Unix epoch";
  if (!text.empty() && text[0] == '@') {
    char* end = nullptr;
    long long v = std::strtoll(text.c_str() + 1, &end, 10);
    if (end == text.c_str() + 1 || *end != '\0' || v < 0) return InvalidArgument(rule);
    return static_cast<WallMs>(v);
  }
  std::tm tm{};
  const char* rest = ::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr) return InvalidArgument(rule);
  int millis = 0;
  if (*rest == '.') {
    ++rest;
    int digits = 0;
    while (std::isdigit(static_cast<unsigned char>(*rest)) && digits < 3) {
      millis = millis * 10 + (*rest - '0');
      ++rest;
      ++digits;
    }
    while (digits++ < 3) millis *= 10;
    while (std::isdigit(static_cast<unsigned char>(*rest))) ++rest;
  }
  bool utc = false;
  if (*rest == 'Z') {
    utc = true;
    ++rest;
  }
  if (*rest != '\0') return InvalidArgument(rule);
  tm.tm_isdst = -1;
  std::time_t secs = utc ? ::timegm(&tm) : std::mktime(&tm);
  if (secs == static_cast<std::time_t>(-1)) return InvalidArgument(rule);
  return static_cast<WallMs>(secs) * 1000 + millis;
}

// Shows "restoring acme.db: 312 / 1024 MiB (30%)" on a terminal, at most 10 times a second.
replica::LogProgress TerminalProgress(const std::string& what, std::ostream& err, bool* shown) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [&err, what, last, shown](std::uint64_t done, std::uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::milliseconds(100) && done < total) return;
    *last = now;
    *shown = true;
    err << "\r" << what << ": " << (done >> 20) << " / " << (total >> 20) << " MiB ("
        << (total ? done * 100 / total : 100) << "%)   " << std::flush;
  };
}

// "replica log object file:///r/176/acme.db/00000000000000000007", as the
// reader names objects in its errors.
std::string ObjectName(const Target& t, std::uint64_t seq) {
  return "replica log object " + t.dest->url() + "/" + replica::LogObjectPath(t.dir, seq);
}

// Every object's header, in sequence order: one listing, one ranged read each.
Result<std::vector<LogHeader>> ReadHeaders(const Target& t) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, replica::ListLog(*t.dest, t.dir));
  std::vector<LogHeader> headers;
  headers.reserve(seqs.size());
  for (std::uint64_t seq : seqs) {
    FLEETFS_ASSIGN_OR_RETURN(LogHeader h, replica::ReadLogHeader(*t.dest, t.dir, seq, kAnyEpoch));
    headers.push_back(std::move(h));
  }
  return headers;
}

// What a log's headers say about the key as a whole.
struct LogSummary {
  std::optional<std::uint64_t> newest_epoch;  // the tail's
  // The oldest snapshot's as-of to the tail's last time; none without a snapshot.
  std::optional<WallMs> restorable_from_ms, restorable_to_ms;
  // The tombstone that ends the log: none comes after it but markers.
  const LogHeader* deleted_by = nullptr;
};

LogSummary SummarizeLog(const std::vector<LogHeader>& headers) {
  LogSummary s;
  if (headers.empty()) return s;
  s.newest_epoch = headers.back().epoch;
  for (const LogHeader& h : headers) {
    if (h.kind == LogKind::kSnapshot) {
      if (!s.restorable_from_ms) s.restorable_from_ms = h.first_ms;
      s.deleted_by = nullptr;
    }
    if (h.kind == LogKind::kTombstone) s.deleted_by = &h;
  }
  if (s.restorable_from_ms) s.restorable_to_ms = headers.back().last_ms;
  return s;
}

// The oldest state a restore can reach: the as-of of the log's oldest
// snapshot, and its sequence; none when the log holds no snapshot.
Result<std::optional<LogHeader>> OldestSnapshot(const Target& t) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, replica::ListLog(*t.dest, t.dir));
  for (std::uint64_t seq : seqs) {
    FLEETFS_ASSIGN_OR_RETURN(LogHeader h, replica::ReadLogHeader(*t.dest, t.dir, seq, kAnyEpoch));
    if (h.kind == LogKind::kSnapshot) return std::optional<LogHeader>(std::move(h));
  }
  return std::optional<LogHeader>();
}

// Restores into `fd`; the errors name what could not be restored and why.
Result<LogRestoreOutcome> RestoreInto(const Target& t, std::optional<WallMs> at, int fd,
                                      std::ostream& err) {
  bool shown = false;
  auto outcome =
      replica::RestoreFromLog(*t.dest, t.dir, at, fd, kAnyEpoch,
                              TerminalProgress("restoring " + t.main.main_path, err, &shown));
  if (shown) err << '\n';
  if (!outcome.ok() && outcome.status().code() == Code::kFailedPrecondition && at) {
    // Retention removed the states that old. Name the oldest one kept, in
    // the form --at takes, rather than the reader's milliseconds. (Listing
    // again also gives the old layout's refusal, the other precondition.)
    auto oldest = OldestSnapshot(t);
    if (!oldest.ok()) return oldest.status();
    if (*oldest) {
      const WallMs from = (*oldest)->first_ms;
      return Status(Code::kFailedPrecondition,
                    t.main.main_path + " cannot be restored at " + LocalTimeZoned(*at) +
                        ": retention at " + t.dest->url() +
                        " kept nothing that old; the oldest restorable time is " +
                        LocalTimeZoned(from) + " (--at @" + std::to_string(from) + ", snapshot " +
                        std::to_string((*oldest)->seq) + " of the log)");
    }
  }
  if (!outcome.ok()) return outcome.status();
  if (outcome->result == LogRestoreResult::kNoReplica) {
    return NotFound("replica " + t.dest->url() + " holds nothing for " + t.main.main_path +
                    (at ? " at or before " + LocalTimeZoned(*at) : std::string()) +
                    " (no snapshot in its log" + (at ? " that old)" : ")"));
  }
  if (outcome->result == LogRestoreResult::kDeleted) {
    return NotFound(t.main.main_path + " was deleted at " + LocalTimeZoned(outcome->as_of_ms) +
                    " (tombstone, object " + std::to_string(outcome->as_of_seq.value_or(0)) +
                    " of its log)");
  }
  return outcome;
}

// Gives the restored file what the snapshot recorded of the tenant file: its
// mode, so the copy is no more readable than the file it holds (it was made
// 0600 while it was written), and its owner when root restores (to put it
// back in a backing directory as it was); anyone else cannot give a file
// away, and keeps it.
Status GiveOwner(int fd, const std::string& path, const replica::SnapshotOwner& owner) {
  if (::geteuid() == 0 && ::fchown(fd, owner.uid, owner.gid) != 0) {
    return ErrnoStatus("giving " + path + " the owner " + std::to_string(owner.uid) + ":" +
                           std::to_string(owner.gid) + " of the tenant file",
                       errno);
  }
  const mode_t mode = owner.mode & 0777 ? owner.mode & 0777 : 0600;
  if (::fchmod(fd, mode) != 0) return ErrnoStatus("giving " + path + " its mode", errno);
  return Status::Ok();
}

std::string Octal(std::uint32_t mode) {
  std::ostringstream s;
  s << '0' << std::oct << mode;
  return s.str();
}

std::string Cell(std::uint64_t v, bool shown) { return shown ? std::to_string(v) : "-"; }

// What verify read of the whole log: every object in sequence order, each
// as long as its header says and linked to the one before by its checksum.
struct ChainChecked {
  std::vector<LogHeader> headers;
  std::uint64_t bytes = 0;
};

// Object `h.seq` whole, never more than its header declares (a segment,
// tombstone or marker: sizes the header's checks bound).
Result<std::string> GetBounded(const Target& t, const LogHeader& h) {
  std::string bytes;
  const std::uint64_t limit = h.ObjectBytes();
  Status st = t.dest->Get(replica::LogObjectPath(t.dir, h.seq), [&](std::string_view piece) {
    if (piece.size() > limit - bytes.size()) {
      return DataLoss("the object is longer than the " + std::to_string(limit) +
                      " bytes its header declares");
    }
    bytes.append(piece);
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return bytes;
}

// One object's header and chain checksum, its body checked as far as memory
// allows: a segment, tombstone or marker is decoded whole (body checksum,
// decompression, transactions); a snapshot streams through its checksum and
// length only (its body is checked by the next object's link, and by the
// restore when it is the newest).
Result<replica::LogObjectSum> ReadChecked(const Target& t, std::uint64_t seq) {
  FLEETFS_ASSIGN_OR_RETURN(LogHeader h, replica::ReadLogHeader(*t.dest, t.dir, seq, kAnyEpoch));
  if (h.kind == LogKind::kSnapshot) {
    return replica::ReadLogObjectSum(*t.dest, t.dir, seq, kAnyEpoch);
  }
  auto bytes = GetBounded(t, h);
  if (!bytes.ok()) return bytes.status().WithContext(ObjectName(t, seq));
  auto obj =
      replica::DecodeLogObject(*bytes, replica::LogExpectation{t.dir, seq, h.epoch, kAnyEpoch});
  if (!obj.ok()) return obj.status().WithContext(ObjectName(t, seq));
  return replica::LogObjectSum{std::move(obj->header), obj->checksum};
}

Result<ChainChecked> CheckWholeLog(const Target& t) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, replica::ListLog(*t.dest, t.dir));
  ChainChecked c;
  std::uint64_t prev_sum = 0;
  for (std::uint64_t seq : seqs) {
    auto sum = ReadChecked(t, seq);
    // Retention removes a log's oldest objects: one gone since the listing,
    // before any was read, is its work, not a gap.
    if (!sum.ok() && sum.status().code() == Code::kNotFound && c.headers.empty()) continue;
    if (!sum.ok()) return sum.status();
    const LogHeader& h = sum->header;
    if (!c.headers.empty()) {
      const LogHeader& prev = c.headers.back();
      if (h.seq != prev.seq + 1) {
        return DataLoss("replica log " + t.dest->url() + "/" + t.dir + " is missing object " +
                        std::to_string(prev.seq + 1) + " (a gap in its sequence)");
      }
      if (h.epoch < prev.epoch) {
        return DataLoss(ObjectName(t, h.seq) + ": written at epoch " + std::to_string(h.epoch) +
                        ", below the epoch " + std::to_string(prev.epoch) + " of object " +
                        std::to_string(prev.seq) +
                        " before it (epochs never decrease along a log)");
      }
      FLEETFS_RETURN_IF_ERROR(replica::CheckChain(h, prev_sum).WithContext(ObjectName(t, h.seq)));
    }
    prev_sum = sum->checksum;
    c.bytes += h.ObjectBytes();
    c.headers.push_back(h);
  }
  return c;
}

// PRAGMA integrity_check of the database in `file`: "ok", or what it found.
Result<std::string> IntegrityCheck(const std::string& file, const std::string& what) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr);
  std::unique_ptr<sqlite3, decltype(&sqlite3_close)> db(raw, sqlite3_close);
  std::string result;
  if (rc == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    rc = sqlite3_prepare_v2(db.get(), "PRAGMA integrity_check", -1, &stmt, nullptr);
    while (rc == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
      if (!result.empty()) result += "; ";
      result += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  if (rc != SQLITE_OK) {
    return DataLoss(what +
                    ": the restored file does not open as a database: " + sqlite3_errmsg(db.get()));
  }
  return result;
}

}  // namespace

std::string RestoreTimeText(WallMs ms) { return LocalTime(ms); }

Result<ReplicaTail> ReadLogTail(replica::Destination& dest, const std::string& dir,
                                std::size_t last_n, std::uint64_t max_epoch) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, replica::ListLog(dest, dir));
  ReplicaTail tail;
  tail.log_dir = dir;
  tail.objects = seqs.size();
  if (seqs.empty()) return tail;
  // Read with any epoch, then judged: an object above the store's counter is
  // shown, marked refused (a restore refuses it), never taken as the newest.
  auto header = [&](std::uint64_t seq) {
    return replica::ReadLogHeader(dest, dir, seq, kAnyEpoch);
  };
  // Retention keeps few objects before the oldest snapshot: a log with none
  // near its start (never snapshotted, or damaged) costs no more reads.
  const std::size_t oldest_scanned = std::min(seqs.size(), kTailSnapshotSearch);
  for (std::size_t i = 0; i < oldest_scanned; ++i) {
    FLEETFS_ASSIGN_OR_RETURN(const LogHeader h, header(seqs[i]));
    if (h.kind == LogKind::kSnapshot && h.epoch <= max_epoch) {
      tail.restorable_from_ms = h.first_ms;
      break;
    }
  }
  const std::size_t from = seqs.size() > last_n ? seqs.size() - last_n : 0;
  for (std::size_t i = from; i < seqs.size(); ++i) {
    FLEETFS_ASSIGN_OR_RETURN(const LogHeader h, header(seqs[i]));
    tail.tail.push_back({h.seq, std::string(replica::LogKindName(h.kind)), h.epoch, h.first_ms,
                         h.last_ms, h.ObjectBytes(), h.epoch > max_epoch});
  }
  for (auto it = tail.tail.rbegin(); it != tail.tail.rend(); ++it) {
    if (it->refused) continue;
    if (!tail.newest_epoch) tail.newest_epoch = it->epoch;
    if (tail.restorable_from_ms && !tail.restorable_to_ms) tail.restorable_to_ms = it->last_ms;
  }
  for (auto it = tail.tail.rbegin(); it != tail.tail.rend(); ++it) {
    if (it->refused || it->kind == replica::LogKindName(LogKind::kMarker)) continue;
    tail.deleted = it->kind == replica::LogKindName(LogKind::kTombstone);
    break;
  }
  return tail;
}

Result<ReplicaTail> ReadReplicaTail(const ReplicaArgs& args, std::size_t last_n,
                                    std::uint64_t max_epoch) {
  FLEETFS_ASSIGN_OR_RETURN(const Target t, Open(args));
  return ReadLogTail(*t.dest, t.dir, last_n, max_epoch);
}

int RunReplicaLs(const ReplicaArgs& args, std::ostream& out, std::ostream& err) {
  auto t = Open(args);
  if (!t.ok()) return Fail(err, t.status());
  auto headers = ReadHeaders(*t);
  if (!headers.ok()) return Fail(err, headers.status());
  const LogSummary sum = SummarizeLog(*headers);

  if (args.json) {
    nlohmann::json objects = nlohmann::json::array();
    for (const LogHeader& h : *headers) {
      objects.push_back({{"seq", h.seq},
                         {"kind", replica::LogKindName(h.kind)},
                         {"epoch", h.epoch},
                         {"first_ms", h.first_ms},
                         {"last_ms", h.last_ms},
                         {"db_size", h.db_size},
                         {"commits", h.commits},
                         {"bytes", h.ObjectBytes()}});
    }
    auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    out << nlohmann::json{{"tenant", args.tenant},
                          {"key", t->dir},
                          {"replica", args.replica},
                          {"objects", objects},
                          {"newest_epoch", opt(sum.newest_epoch)},
                          {"deleted", sum.deleted_by != nullptr},
                          {"restorable_from_ms", opt(sum.restorable_from_ms)},
                          {"restorable_to_ms", opt(sum.restorable_to_ms)}}
               .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
        << '\n';
    return kOk;
  }
  if (headers->empty()) {
    err << "fleetfs: replica " << args.replica << " holds nothing for " << t->main.main_path
        << " (its log " << t->dir << " is empty)\n";
    return kFailure;
  }

  std::vector<std::vector<std::string>> rows = {
      {"SEQ", "KIND", "EPOCH", "FIRST", "LAST", "DB_SIZE", "COMMITS", "BYTES"}};
  for (const LogHeader& h : *headers) {
    const bool data = h.kind == LogKind::kSnapshot || h.kind == LogKind::kSegment;
    rows.push_back({std::to_string(h.seq), std::string(replica::LogKindName(h.kind)),
                    std::to_string(h.epoch), LocalTime(h.first_ms), LocalTime(h.last_ms),
                    Cell(h.db_size, data), Cell(h.commits, h.kind == LogKind::kSegment),
                    std::to_string(h.ObjectBytes())});
  }
  out << t->main.main_path << " at " << args.replica << " (times local, "
      << LocalZone(headers->back().last_ms) << ")\n";
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    for (std::size_t i = 0; i + 1 < r.size(); ++i) {
      out << std::left << std::setw(static_cast<int>(width[i]) + 2) << r[i];
    }
    out << r.back() << '\n';
  }
  out << "objects       " << headers->size() << " (sequences " << headers->front().seq << " to "
      << headers->back().seq << ")\n";
  out << "newest epoch  " << *sum.newest_epoch << "\n";
  if (sum.restorable_from_ms) {
    out << "restorable    from " << LocalTime(*sum.restorable_from_ms) << " to "
        << LocalTime(*sum.restorable_to_ms) << "\n";
  } else {
    out << "restorable    nothing (the log holds no snapshot)\n";
  }
  if (sum.deleted_by) {
    out << "deleted       yes, at " << LocalTime(sum.deleted_by->first_ms) << " (tombstone "
        << sum.deleted_by->seq << "); a restore of the newest state finds no file\n";
  } else {
    out << "deleted       no\n";
  }
  return kOk;
}

int RunRestore(const ReplicaArgs& args, std::ostream& out, std::ostream& err) {
  std::optional<WallMs> at;
  if (!args.at.empty()) {
    auto parsed = ParseTime(args.at);
    if (!parsed.ok()) return Fail(err, parsed.status());
    at = *parsed;
  }
  if (args.output.empty()) return Fail(err, InvalidArgument("-o: the output file is required"));
  auto t = Open(args);
  if (!t.ok()) return Fail(err, t.status());
  // Never over an existing file: the output is made new, and removed on failure.
  UniqueFd fd(::open(args.output.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return Fail(err, Status(Code::kAlreadyExists,
                              "-o " + args.output + ": the file exists; restore never overwrites"));
    }
    return Fail(err, ErrnoStatus("-o " + args.output, errno));
  }
  auto outcome = RestoreInto(*t, at, fd.get(), err);
  if (outcome.ok()) {
    Status st = GiveOwner(fd.get(), args.output, outcome->owner);
    if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoStatus("syncing " + args.output, errno);
    if (!st.ok()) outcome = st;
  }
  if (!outcome.ok()) {
    ::unlink(args.output.c_str());
    return Fail(err, outcome.status());
  }
  out << "restored " << t->main.main_path << " to " << args.output << ": as of "
      << LocalTimeZoned(outcome->as_of_ms) << " (object " << outcome->as_of_seq.value_or(0)
      << " of the log, whose newest epoch is " << outcome->tail_epoch << "), " << outcome->commits
      << " commits after its snapshot, " << outcome->bytes << " bytes";
  struct stat st;
  if (::fstat(fd.get(), &st) == 0) {
    out << ", mode " << Octal(st.st_mode & 0777) << ", owner " << st.st_uid << ":" << st.st_gid;
  }
  out << "\n";
  return kOk;
}

int RunReplicaVerify(const ReplicaArgs& args, std::ostream& out, std::ostream& err) {
  auto t = Open(args);
  if (!t.ok()) return Fail(err, t.status());
  const std::string what = "verify " + t->main.main_path;
  // The whole log first: a restore of the newest state reads only from the
  // newest snapshot on, but one at an older time needs the objects before it.
  auto chain = CheckWholeLog(*t);
  if (!chain.ok()) return Fail(err, chain.status().WithContext(what));

  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/fleetfs-verify-XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  UniqueFd fd(::mkstemp(path.data()));
  if (!fd.valid()) return Fail(err, ErrnoStatus("making a temporary file in " + tmpl, errno));
  std::string file(path.data());
  // The sidecars too: a read-only connection to a copy in WAL mode leaves
  // its -wal and -shm behind (it may not remove them), one pair a verify.
  struct Cleanup {
    std::string f;
    ~Cleanup() {
      for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
        ::unlink((f + suffix).c_str());
      }
    }
  } cleanup{file};
  // The newest state again, through the restore: it checks each object's
  // body (the snapshot's stream, every segment's transactions) and applies them.
  auto outcome = RestoreInto(*t, std::nullopt, fd.get(), err);
  if (!outcome.ok()) return Fail(err, outcome.status().WithContext(what));
  fd.Reset();
  auto integrity = IntegrityCheck(file, what);
  if (!integrity.ok()) return Fail(err, integrity.status());
  if (*integrity != "ok") {
    return Fail(err, DataLoss(what + ": integrity_check says: " + *integrity));
  }

  const std::vector<LogHeader>& hs = chain->headers;
  const LogHeader* snapshot = nullptr;  // the newest one at or before the restored state
  for (const LogHeader& h : hs) {
    if (h.kind == LogKind::kSnapshot && h.seq <= outcome->as_of_seq.value_or(0)) snapshot = &h;
  }
  out << "ok: " << t->main.main_path << " at " << args.replica << "\n";
  if (!hs.empty()) {
    out << "  log         objects " << hs.front().seq << " to " << hs.back().seq << " ("
        << hs.size() << ", " << chain->bytes << " bytes), epochs " << hs.front().epoch << " to "
        << hs.back().epoch << ", chain ok\n";
  }
  out << "  restored    ";
  if (snapshot) out << "snapshot " << snapshot->seq << " and ";
  out << outcome->commits << " commits after it (through object " << outcome->as_of_seq.value_or(0)
      << "), as of " << LocalTimeZoned(outcome->as_of_ms) << ", " << outcome->bytes << " bytes\n";
  out << "  integrity   PRAGMA integrity_check: ok\n";
  return kOk;
}

}  // namespace fleetfs::agent
