// BackingDir: the backing root and its 256 bucket directories, as the mount
// reaches them.
//
// The root and each bucket that exists are held open (at most 257
// descriptors); a fleet file is opened by its name under its bucket's
// descriptor when an operation needs it, never following a symlink, and
// checked to be the file the inode was found as. What the backing directory
// holds that the layout does not allow (a symlinked bucket or tenant, a
// directory where a file should be) is refused with a line in the log, at
// most once a minute per name, so a user cannot flood the log.
//
// Thread-safety: every method is safe from any thread once Open returned.
#pragma once

#include <sys/stat.h>

#include <array>
#include <atomic>
#include <string>
#include <string_view>

#include "fleet/clock.h"
#include "fleet/slot.h"
#include "fleet/status.h"
#include "fleet/unique_fd.h"
#include "vfs/inode_table.h"
#include "vfs/refusal_log.h"

namespace fleetfs::vfs {

class BackingDir {
 public:
  explicit BackingDir(const MonotonicClock& clock);
  ~BackingDir() { CloseBuckets(); }
  BackingDir(const BackingDir&) = delete;
  BackingDir& operator=(const BackingDir&) = delete;

  // Opens the root, an existing directory.
  Status Open(const std::string& path);
  int root_fd() const { return root_fd_.get(); }
  const struct stat& root_stat() const { return root_stat_; }

  // The bucket's descriptor, or -errno (-ENOENT: not made yet, no file in
  // it). A bucket that is a symlink or no directory is refused (logged).
  int BucketFd(int bucket);
  // As BucketFd, making the bucket when it is not there (OpenOrMakeBucket:
  // the root's owner and mode). Only a create calls it: a lookup never makes
  // anything. -EIO when the bucket cannot be made or is refused.
  int EnsureBucket(int bucket);
  // A bucket's attributes; one not made yet looks like the root, empty.
  void StatBucket(int bucket, struct stat* st);

  // Opens `inode`'s file with `flags` (plus O_NOFOLLOW): ESTALE when the
  // name is gone or now names another file (replaced under the name).
  int OpenFile(const FileInode& inode, int flags, UniqueFd* out);
  // The same for its attributes.
  int StatFile(const FileInode& inode, struct stat* st);

  // Says in the log (rate-limited per name) that `name` was refused and why.
  void Refused(const std::string& name, std::string_view why);
  // What a name in a bucket that is no regular file gets: ENOENT (it is no
  // fleet file), and a line in the log.
  int NotAFleetFile(int bucket, std::string_view name, const struct stat& st);

  // Closes the bucket descriptors (the mount is gone).
  void CloseBuckets();

 private:
  const MonotonicClock& clock_;
  UniqueFd root_fd_;
  struct stat root_stat_ {};
  std::array<std::atomic<int>, kBucketCount> bucket_fds_{};  // -1: not opened yet
  RefusalLog refusals_;
};

}  // namespace fleetfs::vfs
