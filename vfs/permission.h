// The kernel's permission rule for a file the mount opens on a caller's
// behalf without the kernel having checked it (a create that finds the file
// already there: the kernel believed the name absent, so it checked only the
// directory). The agent runs as root, so the mount checks as the kernel
// would: owner, group (primary and supplementary) or other bits of the
// file's mode, for every access the open asks for; root may do anything.
//
// Thread-safety: pure functions.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string_view>
#include <vector>

namespace fleetfs::vfs {

struct Caller {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary
};

// The accesses (R_OK, W_OK) an open with `flags` asks for: its access mode,
// and write for O_TRUNC.
int AccessWanted(int flags);
// Whether `caller` may have `wanted` (R_OK|W_OK|X_OK bits) on a file with
// owner, group and mode `st`.
bool MayAccess(const struct stat& st, const Caller& caller, int wanted);

// The supplementary groups on the "Groups:" line of a /proc/PID/status text
// (empty when there is none). Pure.
std::vector<gid_t> ParseStatusGroups(std::string_view status);
// The supplementary groups of process (or thread) `pid`, read from
// /proc/PID/status; empty when it cannot be read. libfuse's
// fuse_req_getgroups is not used: in 3.14 it runs strstr over a buffer it
// never terminates (AddressSanitizer saw the overread).
std::vector<gid_t> SupplementaryGroups(pid_t pid);

}  // namespace fleetfs::vfs
