// The on-disk facts of a tenant's files that more than one part relies on,
// each in one place: the epoch stamp and identity kept as extended attributes
// of the main file (outside the tenant's schema), the sidecar names that go
// with a main file, and how a bucket directory is made.
//
// Thread-safety: pure functions over descriptors; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fleet/status.h"
#include "fleet/unique_fd.h"

namespace fleetfs {

// The newest epoch a main file was opened under, and the key it belongs to.
inline constexpr std::string_view kEpochStampXattr = "user.fleetfs.epoch";
inline constexpr std::string_view kKeyStampXattr = "user.fleetfs.key";

// The object of the key's replica log whose state the file was in when its
// last commits shipped: its sequence and chain checksum. Written after a
// shipment; true of the file only while nothing unshipped was written since
// (the unshipped marker, kUnshippedMarkerDir, says so). A restart whose file
// carries the log's newest data object continues the log with segments
// instead of a snapshot. (Not reachable through the mount: it answers no
// extended attribute calls.)
inline constexpr std::string_view kShippedStampXattr = "user.fleetfs.shipped";
// The files' identity when the stamp was written: any write since (through
// the mount or around it, a lost unshipped marker) changes it, and the stamp
// is then not believed.
struct FileIdentity {
  std::uint64_t ino = 0;
  std::uint64_t size = 0;
  std::uint64_t mtime_ns = 0;
  std::uint64_t wal_size = 0;      // 0 and 0: no -wal file
  std::uint64_t wal_mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};
// The identity of main file `main_path` under directory `root` and its -wal.
std::optional<FileIdentity> ReadFileIdentity(int root, const std::string& main_path);
struct ShippedStamp {
  std::uint64_t seq = 0;
  std::uint64_t checksum = 0;
  FileIdentity files;
  bool operator==(const ShippedStamp&) const = default;
};
std::optional<ShippedStamp> ReadShippedStamp(int fd);
Status WriteShippedStamp(int fd, const ShippedStamp& stamp, std::string_view what);

// The sidecars that belong to a main file and go when it goes (super-journals
// are named by SQLite with a random suffix and removed by SQLite itself).
inline constexpr std::array<std::string_view, 3> kSidecarSuffixes = {"-wal", "-shm", "-journal"};

// The epoch stamp of the file open as `fd` (any descriptor, O_PATH included),
// or nullopt when it has none or the attribute is not a decimal number.
std::optional<std::uint64_t> ReadEpochStamp(int fd);
// The key stamp, or nullopt when it has none.
std::optional<std::string> ReadKeyStamp(int fd);
// Writes both stamps; an errno-derived Status names `what` on failure.
Status WriteStamps(int fd, std::uint64_t epoch, std::string_view key, std::string_view what);

// Opens bucket directory `bucket` under the backing root `root_fd`, making it
// first when it is not there. A new bucket gets the root's owner, group and
// mode exactly (the process umask does not apply), so whoever may create in
// the root may create -wal and -journal files in every bucket. A bucket name
// that is not a directory (a symlink, a file) is refused with ENOTDIR.
// Returns the descriptor (O_RDONLY|O_DIRECTORY) or an errno Status.
Result<UniqueFd> OpenOrMakeBucket(int root_fd, int bucket);

}  // namespace fleetfs
