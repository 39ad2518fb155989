#include "vfs/control_files.h"

namespace fleetfs::vfs {
namespace {

constexpr std::string_view kStatusName = "status.json";
constexpr std::string_view kRangesName = "ranges";
constexpr std::string_view kControlName = "control";
constexpr std::string_view kTenantsLiveName = "tenants-live.jsonl";

}  // namespace

Ino ControlFiles::Lookup(Ino parent, std::string_view name) {
  if (parent == kRootIno) return name == kControlDirName ? kControlDirIno : 0;
  if (parent != kControlDirIno) return 0;
  if (name == kStatusName) return kStatusIno;
  if (name == kRangesName) return kRangesIno;
  if (name == kControlName) return kControlIno;
  if (name == kTenantsLiveName) return kTenantsLiveIno;
  return 0;
}

struct stat ControlFiles::Attr(Ino ino, const struct timespec& mtime) {
  struct stat st {};
  st.st_ino = ino;
  st.st_uid = 0;
  st.st_gid = 0;
  st.st_atim = st.st_mtim = st.st_ctim = mtime;
  if (ino == kControlDirIno) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2;
  } else if (ino == kControlIno) {
    st.st_mode = S_IFREG | 0666;  // the mount checks the caller, see the header
    st.st_nlink = 1;
  } else {
    // Made at open; the size is unknown until then (direct I/O reads to EOF).
    st.st_mode = S_IFREG | 0444;
    st.st_nlink = 1;
  }
  return st;
}

std::vector<ControlFiles::Entry> ControlFiles::List() {
  return {{std::string(kStatusName), kStatusIno, S_IFREG},
          {std::string(kRangesName), kRangesIno, S_IFREG},
          {std::string(kControlName), kControlIno, S_IFREG},
          {std::string(kTenantsLiveName), kTenantsLiveIno, S_IFREG}};
}

std::string ControlFiles::Contents(Ino ino) const {
  if (ino == kControlIno) return std::string();
  const auto& make = ino == kStatusIno   ? status_json_
                     : ino == kRangesIno ? ranges_text_
                                         : tenants_live_;
  return make ? make() : std::string();
}

}  // namespace fleetfs::vfs
