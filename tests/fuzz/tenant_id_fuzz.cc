// Tenant ids: the names a local user gives files through the mount, and the
// keys of `fleetfs slot`, `fleetfs restore` (TenantIdProblem,
// ValidateTenantId, TenantPath, MainPathForKey).
//
// Properties: TenantIdProblem and ValidateTenantId agree; a refusal is
// printable ASCII (it goes to logs and JSON) and names the rule; a valid id's
// TenantPath and each sidecar's path parse back to the same key and slot; in
// slot mode any key maps to its slot's file, which parses back.
#include <cstdint>
#include <string>

#include "fleet/layout.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool PrintableAscii(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fleetfs;  // NOLINT: a fuzz entry point outside the namespace
  std::string_view id = fuzz::AsText(data, size);

  const auto problem = TenantIdProblem(id);
  const Status valid = ValidateTenantId(id);
  FUZZ_CHECK(valid.ok() == !problem.has_value(), "TenantIdProblem and ValidateTenantId disagree");
  auto main_path = MainPathForKey(FleetMode::kTenant, id);
  FUZZ_CHECK(main_path.ok() == valid.ok(), "MainPathForKey and ValidateTenantId disagree");

  if (!valid.ok()) {
    FUZZ_CHECK(PrintableAscii(valid.message()), "a refusal that is not printable ASCII");
    FUZZ_CHECK(PrintableAscii(*problem), "a problem that is not printable ASCII");
    FUZZ_CHECK(valid.message().find(kTenantIdRule) != std::string::npos,
               "a refusal that does not give the rule");
  } else {
    const std::string path = TenantPath(id);
    FUZZ_CHECK(*main_path == path, "MainPathForKey and TenantPath disagree");
    const Slot slot = KeySlot(id);
    const char* suffixes[] = {"", "-wal", "-shm", "-journal", "-mj0123ABCD"};
    const FileRole roles[] = {FileRole::kMain, FileRole::kWal, FileRole::kShm, FileRole::kJournal,
                              FileRole::kSuperJournal};
    for (std::size_t i = 0; i < std::size(suffixes); ++i) {
      auto file = ParseFleetPath(FleetMode::kTenant, path + suffixes[i]);
      FUZZ_CHECK(file.has_value(), "a valid tenant's path does not parse");
      FUZZ_CHECK(file->key == id, "a tenant path parses to another key");
      FUZZ_CHECK(file->slot == slot, "a tenant path parses to another slot");
      FUZZ_CHECK(file->role == roles[i], "a tenant path parses to another role");
      FUZZ_CHECK(file->main_path == path, "a tenant path parses to another main file");
    }
    FUZZ_CHECK(!ParseFleetPath(FleetMode::kSlot, path).has_value() || id.starts_with("slot-"),
               "a tenant file is a slot file");
  }

  // Slot mode: any key names its slot's file.
  auto slot_path = MainPathForKey(FleetMode::kSlot, id);
  FUZZ_CHECK(slot_path.ok(), "slot mode refused a key");
  auto slot_file = ParseFleetPath(FleetMode::kSlot, *slot_path);
  FUZZ_CHECK(slot_file.has_value() && slot_file->slot == KeySlot(id) &&
                 slot_file->role == FileRole::kMain && slot_file->main_path == *slot_path,
             "a slot file does not parse back to its key's slot");
  return 0;
}
