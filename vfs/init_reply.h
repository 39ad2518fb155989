// ParallelDirops: has the kernel send lookups and readdirs of one directory
// in parallel, which libfuse 3.14 (Debian 12's) never asks it to.
//
// Why: without FUSE_PARALLEL_DIROPS in INIT's answer the kernel takes a
// directory's lock for every lookup in it. A lookup that waits for a restore
// (DESIGN 4: a file is restored before it is exposed) then holds its whole
// bucket: every other lookup there, of any user, waits until the restore
// ends, and one user's slow restores stall everybody's opens in their
// buckets. libfuse documents the flag as on by default, but before 3.16 it
// never put it in the answer (libfuse#861). The mount's reads and writes of
// /dev/fuse pass through here (fuse_session_custom_io): the INIT request's id
// and what the kernel offers are noted, and the flag is added to that one
// answer when the kernel offered it. Every other message passes untouched.
//
// What it does not fix: the VFS itself holds a directory shared for a lookup
// in it, so while a lookup waits for a restore, a create or unlink in that
// bucket (which holds it exclusive) waits too, and lookups behind that
// writer. Bounding that needs lookups that never wait for a restore (the
// open waits instead); it is written down as an open item of issue 10.
//
// The handlers are safe with lookups of one directory in parallel: the inode
// table and the negative names take their own locks, and each listing opens
// its own descriptor of the directory.
//
// Thread-safety: SawRequest and Patch may be called from any thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fleetfs::vfs {

class ParallelDirops {
 public:
  // Notes an INIT request (`n` bytes read from /dev/fuse); others are ignored.
  void SawRequest(const void* buf, std::size_t n);
  // When `iov` is the answer to the INIT request seen and the kernel offered
  // parallel directory operations, copies the message into `scratch` with
  // the flag added and returns true: the caller writes `scratch` instead.
  bool Patch(const struct iovec* iov, int count, std::string* scratch);
  // Whether the flag went into INIT's answer.
  bool applied() const { return applied_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> init_unique_{0};  // 0: no INIT request seen
  std::atomic<bool> offered_{false};
  std::atomic<bool> applied_{false};
};

}  // namespace fleetfs::vfs
