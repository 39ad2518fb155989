#include "fleet/tenant_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>

#include "fleet/layout.h"

namespace fleetfs {
namespace {

// fgetxattr refuses O_PATH descriptors; the /proc link works for every kind.
std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// Buckets are directories the agent makes; a symlink could lead out of the
// backing root, so it is refused, and the message says what was found.
Status NotADirectory(int root_fd, const std::string& name) {
  struct stat st;
  std::string what = "not a directory";
  if (::fstatat(root_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    what = "a symlink; buckets must be directories in the backing root";
  }
  return Status(Code::kFailedPrecondition, "bucket " + name + " is " + what);
}

}  // namespace

std::optional<std::uint64_t> ReadEpochStamp(int fd) {
  char buf[32];
  ssize_t n = ::getxattr(ProcPath(fd).c_str(), kEpochStampXattr.data(), buf, sizeof buf);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof buf)) return std::nullopt;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(buf, buf + n, v);
  if (ec != std::errc() || end != buf + n) return std::nullopt;
  return v;
}

std::optional<std::string> ReadKeyStamp(int fd) {
  char buf[kMaxTenantIdBytes + 1];
  ssize_t n = ::getxattr(ProcPath(fd).c_str(), kKeyStampXattr.data(), buf, sizeof buf);
  if (n < 0 && errno == ERANGE) return std::string(sizeof buf, '?');  // too long: names no key
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<std::size_t>(n));
}

Status WriteStamps(int fd, std::uint64_t epoch, std::string_view key, std::string_view what) {
  std::string path = ProcPath(fd);
  std::string e = std::to_string(epoch);
  if (::setxattr(path.c_str(), kEpochStampXattr.data(), e.data(), e.size(), 0) != 0 ||
      ::setxattr(path.c_str(), kKeyStampXattr.data(), key.data(), key.size(), 0) != 0) {
    return ErrnoStatus(std::string("stamping ") + std::string(what) + " with its epoch and key",
                       errno);
  }
  return Status::Ok();
}

std::optional<FileIdentity> ReadFileIdentity(int root, const std::string& main_path) {
  struct stat st;
  if (::fstatat(root, main_path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  auto ns = [](const struct timespec& t) {
    return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(t.tv_nsec);
  };
  FileIdentity id{static_cast<std::uint64_t>(st.st_ino), static_cast<std::uint64_t>(st.st_size),
                  ns(st.st_mtim), 0, 0};
  if (::fstatat(root, (main_path + "-wal").c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    id.wal_size = static_cast<std::uint64_t>(st.st_size);
    id.wal_mtime_ns = ns(st.st_mtim);
  } else if (errno != ENOENT) {
    return std::nullopt;
  }
  return id;
}

std::optional<ShippedStamp> ReadShippedStamp(int fd) {
  char buf[192];
  ssize_t n = ::getxattr(ProcPath(fd).c_str(), kShippedStampXattr.data(), buf, sizeof buf);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof buf)) return std::nullopt;
  const char* at = buf;
  const char* end = buf + n;
  ShippedStamp s;
  std::uint64_t* fields[] = {&s.seq, &s.checksum, &s.files.ino, &s.files.size, &s.files.mtime_ns,
                             &s.files.wal_size, &s.files.wal_mtime_ns};
  for (std::size_t i = 0; i < std::size(fields); ++i) {
    if (i > 0) {
      if (at == end || *at != ' ') return std::nullopt;
      ++at;
    }
    auto [next, ec] = std::from_chars(at, end, *fields[i], i == 1 ? 16 : 10);
    if (ec != std::errc()) return std::nullopt;
    at = next;
  }
  if (at != end) return std::nullopt;
  return s;
}

Status WriteShippedStamp(int fd, const ShippedStamp& stamp, std::string_view what) {
  char buf[192];
  const int n = std::snprintf(
      buf, sizeof buf, "%llu %llx %llu %llu %llu %llu %llu",
      static_cast<unsigned long long>(stamp.seq), static_cast<unsigned long long>(stamp.checksum),
      static_cast<unsigned long long>(stamp.files.ino),
      static_cast<unsigned long long>(stamp.files.size),
      static_cast<unsigned long long>(stamp.files.mtime_ns),
      static_cast<unsigned long long>(stamp.files.wal_size),
      static_cast<unsigned long long>(stamp.files.wal_mtime_ns));
  if (::setxattr(ProcPath(fd).c_str(), kShippedStampXattr.data(), buf, static_cast<std::size_t>(n),
                 0) != 0) {
    return ErrnoStatus(std::string("stamping ") + std::string(what) + " with its shipped state",
                       errno);
  }
  return Status::Ok();
}

Result<UniqueFd> OpenOrMakeBucket(int root_fd, int bucket) {
  const std::string name = BucketName(bucket);
  auto open = [&] {
    return UniqueFd(::openat(root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  };
  UniqueFd fd = open();
  if (fd.valid()) return fd;
  if (errno == ENOTDIR || errno == ELOOP) return NotADirectory(root_fd, name);
  if (errno != ENOENT) return ErrnoStatus("bucket " + name, errno);
  struct stat root;
  if (::fstat(root_fd, &root) != 0) return ErrnoStatus("the backing root", errno);
  // Made 0700, then given the root's owner and mode explicitly: the umask
  // does not apply, and nobody sees the directory half made.
  const bool made = ::mkdirat(root_fd, name.c_str(), 0700) == 0;
  if (!made && errno != EEXIST) return ErrnoStatus("making bucket " + name, errno);
  fd = open();
  if (!fd.valid() && (errno == ENOTDIR || errno == ELOOP)) return NotADirectory(root_fd, name);
  if (!fd.valid()) return ErrnoStatus("bucket " + name, errno);
  if (made && (::fchown(fd.get(), root.st_uid, root.st_gid) != 0 ||
               ::fchmod(fd.get(), root.st_mode & 07777) != 0)) {
    return ErrnoStatus("giving bucket " + name + " the backing root's owner and mode", errno);
  }
  return fd;
}

}  // namespace fleetfs
