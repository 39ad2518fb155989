#include "vfs/init_reply.h"

#include <linux/fuse.h>

#include <algorithm>
#include <cstring>

namespace fleetfs::vfs {
namespace {

template <typename T>
T Load(const char* at) {
  T v;
  std::memcpy(&v, at, sizeof(v));
  return v;
}

template <typename T>
void Store(char* at, T v) {
  std::memcpy(at, &v, sizeof(v));
}

// The kernel's floor for a request buffer (FUSE_MIN_READ_BUFFER) and its
// page count when the answer does not set max_pages.
constexpr std::size_t kMinReadBuffer = 8192;
constexpr std::size_t kDefaultMaxPages = 32;
constexpr std::size_t kPage = 4096;

}  // namespace

void InitReplyPatch::SawRequest(const void* buf, std::size_t n) {
  if (n < sizeof(fuse_in_header) + sizeof(std::uint32_t) * 4) return;
  const char* p = static_cast<const char*>(buf);
  const auto in = Load<fuse_in_header>(p);
  if (in.opcode != FUSE_INIT) return;
  // fuse_init_in: major, minor, max_readahead, flags, then flags2 (7.36).
  const char* body = p + sizeof(in);
  const auto flags = Load<std::uint32_t>(body + offsetof(fuse_init_in, flags));
  std::uint32_t flags2 = 0;
  if ((flags & FUSE_INIT_EXT) != 0 &&
      n >= sizeof(in) + offsetof(fuse_init_in, flags2) + sizeof(flags2)) {
    flags2 = Load<std::uint32_t>(body + offsetof(fuse_init_in, flags2));
  }
  dirops_offered_.store((flags & FUSE_PARALLEL_DIROPS) != 0);
  uring_offered_.store((flags2 & (kOverIoUring >> 32)) != 0);
  init_unique_.store(in.unique);
}

bool InitReplyPatch::Patch(const struct iovec* iov, int count, std::string* scratch) {
  const std::uint64_t unique = init_unique_.load();
  if (unique == 0 || patched_.load() || count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) {
    return false;
  }
  const auto out = Load<fuse_out_header>(static_cast<const char*>(iov[0].iov_base));
  if (out.unique != unique || out.error != 0) return false;
  const bool dirops = dirops_offered_.load();
  const bool uring = ask_uring_ && uring_offered_.load();
  if (!dirops && !uring) return false;
  scratch->clear();
  for (int i = 0; i < count; ++i) {
    scratch->append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  }
  char* body = scratch->data() + sizeof(fuse_out_header);
  // flags2 is the last field this needs; libfuse answers a kernel of 7.23 or
  // later with the whole structure.
  if (scratch->size() < sizeof(fuse_out_header) + offsetof(fuse_init_out, flags2) + 4) return false;
  auto flags = Load<std::uint32_t>(body + offsetof(fuse_init_out, flags));
  if (dirops) flags |= FUSE_PARALLEL_DIROPS;
  if (uring) {
    const bool ext = (flags & FUSE_INIT_EXT) != 0;
    auto flags2 = ext ? Load<std::uint32_t>(body + offsetof(fuse_init_out, flags2)) : 0u;
    flags |= FUSE_INIT_EXT;
    flags2 |= static_cast<std::uint32_t>(kOverIoUring >> 32);
    Store(body + offsetof(fuse_init_out, flags2), flags2);
    // The kernel's max_payload_sz: the largest of its floor, max_write and
    // max_pages pages (32 when the answer does not set max_pages).
    const std::size_t max_write =
        std::max<std::size_t>(4096, Load<std::uint32_t>(body + offsetof(fuse_init_out, max_write)));
    std::size_t pages = kDefaultMaxPages;
    if ((flags & FUSE_MAX_PAGES) != 0) {
      pages = std::max<std::size_t>(1, Load<std::uint16_t>(body + offsetof(fuse_init_out, max_pages)));
    }
    payload_size_.store(std::max({kMinReadBuffer, max_write, pages * kPage}));
  }
  Store(body + offsetof(fuse_init_out, flags), flags);
  setxattr_ext_.store((flags & FUSE_SETXATTR_EXT) != 0);
  patched_.store(true);
  if (dirops) dirops_applied_.store(true);
  if (uring) uring_announced_.store(true);
  return true;
}

}  // namespace fleetfs::vfs
