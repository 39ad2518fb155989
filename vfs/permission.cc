#include "vfs/permission.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <string>

#include "fleet/unique_fd.h"

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

std::vector<gid_t> ParseStatusGroups(std::string_view status) {
  std::vector<gid_t> groups;
  constexpr std::string_view kTag = "Groups:";
  std::size_t at = status.rfind(std::string("\n") + std::string(kTag));
  if (at == std::string_view::npos) {
    if (status.substr(0, kTag.size()) != kTag) return groups;
    at = 0;
  } else {
    at += 1;
  }
  std::string_view line = status.substr(at + kTag.size());
  line = line.substr(0, line.find('\n'));
  const char* p = line.data();
  const char* end = line.data() + line.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    if (p == end) break;
    unsigned long v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || next == p) break;
    groups.push_back(static_cast<gid_t>(v));
    p = next;
  }
  return groups;
}

std::vector<gid_t> SupplementaryGroups(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  std::string text;
  char buf[4096];
  // A status file is a few KiB; the bound keeps a strange one from costing more.
  while (text.size() < (1u << 20)) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return ParseStatusGroups(text);
}

}  // namespace fleetfs::vfs
