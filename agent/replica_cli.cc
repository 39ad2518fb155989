#include "agent/replica_cli.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "fleet/layout.h"
#include "fleet/replica_catalog.h"
#include "fleet/replica_destination.h"
#include "fleet/unique_fd.h"
#include "lease/ownership_table.h"

namespace fleetfs::agent {
namespace {

constexpr int kOk = 0, kFailure = 1, kBadInput = 2;

int Fail(std::ostream& err, const Status& st) {
  err << "fleetfs: " << st.message() << '\n';
  return st.code() == Code::kInvalidArgument ? kBadInput : kFailure;
}

struct Target {
  FleetFile main;
  std::shared_ptr<replica::Destination> dest;
};

Result<Target> Open(const ReplicaArgs& args) {
  auto mode = ParseMode(args.mode);
  if (!mode.ok()) return mode.status().WithContext("--mode");
  FLEETFS_RETURN_IF_ERROR(replica::ValidateDestinationUrl(args.replica));
  auto path = MainPathForKey(*mode, args.tenant);
  if (!path.ok()) return path.status();
  auto file = ParseFleetPath(*mode, *path);
  if (!file) return Internal("the path " + *path + " is not a fleet file");
  // Reading must not make the destination: an absent directory is an error.
  std::string dir = args.replica.substr(std::strlen("file://"));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return NotFound("replica " + args.replica + ": " + dir + " is not a directory");
  }
  FLEETFS_ASSIGN_OR_RETURN(auto dest, replica::OpenDestination(args.replica));
  return Target{*file, dest};
}

std::string LocalTime(WallMs ms) { return ms == 0 ? "-" : lease::FormatWallTime(ms, /*local=*/true); }

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
replica::Progress TerminalProgress(const std::string& what, std::ostream& err, bool* shown) {
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

// Restores into `fd`; the message names what was restored.
Result<replica::RestoreOutcome> RestoreInto(const Target& t, std::optional<WallMs> at, int fd,
                                            std::ostream& err) {
  bool shown = false;
  auto outcome = replica::RestoreTo(*t.dest, replica::KeyDir(t.main), at, fd,
                                    TerminalProgress("restoring " + t.main.main_path, err, &shown));
  if (shown) err << '\n';
  if (!outcome.ok()) return outcome.status();
  if (outcome->result == replica::RestoreResult::kNoReplica) {
    return NotFound("replica " + t.dest->url() + " holds no generation of " + t.main.main_path +
                    (at ? " at or before that time" : ""));
  }
  if (outcome->result == replica::RestoreResult::kDeleted) {
    return NotFound(t.main.main_path + " was deleted at " + LocalTime(outcome->as_of_ms) +
                    " (tombstone in generation " + outcome->generation.Name() + ")");
  }
  return outcome;
}

}  // namespace

int RunReplicaLs(const ReplicaArgs& args, std::ostream& out, std::ostream& err) {
  auto t = Open(args);
  if (!t.ok()) return Fail(err, t.status());
  auto dir = replica::KeyDir(t->main);
  auto gens = replica::ListGenerations(*t->dest, dir);
  if (!gens.ok()) return Fail(err, gens.status());
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows = {
      {"GENERATION", "EPOCH", "FIRST", "LAST", "COMMITS", "BYTES", "NOTE"}};
  for (const auto& g : *gens) {
    auto info = replica::DescribeGeneration(*t->dest, dir, g);
    if (!info.ok()) return Fail(err, info.status());
    std::string note = info->tombstone ? "deleted" : info->objects.empty() ? "empty" : "";
    if (&g == &gens->back() && note.empty()) note = "newest";
    list.push_back({{"generation", g.Name()},
                    {"epoch", g.epoch},
                    {"first_ms", info->first_ms},
                    {"last_ms", info->last_ms},
                    {"commits", info->commits},
                    {"objects", info->objects.size()},
                    {"bytes", info->bytes},
                    {"tombstone", info->tombstone}});
    rows.push_back({g.Name(), std::to_string(g.epoch), LocalTime(info->first_ms),
                    LocalTime(info->last_ms), std::to_string(info->commits),
                    std::to_string(info->bytes), note});
  }
  if (args.json) {
    out << nlohmann::json{{"tenant", t->main.main_path}, {"replica", args.replica},
                          {"generations", list}}
               .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
        << '\n';
    return kOk;
  }
  if (gens->empty()) {
    err << "fleetfs: replica " << args.replica << " holds no generation of " << t->main.main_path
        << '\n';
    return kFailure;
  }
  out << t->main.main_path << " at " << args.replica << "\n";
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) {
      out << std::left << std::setw(static_cast<int>(width[i]) + 2) << r[i];
    }
    out << '\n';
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
  UniqueFd fd(::open(args.output.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return Fail(err, Status(Code::kAlreadyExists,
                              "-o " + args.output + ": the file exists; restore never overwrites"));
    }
    return Fail(err, ErrnoStatus("-o " + args.output, errno));
  }
  auto outcome = RestoreInto(*t, at, fd.get(), err);
  if (outcome.ok() && ::fsync(fd.get()) != 0) outcome = ErrnoStatus("syncing " + args.output, errno);
  if (!outcome.ok()) {
    ::unlink(args.output.c_str());
    return Fail(err, outcome.status());
  }
  out << "restored " << t->main.main_path << " to " << args.output << ": generation "
      << outcome->generation.Name() << " (epoch " << outcome->generation.epoch << "), "
      << outcome->commits << " commits after its snapshot, as of " << LocalTime(outcome->as_of_ms)
      << ", " << outcome->bytes << " bytes\n";
  return kOk;
}

int RunReplicaVerify(const ReplicaArgs& args, std::ostream& out, std::ostream& err) {
  auto t = Open(args);
  if (!t.ok()) return Fail(err, t.status());
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/fleetfs-verify-XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  UniqueFd fd(::mkstemp(path.data()));
  if (!fd.valid()) return Fail(err, ErrnoStatus("making a temporary file in " + tmpl, errno));
  std::string file(path.data());
  struct Cleanup {
    std::string f;
    ~Cleanup() { ::unlink(f.c_str()); }
  } cleanup{file};
  auto outcome = RestoreInto(*t, std::nullopt, fd.get(), err);
  if (!outcome.ok()) return Fail(err, outcome.status().WithContext("verify " + t->main.main_path));
  fd.Reset();
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
    return Fail(err, DataLoss("verify " + t->main.main_path + ": the restored file does not open "
                              "as a database: " + sqlite3_errmsg(db.get())));
  }
  if (result != "ok") {
    return Fail(err, DataLoss("verify " + t->main.main_path + ": integrity_check says: " + result));
  }
  out << "ok: " << t->main.main_path << " generation " << outcome->generation.Name() << " (epoch "
      << outcome->generation.epoch << ") restores to " << outcome->bytes
      << " bytes as of " << LocalTime(outcome->as_of_ms) << " and passes integrity_check\n";
  return kOk;
}

}  // namespace fleetfs::agent
