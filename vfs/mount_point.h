// The mount point before a mount: free, left behind by a crashed agent
// (stale), or in use.
//
// Thread-safety: functions of the file system's state; no shared state.
#pragma once

#include <string>

#include "fleet/status.h"

namespace fleetfs::vfs {

enum class MountPointState { kFree, kStale, kLive };

// kStale: a FUSE mount whose daemon is gone (stat says ENOTCONN). kLive:
// anything mounted there that still answers. Fails when the path is no
// directory.
Result<MountPointState> InspectMountPoint(const std::string& path);

// Detaches a stale mount at `path`.
Status CleanStaleMount(const std::string& path);

}  // namespace fleetfs::vfs
