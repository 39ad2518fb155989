#include "fleet/replica/destination.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <utility>

#include "fleet/fd_io.h"
#include "fleet/replica/s3_destination.h"
#include "fleet/replica/s3_protocol.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {

Result<std::vector<std::string>> Destination::ListFrom(std::string_view dir,
                                                       std::string_view after) {
  FLEETFS_ASSIGN_OR_RETURN(std::vector<std::string> names, List(dir));
  // std::string compares as unsigned bytes, which is S3's listing order.
  std::erase_if(names, [&](const std::string& n) { return n <= after; });
  std::sort(names.begin(), names.end());
  return names;
}

Result<int> Destination::CleanTemps(std::chrono::seconds) { return 0; }

namespace {

constexpr std::string_view kFileScheme = "file://";
// A temporary file's name starts with this; List hides such names and
// ValidateObjectPath refuses them, so an object never looks like one.
constexpr std::string_view kTempPrefix = kDestinationTempPrefix;
// Tenant data is no more readable at the replica than in the volume.
constexpr mode_t kObjectMode = 0600;
constexpr mode_t kDirMode = 0700;

std::string ParentOf(const std::string& path) {
  std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Makes `dir` and its missing parents, each 0700 whatever the umask (the
// umask only takes bits away, so the moment between mkdir and chmod is never
// more open than 0700). A directory that exists is left as it is.
Status MakeDirs(const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == ".") return Status::Ok();
  if (::mkdir(dir.c_str(), kDirMode) == 0) {
    if (::chmod(dir.c_str(), kDirMode) != 0)
      return ErrnoStatus("setting the mode of " + dir, errno);
    return Status::Ok();
  }
  int err = errno;
  if (err == ENOENT) {
    FLEETFS_RETURN_IF_ERROR(MakeDirs(ParentOf(dir)));
    if (::mkdir(dir.c_str(), kDirMode) == 0) {
      if (::chmod(dir.c_str(), kDirMode) != 0)
        return ErrnoStatus("setting the mode of " + dir, errno);
      return Status::Ok();
    }
    err = errno;
  }
  if (err == EEXIST) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus("stat " + dir, errno);
    if (!S_ISDIR(st.st_mode)) {
      return Status(Code::kFailedPrecondition, dir + " exists and is not a directory");
    }
    return Status::Ok();
  }
  return ErrnoStatus("making " + dir, err);
}

Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("opening " + dir + " to sync it", errno);
  if (::fsync(fd.get()) != 0) return ErrnoStatus("syncing " + dir, errno);
  return Status::Ok();
}

// Copies `src` from offset 0 to its end into `dst` at its offset.
Status CopyAll(int src, int dst) {
  std::vector<char> buf(1 << 20);
  off_t off = 0;
  while (true) {
    ssize_t n = ::pread(src, buf.data(), buf.size(), off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading the local copy", errno);
    }
    if (n == 0) return Status::Ok();
    FLEETFS_RETURN_IF_ERROR(WriteAll(dst, buf.data(), static_cast<std::size_t>(n)));
    off += n;
  }
}

// A file being written before it has its name: either an O_TMPFILE (no name
// at all; closing it frees it) or a named temporary file beside the target,
// which the destructor unlinks unless Published() says a rename took it. So
// no error path leaves a temporary name behind; only a crash can, and
// CleanTemps removes those.
class StagedFile {
 public:
  StagedFile(UniqueFd fd, std::string temp_path)
      : fd_(std::move(fd)), temp_path_(std::move(temp_path)) {}
  StagedFile(StagedFile&& other) noexcept
      : fd_(std::move(other.fd_)), temp_path_(std::exchange(other.temp_path_, {})) {}
  StagedFile& operator=(StagedFile&&) = delete;
  ~StagedFile() {
    fd_.Reset();
    if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  }

  int fd() const { return fd_.get(); }
  // Empty for an O_TMPFILE.
  const std::string& temp_path() const { return temp_path_; }
  void Close() { fd_.Reset(); }
  // The temporary name was renamed away: nothing to unlink.
  void Published() { temp_path_.clear(); }

 private:
  UniqueFd fd_;
  std::string temp_path_;
};

