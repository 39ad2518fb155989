#include "agent/handoff_cli.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "agent/cli.h"
#include "agent/handoff.h"
#include "agent/stale_mount.h"
#include "fleet/unique_fd.h"
#include "lease/lease_ttl.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// How often the store and the agent's status are read while waiting: cheap
// reads, and the pause measured is no finer than this.
constexpr auto kPoll = std::chrono::milliseconds(10);

int Fail(std::ostream& err, int code, const std::string& message) {
  err << "fleetfs: " << message << '\n';
  return code;
}

// MOUNT, opened, once it is known to be the agent's live FUSE mount. While
// the agent is down MOUNT is a plain directory, and whoever may write in it
// could plant a `.fleetfs/control` symlink (root's request written into any
// file) or a status.json naming a store of their choosing: nothing under a
// path that is not a fleetfs mount is opened, read or written.
Result<UniqueFd> OpenLiveMount(const std::string& mount) {
  const std::string rule =
      "requests and status go only through the agent's own FUSE mount (fuse.fleetfs), never "
      "through files in a plain directory; start the agent, or name its mount point";
  char real[PATH_MAX];
  if (::realpath(mount.c_str(), real) == nullptr) {
    return Status(Code::kUnavailable, mount + " is not a running fleetfs mount (" +
                                          std::strerror(errno) + "); " + rule);
  }
  UniqueFd dir(::open(real, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
  struct statfs fs;
  if (!dir.valid() || ::fstatfs(dir.get(), &fs) != 0) {
    return Status(Code::kUnavailable, mount + " is not a running fleetfs mount (" +
                                          std::strerror(errno) + "); " + rule);
  }
  const std::vector<MountEntry> mounts = MountsAt(real);
  // Both: the descriptor is on a FUSE file system, and the topmost mount at
  // that point is fleetfs's (another FUSE file system could be there).
  if (fs.f_type != FUSE_SUPER_MAGIC || mounts.empty() || mounts.back().fstype != "fuse.fleetfs") {
    const std::string what =
        mounts.empty() ? std::string("a plain directory") : "a " + mounts.back().fstype + " mount";
    return Status(Code::kFailedPrecondition,
                  mount + " is not a running fleetfs mount (it is " + what + "); " + rule);
  }
  // fusermount3 lets a user name the subtype "fleetfs", but not the uid it
  // records: only a mount made by root or by this user is the agent's.
  const std::optional<uid_t> by = mounts.back().fuse_user;
  if (!by || (*by != 0 && *by != ::geteuid())) {
    return Status(Code::kFailedPrecondition,
                  mount + " is a fuse.fleetfs mount made by " +
                      (by ? "uid " + std::to_string(*by) : std::string("an unknown user")) +
                      ", not by root or this user; " + rule);
  }
  return dir;
}

// MOUNT/.fleetfs/`name` opened with `flags` relative to the checked mount's
// descriptor: never through a symlink, and only a file of that same mount
// (EXDEV otherwise). -1 with errno set on failure.
int OpenControlFile(int mount_fd, const std::string& name, int flags) {
  const std::string rel = ".fleetfs/" + name;
  UniqueFd fd(::openat(mount_fd, rel.c_str(), flags | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return -1;
  struct stat of_mount, of_file;
  if (::fstat(mount_fd, &of_mount) != 0 || ::fstat(fd.get(), &of_file) != 0) return -1;
  if (of_mount.st_dev != of_file.st_dev) {
    errno = EXDEV;
    return -1;
  }
  return fd.Release();
}

// The agent's status document, or an error naming the mount.
Result<Json> ReadStatus(const std::string& mount) {
  const std::string path = mount + "/.fleetfs/status.json";
  auto dir = OpenLiveMount(mount);
  if (!dir.ok()) return dir.status();
  UniqueFd fd(OpenControlFile(dir->get(), "status.json", O_RDONLY));
  if (!fd.valid()) {
    return Status(Code::kUnavailable, mount + " is not a running fleetfs mount (" + path + ": " +
                                          std::strerror(errno) + ")");
  }
  std::string text;
  char buffer[16384];
  ssize_t got;
  while ((got = ::read(fd.get(), buffer, sizeof buffer)) > 0) {
    text.append(buffer, static_cast<std::size_t>(got));
  }
  if (got < 0) {
    return Status(Code::kUnavailable, mount + " is not a running fleetfs mount (" + path + ": " +
                                          std::strerror(errno) + ")");
  }
  Json doc = Json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("store") ||
      !doc.contains("owner") || !doc.contains("ranges")) {
    return Status(Code::kDataLoss, path + " is not a fleetfs status document");
  }
  return doc;
}

// Writes `request` to MOUNT/.fleetfs/control and reads the agent's reply.
// The exit code for a refusal: bad input (2) or any other failure (1).
struct Sent {
  bool accepted = false;
  int code = kExitFailure;
  std::string reply;
};

Sent Send(const std::string& mount, const std::string& request) {
  Sent sent;
  const std::string path = mount + "/.fleetfs/control";
  auto dir = OpenLiveMount(mount);
  if (!dir.ok()) {
    sent.reply = dir.status().message();
    return sent;
  }
  UniqueFd fd(OpenControlFile(dir->get(), "control", O_RDWR));
  if (!fd.valid()) {
    const int e = errno;
    sent.reply = e == EACCES ? path + ": permission denied; only root or the agent's own user may "
                                      "send requests to the agent"
                             : path + ": " + std::strerror(e) +
                                   (e == ENOENT ? " (is a fleetfs agent of this version mounted "
                                                  "at " + mount + "?)"
                                                : "");
    return sent;
  }
  const ssize_t n = ::write(fd.get(), request.data(), request.size());
  const int write_errno = errno;
  char buffer[4096];
  const ssize_t got = ::pread(fd.get(), buffer, sizeof buffer, 0);
  std::string reply = got > 0 ? std::string(buffer, static_cast<std::size_t>(got)) : "";
  while (!reply.empty() && reply.back() == '\n') reply.pop_back();
  if (reply.starts_with("error: ")) reply = reply.substr(7);
  if (n == static_cast<ssize_t>(request.size())) {
    sent.accepted = true;
    sent.code = kExitOk;
    sent.reply = reply;
    return sent;
  }
  if (write_errno == EACCES) {
    sent.reply = path + ": permission denied; only root or the agent's own user may send "
                        "requests to the agent";
    return sent;
  }
  sent.code = write_errno == EINVAL ? kExitBadInput : kExitFailure;
  sent.reply = reply.empty() ? path + ": " + std::strerror(write_errno) : reply;
  return sent;
}

std::optional<std::uint64_t> EpochOf(const Json& status, const std::string& range) {
  for (const Json& r : status["ranges"]) {
    if (r.value("range", "") == range && r["epoch"].is_number_unsigned()) {
      return r["epoch"].get<std::uint64_t>();
    }
  }
  return std::nullopt;
}

// The agent's handoff of `range`: its state and note, if it lists one.
std::pair<std::string, std::string> HandoffState(const Json& status, const std::string& range) {
  if (!status.contains("handoffs")) return {"", ""};
  for (const Json& h : status["handoffs"]) {
    if (h.value("range", "") == range) return {h.value("state", ""), h.value("note", "")};
  }
  return {"", ""};
}

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Waits until `to` holds each of `ranges` in the store at an epoch above
// the one this agent held. Prints one line per range. Returns the exit code.
int AwaitTargets(const std::string& mount, lease::OwnershipStore& store,
                 const std::vector<std::pair<lease::SlotRange, std::uint64_t>>& ranges,
                 const std::string& to, Clock::time_point start, Millis timeout,
                 std::ostream& out, std::ostream& err) {
  std::vector<bool> done(ranges.size(), false);
  std::size_t left = ranges.size();
  int code = kExitOk;
  while (left > 0) {
    std::vector<Slot> slots;
    for (const auto& [range, epoch] : ranges) slots.push_back(range.first());
    auto table = store.ReadSlots(slots);
    const std::int64_t now = store.NowMs();
    if (table.ok()) {
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        if (done[i]) continue;
        const auto& [range, old_epoch] = ranges[i];
        const lease::OwnershipRow* row = table->RowFor(range.first());
        if (row != nullptr && row->owner.str() == to && row->epoch.value() > old_epoch &&
            row->lease_expires_ms > now) {
          done[i] = true;
          --left;
          out << "range " << range.ToString() << " handed over to '" << lease::Printable(to)
              << "' at epoch " << row->epoch.value() << " (was " << old_epoch
              << "); not served for at most " << static_cast<long>(MsSince(start))
              << " ms (from the request to the target's claim)\n";
        }
      }
    }
    if (left == 0) break;
    // The source gives up when it cannot ship every commit: it serves again.
    if (auto status = ReadStatus(mount); status.ok()) {
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        if (done[i]) continue;
        const auto [state, note] = HandoffState(*status, ranges[i].first.ToString());
        if (state == "abandoned") {
          err << "fleetfs: the handoff of range " << ranges[i].first.ToString()
              << " was abandoned: " << note << "; the agent serves it again\n";
          done[i] = true;
          --left;
          code = kExitFailure;
        }
      }
    }
    if (left == 0) break;
    if (MsSince(start) >= static_cast<double>(timeout.count())) {
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        if (done[i]) continue;
        err << "fleetfs: '" << lease::Printable(to) << "' did not claim range "
            << ranges[i].first.ToString() << " within " << lease::FormatDuration(timeout)
            << "; it stays offered to it for one ttl, then anyone may claim it\n";
      }
      return kExitHandoffTimedOut;
    }
    std::this_thread::sleep_for(kPoll);
  }
  return code;
}

