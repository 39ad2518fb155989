#include "fleet/clock.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

namespace fleetfs {
namespace {

constexpr const char* kOffsetVariable = "FLEETFS_TEST_WALL_OFFSET_FILE";
constexpr const char* kBootIdPath = "/proc/sys/kernel/random/boot_id";

WallMs RealWallMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The integer in `text` (white space around it allowed), or nullopt.
std::optional<std::int64_t> ParseOffset(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::nullopt;
  const auto last = text.find_last_not_of(" \t\r\n");
  const char* begin = text.data() + first;
  const char* end = text.data() + last + 1;
  if (*begin == '+') ++begin;  // from_chars takes '-' only
  std::int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// What identifies one version of the file. A rename gives a new inode, and
// an in-place write changes the size or a time stamp; comparing all of them
// costs one stat(2) per reading of the clock, only in tests.
struct FileVersion {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  timespec mtime{}, ctime{};

  bool operator==(const FileVersion& o) const {
    return exists == o.exists && dev == o.dev && ino == o.ino && size == o.size &&
           mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec &&
           ctime.tv_sec == o.ctime.tv_sec && ctime.tv_nsec == o.ctime.tv_nsec;
  }
};

FileVersion VersionOf(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return FileVersion{};
  return FileVersion{true, st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
}

// The offset read from the file; for a missing file 0. Error text when it is malformed.
Result<std::int64_t> ReadOffset(const char* path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::int64_t{0};
    return InvalidArgument(std::string(kOffsetVariable) + " names " + path + ": " +
                           std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto offset = ParseOffset(text.str());
  if (!offset) {
    return InvalidArgument(std::string(kOffsetVariable) + " names " + path +
                           ", which must hold one signed integer of milliseconds (test only)");
  }
  return *offset;
}

// Process-wide, so every SystemWallClock agrees. Re-read whenever the file's
// version changes: checked at every reading, so a test that has renamed a new
// offset into place knows every later reading uses it.
class TestWallOffset {
 public:
  static TestWallOffset& Instance() {
    static TestWallOffset instance;
    return instance;
  }

  bool enabled() const { return path_ != nullptr; }

  std::int64_t Ms() {
    std::lock_guard lock(mu_);
    const FileVersion version = VersionOf(path_);
    if (read_ && version == version_) return offset_ms_;
    read_ = true;
    version_ = version;
    auto offset = version.exists ? ReadOffset(path_) : Result<std::int64_t>(std::int64_t{0});
    if (offset.ok()) {
      offset_ms_ = *offset;
    } else {
      spdlog::warn("{}; keeping the wall-clock offset at {} ms", offset.status().message(),
                   offset_ms_);
    }
    return offset_ms_;
  }

  Status Check() const {
    if (!enabled()) return Status::Ok();
    auto offset = ReadOffset(path_);
    return offset.ok() ? Status::Ok() : offset.status();
  }

 private:
  TestWallOffset() : path_(std::getenv(kOffsetVariable)) {
    if (path_ != nullptr && *path_ == '\0') path_ = nullptr;
  }

  const char* path_;  // null: no offset
  std::mutex mu_;     // guards the three below
  bool read_ = false;
  FileVersion version_;
  std::int64_t offset_ms_ = 0;
};

}  // namespace

WallMs SystemWallClock::NowMs() const {
  TestWallOffset& offset = TestWallOffset::Instance();
  if (!offset.enabled()) return RealWallMs();
  return RealWallMs() + offset.Ms();
}

Status CheckTestWallOffset() { return TestWallOffset::Instance().Check(); }

Result<std::unique_ptr<SystemBootClock>> SystemBootClock::Make() {
  std::ifstream in(kBootIdPath);
  std::string id;
  if (!in || !std::getline(in, id) || id.empty()) {
    return Status(Code::kUnavailable,
                  std::string("the boot id (") + kBootIdPath +
                      ") cannot be read; the SQLite store measures leases on this boot's "
                      "clock and needs it (is /proc mounted?)");
  }
  std::int64_t offset_ms = 0;
  std::ifstream offsets(kTimeNamespaceOffsetsPath);
  if (offsets) {  // absent before Linux 5.6: no time namespaces, no offset
    std::stringstream text;
    text << offsets.rdbuf();
    FLEETFS_ASSIGN_OR_RETURN(offset_ms, ParseBootTimeOffsetMs(text.str()));
  }
  return std::unique_ptr<SystemBootClock>(new SystemBootClock(std::move(id), offset_ms));
}

Result<std::int64_t> ParseBootTimeOffsetMs(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string clock;
    long long seconds = 0;
    long long nanos = 0;
    if (!(fields >> clock)) continue;
    if (clock != "boottime") continue;
    // The kernel bounds an offset to what fits a timespec64 and a
    // nanosecond part below 1e9; anything else is not its file.
    if (!(fields >> seconds >> nanos) || nanos < 0 || nanos >= 1'000'000'000 ||
        seconds > INT64_MAX / 2000 || seconds < -INT64_MAX / 2000) {
      return Status(Code::kDataLoss, std::string(kTimeNamespaceOffsetsPath) +
                                         ": the boottime line '" + line +
                                         "' is not 'boottime SECONDS NANOSECONDS'");
    }
    return static_cast<std::int64_t>(seconds) * 1000 + nanos / 1'000'000;
  }
  return std::int64_t{0};
}

MonoTime SystemMonotonicClock::Now() const {
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return MonoTime(std::chrono::duration_cast<MonoTime::duration>(
      std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
}

BootMs SystemBootClock::NowMs() const {
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return static_cast<BootMs>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000 - offset_ms_;
}

}  // namespace fleetfs
