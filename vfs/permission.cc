#include "vfs/permission.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

namespace fleetfs::vfs {

int AccessWanted(int flags) {
  int wanted = 0;
  switch (flags & O_ACCMODE) {
    case O_RDONLY: wanted = R_OK; break;
    case O_WRONLY: wanted = W_OK; break;
    default: wanted = R_OK | W_OK; break;
  }
  if (flags & O_TRUNC) wanted |= W_OK;
  return wanted;
}

bool MayAccess(const struct stat& st, const Caller& caller, int wanted) {
  if (caller.uid == 0) return true;  // CAP_DAC_OVERRIDE, for reads and writes
  mode_t bits;
  if (caller.uid == st.st_uid) {
    bits = (st.st_mode >> 6) & 7;
  } else if (caller.gid == st.st_gid ||
             std::find(caller.groups.begin(), caller.groups.end(), st.st_gid) !=
                 caller.groups.end()) {
    bits = (st.st_mode >> 3) & 7;
  } else {
    bits = st.st_mode & 7;
  }
  // R_OK, W_OK and X_OK are 4, 2 and 1: the same bits as the mode's.
  return (static_cast<int>(bits) & wanted) == wanted;
}

}  // namespace fleetfs::vfs