Result<std::unique_ptr<lease::OwnershipStore>> OpenStoreOf(const Json& status,
                                                           const WallClock& clock) {
  lease::StoreTls tls;
  if (const auto it = status.find("store_tls"); it != status.end() && it->is_object()) {
    auto text = [&](const char* key) {
      const auto v = it->find(key);
      return v != it->end() && v->is_string() ? v->get<std::string>() : std::string();
    };
    tls.ca = text("ca");
    tls.cert = text("cert");
    tls.key = text("key");
  }
  return lease::OpenStore(status["store"].get<std::string>(), clock,
                          lease::SqliteStore::Access::kExisting, tls);
}

}  // namespace

int RunHandoff(const std::string& range_text, const std::string& to_text,
               const std::string& mount, Millis timeout, std::ostream& out, std::ostream& err) {
  auto range = lease::SlotRange::Parse(range_text);
  if (!range.ok()) return Fail(err, kExitBadInput, range.status().message());
  auto to = lease::OwnerId::Make(to_text);
  if (!to.ok()) {
    return Fail(err, kExitBadInput,
                "--to '" + lease::Printable(to_text) + "': " + to.status().message());
  }
  auto status = ReadStatus(mount);
  if (!status.ok()) return Fail(err, kExitFailure, status.status().message());
  const std::optional<std::uint64_t> epoch = EpochOf(*status, range->ToString());
  SystemWallClock clock;
  auto store = OpenStoreOf(*status, clock);
  if (!store.ok()) return Fail(err, kExitFailure, store.status().message());
  ControlRequest request;
  request.verb = ControlRequest::Verb::kHandoff;
  request.range = *range;
  request.to = *to;
  const Clock::time_point start = Clock::now();
  const Sent sent = Send(mount, FormatControlRequest(request));
  if (!sent.accepted) return Fail(err, sent.code, sent.reply);
  return AwaitTargets(mount, **store, {{*range, epoch.value_or(0)}}, to->str(), start, timeout,
                      out, err);
}