class FileDestination final : public Destination {
 public:
  FileDestination(std::string url, std::string root, const DestinationOptions& options)
      : url_(std::move(url)), root_(std::move(root)) {
    // Linking an O_TMPFILE needs its /proc/self/fd name (AT_EMPTY_PATH needs
    // a capability the agent may lack).
    tmpfile_usable_ = !options.named_temps_only && ::access("/proc/self/fd", X_OK) == 0;
    std::random_device rd;
    nonce_ = (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  }

  const std::string& url() const override { return url_; }

  Result<std::vector<std::string>> List(std::string_view dir) override {
    std::vector<std::string> names;
    std::string path = Path(dir);
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(path.c_str()), &::closedir);
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return names;
      return ErrnoStatus("listing " + path, errno);
    }
    while (dirent* e = ::readdir(d.get())) {
      std::string_view n = e->d_name;
      if (n == "." || n == ".." || n.starts_with(kTempPrefix)) continue;
      names.emplace_back(n);
    }
    return names;
  }

  Status Put(std::string_view path, std::string_view bytes) override {
    return Replace(path, [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
  }

  Status PutFile(std::string_view path, int src) override {
    return Replace(path, [&](int fd) { return CopyAll(src, fd); });
  }

  Status Create(std::string_view path, std::string_view bytes) override {
    return CreateOnly(path, [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
  }

  Status CreateFromFile(std::string_view path, int src) override {
    return CreateOnly(path, [&](int fd) { return CopyAll(src, fd); });
  }

  Status Get(std::string_view path, const Sink& sink) override {
    std::string full = Path(path);
    UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return NotFound(full + " does not exist");
      return ErrnoStatus("opening " + full, errno);
    }
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<char> buf(1 << 20);
    while (true) {
      ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("reading " + full, errno);
      }
      if (n == 0) return Status::Ok();
      FLEETFS_RETURN_IF_ERROR(sink(std::string_view(buf.data(), static_cast<std::size_t>(n))));
    }
  }

  Result<std::string> GetHead(std::string_view path, std::size_t n) override {
    std::string full = Path(path);
    UniqueFd fd(::open(full.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return NotFound(full + " does not exist");
      return ErrnoStatus("opening " + full, errno);
    }
    std::string out(n, '\0');
    FLEETFS_ASSIGN_OR_RETURN(std::size_t got, PreadFull(fd.get(), out.data(), n, 0));
    out.resize(got);
    return out;
  }

  Result<std::uint64_t> Size(std::string_view path) override {
    struct stat st;
    std::string full = Path(path);
    if (::stat(full.c_str(), &st) != 0) {
      if (errno == ENOENT) return NotFound(full + " does not exist");
      return ErrnoStatus("stat " + full, errno);
    }
    return static_cast<std::uint64_t>(st.st_size);
  }

  Status Remove(std::string_view path) override {
    std::error_code ec;
    std::filesystem::remove_all(Path(path), ec);
    if (ec) return Status(Code::kIoError, "removing " + Path(path) + ": " + ec.message());
    return Status::Ok();
  }

  Status Probe() override { return Put(".probe", ""); }

  Result<int> CleanTemps(std::chrono::seconds max_age) override {
    auto cutoff = std::chrono::system_clock::now() - max_age;
    std::int64_t cutoff_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(cutoff.time_since_epoch()).count();
    int removed = 0;
    Status st = CleanDir(root_, cutoff_ns, removed);
    if (!st.ok()) return st.WithContext("cleaning temporary files of replica " + url_);
    return removed;
  }

 private:
  std::string Path(std::string_view rel) const {
    return rel.empty() ? root_ : root_ + "/" + std::string(rel);
  }

  std::string TempPath(const std::string& dir) {
    char name[64];
    std::snprintf(name, sizeof name, "%.*s%016" PRIx64 "-%" PRIu64,
                  static_cast<int>(kTempPrefix.size()), kTempPrefix.data(), nonce_,
                  counter_.fetch_add(1));
    return dir + "/" + name;
  }

  // A new empty file, 0600, in `dir`: an O_TMPFILE when `allow_tmpfile` and
  // the file system has them, else a named temporary file.
  Result<StagedFile> Stage(const std::string& dir, bool allow_tmpfile) {
    if (allow_tmpfile && tmpfile_usable_.load()) {
      UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, kObjectMode));
      if (fd.valid()) {
        if (::fchmod(fd.get(), kObjectMode) != 0) return ErrnoStatus("setting the mode", errno);
        return StagedFile(std::move(fd), "");
      }
      // Kernels and file systems without O_TMPFILE (NFS among them) say so
      // with one of these; they keep saying it, so stop asking.
      if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
        return ErrnoStatus("creating a temporary file in " + dir, errno);
      }
      tmpfile_usable_.store(false);
    }
    for (int attempt = 0;; ++attempt) {
      std::string tmp = TempPath(dir);
      UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kObjectMode));
      if (!fd.valid()) {
        // Another host with the same nonce: unlikely, and a new counter fixes it.
        if (errno == EEXIST && attempt < 3) continue;
        return ErrnoStatus("creating " + tmp, errno);
      }
      StagedFile staged(std::move(fd), std::move(tmp));
      if (::fchmod(staged.fd(), kObjectMode) != 0) {
        return ErrnoStatus("setting the mode of " + staged.temp_path(), errno);
      }
      return staged;
    }
  }

  // Write, sync, rename over the target, sync the directory: a reader on any
  // host sees the old object or the whole new one, and a crash leaves at most
  // a temporary file.
  template <typename Fill>
  Status Replace(std::string_view rel, Fill fill) {
    std::string full = Path(rel);
    Status st = [&]() -> Status {
      std::string dir = ParentOf(full);
      FLEETFS_RETURN_IF_ERROR(MakeDirs(dir));
      // rename needs a name, so never an O_TMPFILE here.
      FLEETFS_ASSIGN_OR_RETURN(StagedFile staged, Stage(dir, /*allow_tmpfile=*/false));
      FLEETFS_RETURN_IF_ERROR(fill(staged.fd()));
      if (::fsync(staged.fd()) != 0) return ErrnoStatus("syncing " + staged.temp_path(), errno);
      staged.Close();
      if (::rename(staged.temp_path().c_str(), full.c_str()) != 0) {
        return ErrnoStatus("renaming to " + full, errno);
      }
      staged.Published();
      return SyncDir(dir);
    }();
    if (!st.ok()) return st.WithContext("replica " + url_);
    return st;
  }

  // Write, sync, link into place (link, unlike rename, never replaces: a
  // taken name is EEXIST), sync the directory.
  template <typename Fill>
  Status CreateOnly(std::string_view rel, Fill fill) {
    FLEETFS_RETURN_IF_ERROR(ValidateObjectPath(rel));
    std::string full = Path(rel);
    Status st = [&]() -> Status {
      std::string dir = ParentOf(full);
      FLEETFS_RETURN_IF_ERROR(MakeDirs(dir));
      FLEETFS_ASSIGN_OR_RETURN(StagedFile staged, Stage(dir, /*allow_tmpfile=*/true));
      FLEETFS_RETURN_IF_ERROR(fill(staged.fd()));
      if (::fsync(staged.fd()) != 0) return ErrnoStatus("syncing the new " + full, errno);
      int rc;
      if (staged.temp_path().empty()) {
        std::string proc = "/proc/self/fd/" + std::to_string(staged.fd());
        rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, full.c_str(), AT_SYMLINK_FOLLOW);
      } else {
        rc = ::linkat(AT_FDCWD, staged.temp_path().c_str(), AT_FDCWD, full.c_str(), 0);
      }
      if (rc != 0) {
        if (errno == EEXIST) {
          return Status(Code::kAlreadyExists,
                        full +
                            " already exists: a create never replaces an object (read it to "
                            "learn who wrote it)");
        }
        return ErrnoStatus("linking " + full + " into place", errno);
      }
      return SyncDir(dir);
      // The staged file's temporary name (if any) goes with `staged`.
    }();
    if (!st.ok()) return st.WithContext("replica " + url_);
    return st;
  }

  // Removes the temporary files under `dir` last modified before `cutoff_ns`
  // (wall time), counting them in `removed`. Only temporary files are
  // stat'ed, so a walk over a large replica costs a readdir per directory.
  Status CleanDir(const std::string& dir, std::int64_t cutoff_ns, int& removed) {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return Status::Ok();  // removed meanwhile
      return ErrnoStatus("listing " + dir, errno);
    }
    while (dirent* e = ::readdir(d.get())) {
      std::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      std::string full = dir + "/" + std::string(n);
      bool temp = n.starts_with(kTempPrefix);
      unsigned char type = e->d_type;
      if (type == DT_REG && !temp) continue;
      struct stat st;
      if (type == DT_UNKNOWN || temp) {
        if (::lstat(full.c_str(), &st) != 0) {
          if (errno == ENOENT) continue;
          return ErrnoStatus("stat " + full, errno);
        }
        type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
      }
      if (type == DT_DIR) {
        FLEETFS_RETURN_IF_ERROR(CleanDir(full, cutoff_ns, removed));
        continue;
      }
      if (!temp || type != DT_REG) continue;
      std::int64_t mtime_ns = std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
      if (mtime_ns >= cutoff_ns) continue;  // perhaps a live writer's
      if (::unlink(full.c_str()) == 0) {
        ++removed;
      } else if (errno != ENOENT) {
        return ErrnoStatus("removing " + full, errno);
      }
    }
    return Status::Ok();
  }

  const std::string url_;
  const std::string root_;
  // Cleared for good when the file system refuses O_TMPFILE.
  std::atomic<bool> tmpfile_usable_{true};
  // Temporary names are nonce-counter: unique across the hosts sharing the
  // directory without any coordination.
  std::uint64_t nonce_ = 0;
  std::atomic<std::uint64_t> counter_{0};
};

}  // namespace

