// The fleet layout: where a key's database lives under the fleet root, and
// the reverse, which key and file role a relative path names.
//
//   tenant mode  BBB/<tenant>.db       one file per tenant id
//   slot mode    BBB/slot-SSSSS.db     one file per routing slot
//
// BBB is the bucket (slot / 64, three digits). A main file's sidecars are
// "-wal", "-shm", "-journal" and SQLite's super-journals "-mj" followed by
// hex digits; a sidecar belongs to its main file's slot. Names that match no
// template are not fleet files.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "fleet/slot.h"
#include "fleet/status.h"

namespace fleetfs {

enum class FleetMode { kTenant, kSlot };

std::string_view ModeName(FleetMode mode);
Result<FleetMode> ParseMode(std::string_view text);

inline constexpr std::size_t kMaxTenantIdBytes = 128;

// What is wrong with a tenant id ("byte 3 is 0x20"), or nullopt when it is valid.
std::optional<std::string> TenantIdProblem(std::string_view id);

// The rule, for messages.
inline constexpr std::string_view kTenantIdRule =
    "a tenant id is 1 to 128 bytes of A-Z a-z 0-9 - _ . and does not start with '.'";

// OK when `id` is 1-128 bytes of A-Z a-z 0-9 - _ . and does not start with
// '.'; else an InvalidArgument that names the id and the rule.
Status ValidateTenantId(std::string_view id);

// "017" for bucket 17.
std::string BucketName(int bucket);

// The bucket a directory name stands for: exactly three digits, 000-255.
std::optional<int> ParseBucketName(std::string_view name);

// Relative paths of main files. TenantPath requires a valid tenant id.
std::string TenantPath(std::string_view tenant_id);
std::string SlotPath(Slot slot);

// The main file of a routing key in `mode`: in slot mode any key maps to its
// slot's file; in tenant mode the key must be a valid tenant id.
Result<std::string> MainPathForKey(FleetMode mode, std::string_view key);

enum class FileRole { kMain, kWal, kShm, kJournal, kSuperJournal };

std::string_view RoleName(FileRole role);

// What a relative path names in the fleet.
struct FleetFile {
  Slot slot = 0;
  FileRole role = FileRole::kMain;
  std::string key;        // tenant id (tenant mode) or "slot-SSSSS" (slot mode)
  std::string main_path;  // the main file's relative path, "BBB/<name>.db"

  bool operator==(const FleetFile&) const = default;
};

// Parses "BBB/<name>" into the file it names, or nullopt when it is not a
// fleet file: another shape, a bad tenant id, a bucket that is not the key's,
// an unknown suffix.
std::optional<FleetFile> ParseFleetPath(FleetMode mode, std::string_view relative_path);

// Parses one file name inside bucket directory `bucket`; as ParseFleetPath.
std::optional<FleetFile> ParseFleetName(FleetMode mode, int bucket, std::string_view name);

}  // namespace fleetfs
