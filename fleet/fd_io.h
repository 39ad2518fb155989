// Whole reads and writes on file descriptors: retried on EINTR and on short
// counts, errno turned into a Status once, here.
//
// Thread-safety: plain functions; the descriptor is the caller's.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "fleet/status.h"

namespace fleetfs {

// Writes all `n` bytes at the descriptor's offset.
inline Status WriteAll(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("writing", errno);
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return Status::Ok();
}

// Writes all `n` bytes at `offset`.
inline Status PwriteAll(int fd, const char* data, std::size_t n, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("writing", errno);
    }
    done += static_cast<std::size_t>(w);
  }
  return Status::Ok();
}

// Reads `n` bytes at `offset`; fewer only at the end of the file.
inline Result<std::size_t> PreadFull(int fd, void* buf, std::size_t n, std::uint64_t offset) {
  auto* out = static_cast<char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading", errno);
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

}  // namespace fleetfs
