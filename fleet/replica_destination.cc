#include "fleet/replica_destination.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "fleet/fd_io.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

constexpr std::string_view kFileScheme = "file://";

class FileDestination final : public Destination {
 public:
  FileDestination(std::string url, std::string root) : url_(std::move(url)), root_(std::move(root)) {}

  const std::string& url() const override { return url_; }

  Result<std::vector<std::string>> List(std::string_view dir) override {
    std::vector<std::string> names;
    std::string path = Path(dir);
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return names;
      return ErrnoStatus("listing " + path, errno);
    }
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n == "." || n == ".." || n.starts_with(kDestinationTempPrefix)) continue;
      names.emplace_back(n);
    }
    ::closedir(d);
    return names;
  }

  Status Put(std::string_view path, std::string_view bytes) override {
    return Atomically(path, [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
  }

  Status PutFile(std::string_view path, int src) override {
    return Atomically(path, [&](int fd) -> Status {
      std::vector<char> buf(1 << 20);
      off_t off = 0;
      while (true) {
        ssize_t n = ::pread(src, buf.data(), buf.size(), off);
        if (n < 0) {
          if (errno == EINTR) continue;
          return ErrnoStatus("reading the local copy", errno);
        }
        if (n == 0) return Status::Ok();
        FLEETFS_RETURN_IF_ERROR(WriteAll(fd, buf.data(), static_cast<std::size_t>(n)));
        off += n;
      }
    });
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
    ssize_t got = ::pread(fd.get(), out.data(), n, 0);
    if (got < 0) return ErrnoStatus("reading " + full, errno);
    out.resize(static_cast<std::size_t>(got));
    return out;
  }

  Result<std::uint64_t> Size(std::string_view path) override {
    struct stat st;
    std::string full = Path(path);
    if (::stat(full.c_str(), &st) != 0) return ErrnoStatus("stat " + full, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  Status Remove(std::string_view path) override {
    std::error_code ec;
    std::filesystem::remove_all(Path(path), ec);
    if (ec) return Status(Code::kIoError, "removing " + Path(path) + ": " + ec.message());
    return Status::Ok();
  }

  Status Probe() override {
    return Atomically(".probe", [](int) { return Status::Ok(); });
  }

 private:
  std::string Path(std::string_view rel) const {
    return rel.empty() ? root_ : root_ + "/" + std::string(rel);
  }

  // Write, sync, rename, sync the directory: a reader on any host sees the
  // whole object or none, and a crash leaves at most a temporary file.
  template <typename Fill>
  Status Atomically(std::string_view rel, Fill fill) {
    std::string full = Path(rel);
    std::filesystem::path target(full);
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    if (ec) return Status(Code::kIoError, "making " + target.parent_path().string() + ": " + ec.message());
    static std::atomic<std::uint64_t> counter{0};
    std::string tmp = target.parent_path().string() + "/" +
                      std::string(kDestinationTempPrefix) + std::to_string(::getpid()) + "-" +
                      std::to_string(counter.fetch_add(1)) + "-" + target.filename().string();
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus("creating " + tmp, errno);
    Status st = fill(fd.get());
    if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoStatus("syncing " + tmp, errno);
    fd.Reset();
    if (st.ok() && ::rename(tmp.c_str(), full.c_str()) != 0) st = ErrnoStatus("renaming to " + full, errno);
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st.WithContext("replica " + url_);
    }
    UniqueFd dir(::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.valid()) ::fsync(dir.get());
    return Status::Ok();
  }

  std::string url_;
  std::string root_;
};

}  // namespace

Status ValidateDestinationUrl(std::string_view url) {
  if (!url.starts_with(kFileScheme)) {
    return InvalidArgument("replica '" + std::string(url) +
                           "': only file:///ABSOLUTE/DIR is supported (S3 is not built yet)");
  }
  std::string_view path = url.substr(kFileScheme.size());
  if (path.empty() || path.front() != '/') {
    return InvalidArgument("replica '" + std::string(url) +
                           "': a file:// URL needs an absolute path, as in file:///var/lib/fleetfs/replica");
  }
  return Status::Ok();
}

Result<std::shared_ptr<Destination>> OpenDestination(std::string_view url) {
  FLEETFS_RETURN_IF_ERROR(ValidateDestinationUrl(url));
  std::string path(url.substr(kFileScheme.size()));
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status(Code::kIoError, "replica " + std::string(url) + ": " + ec.message());
  if (!std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("replica " + std::string(url) + ": " + path + " is not a directory");
  }
  return std::shared_ptr<Destination>(std::make_shared<FileDestination>(std::string(url), path));
}

}  // namespace fleetfs::replica
