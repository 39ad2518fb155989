// InitReplyPatch: adds to INIT's answer what libfuse 3.14 (Debian 12's)
// cannot ask for itself: parallel directory operations, and FUSE over
// io_uring when the mount asked for it.
//
// Why parallel lookups: without FUSE_PARALLEL_DIROPS in INIT's answer the
// kernel takes a directory's lock for every lookup in it. A lookup that waits
// for a restore (DESIGN 4: a file is restored before it is exposed) then
// holds its whole bucket: every other lookup there, of any user, waits until
// the restore ends, and one user's slow restores stall everybody's opens in
// their buckets. libfuse documents the flag as on by default, but before
// 3.16 it never put it in the answer (libfuse#861).
//
// Why io_uring here: the kernel only carries requests over io_uring when
// INIT's answer carries FUSE_OVER_IO_URING (a flags2 bit, behind
// FUSE_INIT_EXT), which libfuse 3.14 does not know. The payload buffers each
// ring entry registers must hold the largest request the answer allows
// (max_write, max_pages): the answer is read here for that size.
//
// The mount's reads and writes of /dev/fuse pass through here
// (fuse_session_custom_io): the INIT request's id and what the kernel offers
// are noted, and flags are added to that one answer when the kernel offered
// them. Every other message passes untouched.
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
// Thread-safety: SawRequest and Patch may be called from any thread; AskForUring
// before the INIT request is read.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fleetfs::vfs {

class InitReplyPatch {
 public:
  // FUSE_OVER_IO_URING is flags2 bit 9; Debian 12's <linux/fuse.h> (6.1)
  // predates it.
  static constexpr std::uint64_t kOverIoUring = 1ULL << 41;

  // Whether to announce io_uring when the kernel offers it.
  void AskForUring(bool ask) { ask_uring_ = ask; }

  // Notes an INIT request (`n` bytes read from /dev/fuse); others are ignored.
  void SawRequest(const void* buf, std::size_t n);
  // When `iov` is the answer to the INIT request seen and there is something
  // to add, copies the message into `scratch` with the flags added and
  // returns true: the caller writes `scratch` instead.
  bool Patch(const struct iovec* iov, int count, std::string* scratch);

  bool dirops_applied() const { return dirops_applied_.load(std::memory_order_relaxed); }
  // Whether the INIT request offered FUSE over io_uring (the kernel has it
  // and its `enable_uring` parameter is on).
  bool uring_offered() const { return uring_offered_.load(); }
  // Whether INIT's answer announced it: the kernel now waits for every
  // queue to register before it sends any request (fuse_block_alloc).
  bool uring_announced() const { return uring_announced_.load(); }
  // The payload size every ring entry needs (the kernel's max_payload_sz),
  // known once the answer is patched.
  std::size_t uring_payload_size() const { return payload_size_.load(); }
  // Whether the answer took FUSE_SETXATTR_EXT (setxattr's header is longer).
  bool setxattr_ext() const { return setxattr_ext_.load(); }

 private:
  bool ask_uring_ = false;
  std::atomic<std::uint64_t> init_unique_{0};  // 0: no INIT request seen
  std::atomic<bool> dirops_offered_{false};
  std::atomic<bool> uring_offered_{false};
  std::atomic<bool> dirops_applied_{false};
  std::atomic<bool> uring_announced_{false};
  std::atomic<bool> patched_{false};
  std::atomic<std::size_t> payload_size_{0};
  std::atomic<bool> setxattr_ext_{false};
};

}  // namespace fleetfs::vfs
