// The mount point at start: free, a fleetfs mount whose agent has died
// (stale), or in use. Called with the volume lock held, so no agent of this
// backing directory is alive; a fleetfs mount here is told dead or live by
// asking it (opening MOUNT/.fleetfs/status.json needs its daemon), never by
// stat, which the kernel may answer from cached attributes for a while
// after the daemon died.
//
// Thread-safety: functions of the file system's state; no shared state.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "fleet/status.h"

namespace fleetfs::agent {

struct MountEntry {
  std::string point;   // unescaped
  std::string fstype;  // "fuse.fleetfs" for ours
  std::string source;
  // FUSE's user_id= (the uid that mounted it; fusermount3 sets it from the
  // caller's real uid, which a user cannot choose, unlike the fstype's
  // subtype). Empty when the line has none.
  std::optional<uid_t> fuse_user;
};

// The entries of /proc/self/mountinfo mounted exactly at `path`, bottom first.
std::vector<MountEntry> MountsAt(const std::string& path);

// Parses one line of /proc/self/mountinfo; false when it is not one.
bool ParseMountInfoLine(const std::string& line, MountEntry& entry);

// Detaches every dead fleetfs mount stacked at `path` (logging each), and
// refuses a live one or anything else mounted there (FailedPrecondition).
// Precondition: the caller holds the volume lock.
Status ClearMountPoint(const std::string& path);

}  // namespace fleetfs::agent
