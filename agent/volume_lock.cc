#include "agent/volume_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace fleetfs::agent {

Result<VolumeLock> VolumeLock::Acquire(const std::string& backing) {
  const std::string dir = backing + "/.fleetfs";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus("the agent's directory " + dir, errno);
  }
  const std::string path = dir + "/agent.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoStatus("the volume lock " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoStatus("the volume lock " + path, errno);
    char pid[32] = {};
    ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status(Code::kFailedPrecondition,
                  "backing directory " + backing + " is in use by another fleetfs agent (pid " +
                      holder + ", lock " + path + "); one agent serves a backing directory");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return ErrnoStatus("writing the volume lock " + path, errno);
  }
  return VolumeLock(path, std::move(fd));
}

}  // namespace fleetfs::agent
