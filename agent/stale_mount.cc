#include "agent/stale_mount.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fleet/unique_fd.h"

namespace fleetfs::agent {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string digits = s.substr(i + 1, 3);
      if (digits.size() == 3 && digits.find_first_not_of("01234567") == std::string::npos) {
        out.push_back(static_cast<char>(std::stoi(digits, nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// Whether the daemon behind the fleetfs mount at `path` answers: 0 when it
// does, else the errno (ENOTCONN once its /dev/fuse descriptor is closed).
int Ask(const std::string& path) {
  UniqueFd fd(::open((path + "/.fleetfs/status.json").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno;
  char byte;
  if (::read(fd.get(), &byte, 1) < 0) return errno;
  return 0;
}

}  // namespace

bool ParseMountInfoLine(const std::string& line, MountEntry& entry) {
  // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
  std::istringstream fields(line);
  std::string id, parent, dev, root, point, options, field;
  if (!(fields >> id >> parent >> dev >> root >> point >> options)) return false;
  while (fields >> field && field != "-") {
  }
  if (field != "-") return false;
  std::string fstype, source, super;
  if (!(fields >> fstype >> source)) return false;
  entry = MountEntry{Unescape(point), Unescape(fstype), Unescape(source), std::nullopt};
  if (fields >> super) {
    std::istringstream options(super);
    std::string option;
    while (std::getline(options, option, ',')) {
      if (option.rfind("user_id=", 0) != 0) continue;
      uid_t uid = 0;
      const char* begin = option.data() + 8;
      const char* end = option.data() + option.size();
      const auto [at, ec] = std::from_chars(begin, end, uid);
      if (ec == std::errc() && at == end && begin != end) entry.fuse_user = uid;
    }
  }
  return true;
}

std::vector<MountEntry> MountsAt(const std::string& path) {
  std::vector<MountEntry> found;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    MountEntry entry;
    if (ParseMountInfoLine(line, entry) && entry.point == path) found.push_back(std::move(entry));
  }
  return found;
}

Status ClearMountPoint(const std::string& path) {
  // Stale mounts may be stacked (several crashes); each pass detaches the
  // topmost.
  for (int pass = 0; pass < 16; ++pass) {
    std::vector<MountEntry> mounts = MountsAt(path);
    struct stat st;
    const bool stat_failed = ::stat(path.c_str(), &st) != 0;
    const int stat_errno = stat_failed ? errno : 0;
    if (mounts.empty()) {
      if (!stat_failed) return Status::Ok();
      return ErrnoStatus("mount point " + path, stat_errno);
    }
    const MountEntry& top = mounts.back();
    if (top.fstype != "fuse.fleetfs") {
      if (stat_failed && stat_errno == ENOTCONN) {
        // Some other FUSE daemon died here: nothing can be served over it.
      } else {
        return Status(Code::kFailedPrecondition,
                      "mount: " + path + " already has a " + top.fstype + " file system (" +
                          top.source + ") mounted on it; unmount it or choose another mount point");
      }
    } else if (const int answer = Ask(path); answer == 0) {
      // We hold this backing directory's lock, so this agent serves another one.
      return Status(Code::kFailedPrecondition,
                    "mount: " + path +
                        " is served by another running fleetfs agent (of another backing "
                        "directory); see 'fleetfs status " + path + "'");
    } else {
      spdlog::info("the fleetfs mount at {} does not answer ({}): its agent has ended; "
                   "detaching it", path, std::strerror(answer));
    }
    if (::umount2(path.c_str(), MNT_DETACH) != 0) {
      return ErrnoStatus("unmounting the stale mount at " + path, errno);
    }
    spdlog::info("cleaned up the stale mount at {} left by an agent that ended", path);
  }
  return Status(Code::kFailedPrecondition,
                "mount: " + path + " has more than 16 stale mounts stacked on it");
}

}  // namespace fleetfs::agent