Status ValidateObjectPath(std::string_view path) {
  auto bad = [&](std::string_view rule) {
    return InvalidArgument("replica object path '" + std::string(path) + "': " + std::string(rule));
  };
  if (path.empty()) return bad("must not be empty");
  if (path.front() == '/') return bad("must be relative");
  std::size_t start = 0;
  while (true) {
    std::size_t slash = path.find('/', start);
    std::string_view part =
        path.substr(start, slash == std::string_view::npos ? slash : slash - start);
    if (part.empty()) return bad("must not have an empty part");
    if (part == "." || part == "..") return bad("must not have a '.' or '..' part");
    if (part.starts_with(kTempPrefix)) {
      return bad("must not have a part starting '" + std::string(kTempPrefix) +
                 "' (the destination's temporary files)");
    }
    if (part.find('\0') != std::string_view::npos) return bad("must not hold a NUL byte");
    if (slash == std::string_view::npos) return Status::Ok();
    start = slash + 1;
  }
}

Status ValidateDestinationUrl(std::string_view url) {
  if (url.starts_with(s3::kS3Scheme)) return s3::ParseS3Url(url).status();
  if (!url.starts_with(kFileScheme)) {
    return InvalidArgument("replica '" + std::string(url) +
                           "': a replica is file:///ABSOLUTE/DIR or s3://BUCKET[/PREFIX]");
  }
  std::string_view path = url.substr(kFileScheme.size());
  if (path.empty() || path.front() != '/') {
    return InvalidArgument(
        "replica '" + std::string(url) +
        "': a file:// URL needs an absolute path, as in file:///var/lib/fleetfs/replica");
  }
  return Status::Ok();
}

Result<std::shared_ptr<Destination>> OpenDestination(std::string_view url,
                                                     const DestinationOptions& options) {
  FLEETFS_RETURN_IF_ERROR(ValidateDestinationUrl(url));
  if (url.starts_with(s3::kS3Scheme)) {
    s3::S3DestinationOptions s3_options;
    if (options.retry_wait_cap.count() > 0) {
      // Only waits after no answer: a store that asks to slow down gets the
      // full backoff, however short the sync interval. A call that fails
      // leaves its object pending for the next round, so no more attempts.
      s3_options.retry.unanswered_cap = options.retry_wait_cap;
    }
    return s3::OpenS3Destination(url, options.s3, std::move(s3_options));
  }
  std::string path(url.substr(kFileScheme.size()));
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (Status st = MakeDirs(path); !st.ok()) return st.WithContext("replica " + std::string(url));
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("replica " + std::string(url) + ": " + path + " is not a directory");
  }
  return std::shared_ptr<Destination>(
      std::make_shared<FileDestination>(std::string(url), path, options));
}

}  // namespace fleetfs::replica
