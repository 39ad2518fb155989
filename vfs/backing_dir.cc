#include "vfs/backing_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fleet/layout.h"
#include "fleet/tenant_file.h"

namespace fleetfs::vfs {
namespace {

// A refused name is logged at most once a minute, and at most this many
// names are tracked.
constexpr std::chrono::seconds kRefusalLogInterval{60};
constexpr std::size_t kRefusalLogNames = 10'000;

}  // namespace

BackingDir::BackingDir(const MonotonicClock& clock)
    : clock_(clock), refusals_(kRefusalLogInterval, kRefusalLogNames) {
  for (auto& fd : bucket_fds_) fd.store(-1);
}

Status BackingDir::Open(const std::string& path) {
  root_fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd_.valid()) return ErrnoStatus("backing directory " + path, errno);
  if (::fstat(root_fd_.get(), &root_stat_) != 0) {
    return ErrnoStatus("backing directory " + path, errno);
  }
  return Status::Ok();
}

int BackingDir::BucketFd(int bucket) {
  int fd = bucket_fds_[bucket].load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  std::string name = BucketName(bucket);
  fd = ::openat(root_fd_.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      Refused(name, "in the backing directory is a symlink or not a directory: refused, its "
                    "files stay hidden (buckets must be directories in the backing root)");
    } else if (err != ENOENT) {
      Refused(name, std::string("in the backing directory cannot be opened: ") +
                        std::strerror(err));
    }
    return -err;
  }
  int expected = -1;
  if (!bucket_fds_[bucket].compare_exchange_strong(expected, fd)) {
    ::close(fd);
    return expected;
  }
  return fd;
}

int BackingDir::EnsureBucket(int bucket) {
  int fd = BucketFd(bucket);
  if (fd >= 0) return fd;
  auto made = OpenOrMakeBucket(root_fd_.get(), bucket);
  if (!made.ok()) {
    Refused(BucketName(bucket), "refused a create: " + made.status().message());
    return -EIO;
  }
  made->Reset();
  fd = BucketFd(bucket);
  return fd >= 0 ? fd : -EIO;
}

void BackingDir::StatBucket(int bucket, struct stat* st) {
  int fd = BucketFd(bucket);
  if (fd < 0 || ::fstat(fd, st) != 0) {
    *st = root_stat_;
    st->st_nlink = 2;
  }
  st->st_ino = BucketIno(bucket);
}

int BackingDir::OpenFile(const FileInode& inode, int flags, UniqueFd* out) {
  int bfd = BucketFd(inode.bucket);
  if (bfd < 0) return ESTALE;
  UniqueFd fd(::openat(bfd, inode.name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return errno == ENOENT || errno == ELOOP ? ESTALE : errno;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (st.st_dev != inode.dev || st.st_ino != inode.backing_ino) return ESTALE;  // replaced
  *out = std::move(fd);
  return 0;
}

int BackingDir::StatFile(const FileInode& inode, struct stat* st) {
  int bfd = BucketFd(inode.bucket);
  if (bfd < 0) return ESTALE;
  if (::fstatat(bfd, inode.name.c_str(), st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? ESTALE : errno;
  }
  if (st->st_dev != inode.dev || st->st_ino != inode.backing_ino) return ESTALE;
  return 0;
}

void BackingDir::Refused(const std::string& name, std::string_view why) {
  refusals_.Refused(name, clock_.Now(), name + " " + std::string(why));
}

int BackingDir::NotAFleetFile(int bucket, std::string_view name, const struct stat& st) {
  Refused(BucketName(bucket) + "/" + std::string(name),
          S_ISLNK(st.st_mode)
              ? "in the backing directory is a symlink: refused, answered ENOENT (a fleet file "
                "is a regular file; a symlink could lead out of the backing root)"
              : "in the backing directory is not a regular file: refused, answered ENOENT");
  return ENOENT;
}

void BackingDir::CloseBuckets() {
  for (auto& fd : bucket_fds_) {
    int old = fd.exchange(-1);
    if (old >= 0) ::close(old);
  }
}

}  // namespace fleetfs::vfs
