// VolumeLock: one agent per backing directory. An exclusive flock on
// BACKING/.fleetfs/agent.lock, held for the agent's life; the file names the
// holder's pid so a second agent can say who has it. The kernel drops the
// lock when the holder dies, so a crashed agent never leaves it behind.
//
// Thread-safety: a value owned by the agent.
#pragma once

#include <string>

#include "fleet/status.h"
#include "fleet/unique_fd.h"

namespace fleetfs::agent {

class VolumeLock {
 public:
  // FailedPrecondition naming the holder's pid when another agent holds it.
  static Result<VolumeLock> Acquire(const std::string& backing);
  const std::string& path() const { return path_; }

 private:
  VolumeLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

}  // namespace fleetfs::agent
