// ControlFiles: the read-only virtual directory MOUNT/.fleetfs/ and its files.
//
//   .fleetfs/status.json   the agent's state (DESIGN section 6)
//   .fleetfs/ranges        the served ranges, one a line
//   .fleetfs/tenants-live.jsonl
//                          the tenants the agent holds live state for (open
//                          handles, commits shipped or pending), one JSON
//                          object a line: what `fleetfs ls` joins to the
//                          files it reads from the backing directory. Its
//                          size follows the active tenants, never the fleet.
//   .fleetfs/control       write-only requests (handoff, drain) from root or
//                          the agent's own user; the reply is read back from
//                          the same descriptor
//
// The control file's mode is 0666 on purpose: the kernel lets every open
// through, and the mount itself refuses (EACCES, and a log line) every
// caller that is neither uid 0 nor the agent's effective uid, at open and
// again at each write (a descriptor may be passed to another process).
//
// Their contents are made anew at each open (by the agent's functions, on the
// FUSE thread that answers the open) and never cached by the kernel.
//
// Thread-safety: immutable after construction; the content functions must be
// safe from any thread.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "vfs/inode_table.h"

namespace fleetfs::vfs {

inline constexpr std::string_view kControlDirName = ".fleetfs";

class ControlFiles {
 public:
  struct Entry {
    std::string name;
    Ino ino = 0;
    mode_t type = 0;  // S_IFREG or S_IFDIR
  };

  ControlFiles(std::function<std::string()> status_json, std::function<std::string()> ranges_text,
               std::function<std::string()> tenants_live = {})
      : status_json_(std::move(status_json)),
        ranges_text_(std::move(ranges_text)),
        tenants_live_(std::move(tenants_live)) {}

  // The control directory or one of its files.
  static bool Is(Ino ino) { return ino == kControlDirIno || IsFile(ino); }
  static bool IsFile(Ino ino) {
    return ino == kStatusIno || ino == kRangesIno || ino == kControlIno ||
           ino == kTenantsLiveIno;
  }
  // Whether `uid` may send requests through .fleetfs/control: root, or the
  // user the agent runs as.
  static bool MayControl(uid_t uid, uid_t agent_euid) { return uid == 0 || uid == agent_euid; }
  // The inode of `name` in `parent` (the root or the control directory), or
  // 0 when it is none of them.
  static Ino Lookup(Ino parent, std::string_view name);
  // Attributes: owned by root, read-only, times of the backing root.
  static struct stat Attr(Ino ino, const struct timespec& mtime);
  // The control directory's files.
  static std::vector<Entry> List();

  // The content of file `ino`, made now.
  std::string Contents(Ino ino) const;

 private:
  std::function<std::string()> status_json_;
  std::function<std::string()> ranges_text_;
  std::function<std::string()> tenants_live_;
};

}  // namespace fleetfs::vfs
