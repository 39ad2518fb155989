#include "fleet/layout.h"

#include <cstdio>
#include <string>

namespace fleetfs {
namespace {

constexpr std::string_view kMainSuffix = ".db";
constexpr std::string_view kSlotPrefix = "slot-";
constexpr std::string_view kSuperJournalInfix = "-mj";

bool IsTenantIdByte(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_' || c == '.';
}

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
}

bool AllDigits(std::string_view text) {
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return !text.empty();
}

std::string SlotKey(Slot slot) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "slot-%05u", static_cast<unsigned>(slot));
  return buffer;
}

// Splits a file name into its main file name and role. SQLite names a
// super-journal "<main>-mj" + "%06X9%02X" (nine hex digits); eight are
// accepted too, as DESIGN section 1 writes it.
std::optional<std::pair<std::string_view, FileRole>> SplitRole(std::string_view name) {
  struct Suffix {
    std::string_view text;
    FileRole role;
  };
  static constexpr Suffix kSidecars[] = {
      {"-wal", FileRole::kWal}, {"-shm", FileRole::kShm}, {"-journal", FileRole::kJournal}};
  if (name.ends_with(kMainSuffix)) return std::pair{name, FileRole::kMain};
  for (const auto& sidecar : kSidecars) {
    if (name.ends_with(sidecar.text)) {
      std::string_view main = name.substr(0, name.size() - sidecar.text.size());
      if (!main.ends_with(kMainSuffix)) return std::nullopt;
      return std::pair{main, sidecar.role};
    }
  }
  const auto mj = name.rfind(kSuperJournalInfix);
  if (mj == std::string_view::npos) return std::nullopt;
  std::string_view digits = name.substr(mj + kSuperJournalInfix.size());
  if (digits.size() < 8 || digits.size() > 9) return std::nullopt;
  for (char c : digits) {
    if (!IsHexDigit(c)) return std::nullopt;
  }
  std::string_view main = name.substr(0, mj);
  if (!main.ends_with(kMainSuffix)) return std::nullopt;
  return std::pair{main, FileRole::kSuperJournal};
}

}  // namespace

std::string_view ModeName(FleetMode mode) {
  return mode == FleetMode::kTenant ? "tenant" : "slot";
}

Result<FleetMode> ParseMode(std::string_view text) {
  if (text == "tenant") return FleetMode::kTenant;
  if (text == "slot") return FleetMode::kSlot;
  return InvalidArgument("mode '" + std::string(text) + "': use 'tenant' or 'slot'");
}

std::optional<std::string> TenantIdProblem(std::string_view id) {
  if (id.empty()) return "empty";
  if (id.size() > kMaxTenantIdBytes) return "too long (" + std::to_string(id.size()) + " bytes)";
  if (id.front() == '.') return "starts with '.'";
  for (std::size_t i = 0; i < id.size(); ++i) {
    if (IsTenantIdByte(id[i])) continue;
    char shown[8];
    const auto byte = static_cast<unsigned char>(id[i]);
    if (byte >= 0x21 && byte < 0x7f) {
      std::snprintf(shown, sizeof shown, "'%c'", id[i]);
    } else {
      std::snprintf(shown, sizeof shown, "0x%02x", byte);
    }
    return "byte " + std::to_string(i) + " is " + shown;
  }
  return std::nullopt;
}

Status ValidateTenantId(std::string_view id) {
  const auto problem = TenantIdProblem(id);
  if (!problem) return Status::Ok();
  // Only a printable prefix of the id is echoed: the rest may break the line.
  std::string shown;
  for (char c : id.substr(0, 64)) {
    if (!IsTenantIdByte(c)) break;
    shown += c;
  }
  if (shown.size() < id.size()) shown += "...";
  return InvalidArgument("tenant id '" + shown + "': " + *problem + "; " +
                         std::string(kTenantIdRule));
}

std::string BucketName(int bucket) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "%03d", bucket);
  return buffer;
}

std::optional<int> ParseBucketName(std::string_view name) {
  if (name.size() != 3 || !AllDigits(name)) return std::nullopt;
  const int bucket = (name[0] - '0') * 100 + (name[1] - '0') * 10 + (name[2] - '0');
  if (bucket >= kBucketCount) return std::nullopt;
  return bucket;
}

std::string TenantPath(std::string_view tenant_id) {
  return BucketName(BucketOf(KeySlot(tenant_id))) + "/" + std::string(tenant_id) +
         std::string(kMainSuffix);
}

std::string SlotPath(Slot slot) {
  return BucketName(BucketOf(slot)) + "/" + SlotKey(slot) + std::string(kMainSuffix);
}

Result<std::string> MainPathForKey(FleetMode mode, std::string_view key) {
  if (mode == FleetMode::kSlot) return SlotPath(KeySlot(key));
  FLEETFS_RETURN_IF_ERROR(ValidateTenantId(key));
  return TenantPath(key);
}

std::string_view RoleName(FileRole role) {
  switch (role) {
    case FileRole::kMain: return "main";
    case FileRole::kWal: return "wal";
    case FileRole::kShm: return "shm";
    case FileRole::kJournal: return "journal";
    case FileRole::kSuperJournal: return "super-journal";
  }
  return "unknown";
}

std::optional<FleetFile> ParseFleetName(FleetMode mode, int bucket, std::string_view name) {
  const auto split = SplitRole(name);
  if (!split) return std::nullopt;
  const auto [main_name, role] = *split;
  const std::string_view stem = main_name.substr(0, main_name.size() - kMainSuffix.size());
  FleetFile file;
  file.role = role;
  if (mode == FleetMode::kTenant) {
    if (!ValidateTenantId(stem).ok()) return std::nullopt;
    file.slot = KeySlot(stem);
    file.key = std::string(stem);
  } else {
    if (!stem.starts_with(kSlotPrefix)) return std::nullopt;
    const std::string_view digits = stem.substr(kSlotPrefix.size());
    if (digits.size() != 5 || !AllDigits(digits)) return std::nullopt;
    const int slot = std::stoi(std::string(digits));
    if (slot >= kSlotCount) return std::nullopt;
    file.slot = static_cast<Slot>(slot);
    file.key = std::string(stem);
  }
  if (BucketOf(file.slot) != bucket) return std::nullopt;
  file.main_path = BucketName(bucket) + "/" + std::string(main_name);
  return file;
}

std::optional<FleetFile> ParseFleetPath(FleetMode mode, std::string_view relative_path) {
  const auto slash = relative_path.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const auto bucket = ParseBucketName(relative_path.substr(0, slash));
  if (!bucket) return std::nullopt;
  const std::string_view name = relative_path.substr(slash + 1);
  if (name.find('/') != std::string_view::npos) return std::nullopt;
  return ParseFleetName(mode, *bucket, name);
}

}  // namespace fleetfs