int RunDrain(const std::string& to_text, bool undo, const std::string& mount, Millis timeout,
             std::ostream& out, std::ostream& err) {
  ControlRequest request;
  if (undo) {
    if (!to_text.empty()) return Fail(err, kExitBadInput, "--undo takes no --to");
    request.verb = ControlRequest::Verb::kUndo;
    const Sent sent = Send(mount, FormatControlRequest(request));
    if (!sent.accepted) return Fail(err, sent.code, sent.reply);
    out << sent.reply << '\n';
    return kExitOk;
  }
  request.verb = ControlRequest::Verb::kDrain;
  if (!to_text.empty()) {
    auto to = lease::OwnerId::Make(to_text);
    if (!to.ok()) {
      return Fail(err, kExitBadInput,
                  "--to '" + lease::Printable(to_text) + "': " + to.status().message());
    }
    request.to = *to;
  }
  auto status = ReadStatus(mount);
  if (!status.ok()) return Fail(err, kExitFailure, status.status().message());
  std::vector<std::pair<lease::SlotRange, std::uint64_t>> served;
  for (const Json& r : (*status)["ranges"]) {
    if (!r.value("serving", false)) continue;
    auto parsed = lease::SlotRange::Parse(r.value("range", ""));
    if (parsed.ok()) served.emplace_back(*parsed, r["epoch"].get<std::uint64_t>());
  }
  SystemWallClock clock;
  auto store = OpenStoreOf(*status, clock);
  if (!store.ok()) return Fail(err, kExitFailure, store.status().message());
  const Clock::time_point start = Clock::now();
  const Sent sent = Send(mount, FormatControlRequest(request));
  if (!sent.accepted) return Fail(err, sent.code, sent.reply);
  if (request.to) {
    return AwaitTargets(mount, **store, served, request.to->str(), start, timeout, out, err);
  }
  // Released with no target: done when the agent has released every range.
  while (true) {
    auto now = ReadStatus(mount);
    bool running = false;
    if (now.ok() && now->contains("handoffs")) {
      for (const Json& h : (*now)["handoffs"]) {
        const std::string state = h.value("state", "");
        running = running || (state != "done" && state != "abandoned");
      }
    }
    if (now.ok() && !running) {
      for (const Json& h : (*now)["handoffs"]) {
        out << "range " << h.value("range", "") << ": " << h.value("state", "") << ", "
            << h.value("note", "") << '\n';
      }
      out << "drained in " << static_cast<long>(MsSince(start))
          << " ms; the ranges are not claimed again until 'fleetfs drain --undo' or a restart\n";
      return kExitOk;
    }
    if (MsSince(start) >= static_cast<double>(timeout.count())) {
      return Fail(err, kExitHandoffTimedOut,
                  "the drain did not end within " + lease::FormatDuration(timeout));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace fleetfs::agent
