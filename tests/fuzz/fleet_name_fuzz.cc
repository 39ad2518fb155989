// The layout's name parser: what a path under the mount or the backing
// directory names (ParseFleetPath, ParseFleetName, ParseBucketName), in both
// modes. Any local user picks these names.
//
// Properties: a bucket name parses back from BucketName; ParseFleetPath
// agrees with ParseFleetName on its bucket; a parsed file lies in its
// bucket, its main path is the key's (TenantPath or SlotPath), the path is
// its main path plus the role's suffix, and its main path parses to the main
// file of the same key.
#include <cstdint>
#include <string>

#include "fleet/layout.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace fleetfs;  // NOLINT: the fuzz target's own file

void CheckFile(FleetMode mode, std::string_view path, const FleetFile& file) {
  FUZZ_CHECK(file.slot < kSlotCount, "a slot out of range");
  const std::string bucket = BucketName(BucketOf(file.slot));
  FUZZ_CHECK(path.starts_with(bucket + "/"), "a file outside its slot's bucket");
  if (mode == FleetMode::kTenant) {
    FUZZ_CHECK(ValidateTenantId(file.key).ok(), "a tenant file with an invalid tenant id");
    FUZZ_CHECK(KeySlot(file.key) == file.slot, "a tenant file in another slot than its key's");
    FUZZ_CHECK(file.main_path == TenantPath(file.key), "a main path that is not TenantPath");
  } else {
    FUZZ_CHECK(file.main_path == SlotPath(file.slot), "a main path that is not SlotPath");
  }
  FUZZ_CHECK(path.starts_with(file.main_path), "a path that does not start with its main path");
  const std::string_view suffix = path.substr(file.main_path.size());
  switch (file.role) {
    case FileRole::kMain:
      FUZZ_CHECK(suffix.empty(), "a main file with a suffix");
      break;
    case FileRole::kWal:
      FUZZ_CHECK(suffix == "-wal", "a WAL's suffix");
      break;
    case FileRole::kShm:
      FUZZ_CHECK(suffix == "-shm", "a shared-memory file's suffix");
      break;
    case FileRole::kJournal:
      FUZZ_CHECK(suffix == "-journal", "a journal's suffix");
      break;
    case FileRole::kSuperJournal:
      FUZZ_CHECK(suffix.starts_with("-mj") && (suffix.size() == 11 || suffix.size() == 12),
                 "a super-journal's suffix");
      break;
  }
  auto main = ParseFleetPath(mode, file.main_path);
  FUZZ_CHECK(main && main->role == FileRole::kMain && main->key == file.key &&
                 main->slot == file.slot && main->main_path == file.main_path,
             "a main path that does not parse back to the same key");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view path = fuzz::AsText(data, size);

  if (auto bucket = ParseBucketName(path)) {
    FUZZ_CHECK(*bucket >= 0 && *bucket < kBucketCount, "a bucket out of range");
    FUZZ_CHECK(BucketName(*bucket) == path, "a bucket name that does not parse back");
  }

  for (FleetMode mode : {FleetMode::kTenant, FleetMode::kSlot}) {
    auto file = ParseFleetPath(mode, path);
    const std::size_t slash = path.find('/');
    if (slash != std::string_view::npos) {
      auto bucket = ParseBucketName(path.substr(0, slash));
      if (bucket) {
        auto by_name = ParseFleetName(mode, *bucket, path.substr(slash + 1));
        FUZZ_CHECK(by_name == file || path.substr(slash + 1).find('/') != std::string_view::npos,
                   "ParseFleetPath and ParseFleetName disagree");
      } else {
        FUZZ_CHECK(!file, "a file in a directory that is no bucket");
      }
    } else {
      FUZZ_CHECK(!file, "a file outside every bucket");
    }
    if (file) CheckFile(mode, path, *file);

    // The whole input as one name in the bucket its first byte picks.
    const int bucket = size > 0 ? data[0] : 0;
    if (auto named = ParseFleetName(mode, bucket, path)) {
      const std::string full = BucketName(bucket) + "/" + std::string(path);
      FUZZ_CHECK(ParseFleetPath(mode, full) == named, "ParseFleetName and ParseFleetPath disagree");
      CheckFile(mode, full, *named);
    }
  }
  return 0;
}
