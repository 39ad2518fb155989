#include "vfs/init_reply.h"

#include <linux/fuse.h>

#include <cstring>

namespace fleetfs::vfs {

void ParallelDirops::SawRequest(const void* buf, std::size_t n) {
  if (n < sizeof(fuse_in_header) + sizeof(std::uint32_t) * 4) return;
  fuse_in_header in;
  std::memcpy(&in, buf, sizeof(in));
  if (in.opcode != FUSE_INIT) return;
  // fuse_init_in starts major, minor, max_readahead, flags.
  std::uint32_t flags = 0;
  std::memcpy(&flags, static_cast<const char*>(buf) + sizeof(in) + 3 * sizeof(std::uint32_t),
              sizeof(flags));
  offered_.store((flags & FUSE_PARALLEL_DIROPS) != 0);
  init_unique_.store(in.unique);
}

bool ParallelDirops::Patch(const struct iovec* iov, int count, std::string* scratch) {
  const std::uint64_t unique = init_unique_.load();
  if (unique == 0 || !offered_.load() || applied_.load() || count < 1 ||
      iov[0].iov_len < sizeof(fuse_out_header)) {
    return false;
  }
  fuse_out_header out;
  std::memcpy(&out, iov[0].iov_base, sizeof(out));
  if (out.unique != unique || out.error != 0) return false;
  scratch->clear();
  for (int i = 0; i < count; ++i) {
    scratch->append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  }
  const std::size_t at = sizeof(fuse_out_header) + offsetof(fuse_init_out, flags);
  if (scratch->size() < at + sizeof(std::uint32_t)) return false;
  std::uint32_t flags = 0;
  std::memcpy(&flags, scratch->data() + at, sizeof(flags));
  flags |= FUSE_PARALLEL_DIROPS;
  std::memcpy(scratch->data() + at, &flags, sizeof(flags));
  applied_.store(true);
  return true;
}

}  // namespace fleetfs::vfs
