#include "vfs/mount_point.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace fleetfs::vfs {
namespace {

// mountinfo escapes space, tab, newline and backslash as octal.
std::string Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool IsMountedAt(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    fields >> id >> parent >> dev >> root >> point;
    if (Unescape(point) == path) return true;
  }
  return false;
}

}  // namespace

Result<MountPointState> InspectMountPoint(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOTCONN) return MountPointState::kStale;
    return ErrnoStatus("mount point " + path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument("mount point " + path + " is not a directory");
  }
  return IsMountedAt(path) ? MountPointState::kLive : MountPointState::kFree;
}

Status CleanStaleMount(const std::string& path) {
  if (::umount2(path.c_str(), MNT_DETACH) != 0) {
    return ErrnoStatus("unmounting the stale mount at " + path, errno);
  }
  return Status::Ok();
}

}  // namespace fleetfs::vfs
