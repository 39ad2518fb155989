// `fleetfs ls` and `fleetfs inspect`: the tenants a running agent serves,
// one line each, and one tenant in depth.
//
// How `ls` stays streamed with a million tenants: the command reads the
// agent's status (MOUNT/.fleetfs/status.json: backing directory, layout,
// served ranges) and its live per-tenant state
// (MOUNT/.fleetfs/tenants-live.jsonl: open handles and replication, kept by
// the agent for the active tenants only), then walks the backing directory's
// buckets of the served ranges itself, one bucket in memory at a time,
// printing each tenant as it goes. The agent does no work per file and holds
// nothing per listing; the command's memory follows the active tenants and
// the largest bucket, never the volume. It needs to read the backing
// directory, so it runs as root (or the agent's user), as the agent does.
//
// Files are untrusted (a local user makes them through the mount): names
// that are no fleet file of their bucket, symlinks, devices, FIFOs and
// unreadable files are left out; a header that is no SQLite header shows as
// "not-sqlite". Nothing is written, and files are opened with O_NOATIME
// where allowed.
//
// Thread-safety: each call runs alone.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "fleet/clock.h"
#include "fleet/slot.h"
#include "fleet/status.h"

namespace fleetfs::agent {

// One tenant as `fleetfs ls` shows it.
struct TenantLine {
  std::string key;   // tenant id (slot mode: "slot-SSSSS")
  std::string path;  // relative to the fleet root, "BBB/<key>.db"
  Slot slot = 0;
  std::uint64_t size = 0;      // main file bytes
  std::uint64_t wal_size = 0;  // -wal bytes, 0 when none
  std::string journal_mode;    // db::JournalMode
  std::optional<std::uint64_t> epoch_stamp;
  std::uint64_t served_epoch = 0;  // the epoch its range is served at now
  std::optional<std::uint64_t> shipped_seq;
  std::optional<WallMs> shipped_ms;
  std::optional<double> lag_s;  // nullopt: replication is off
  std::size_t open_handles = 0;
  // The agent's live state could not be read: lag and open handles are
  // unknown ('?' in text, null in JSON), never guessed as 0.
  bool live_unknown = false;
  bool unshippable = false;  // journal_mode OFF or MEMORY: nothing ships
};

// The agent's live state of one tenant: a line of tenants-live.jsonl.
struct TenantLive {
  std::size_t open_handles = 0;
  std::optional<std::uint64_t> shipped_seq;
  std::optional<WallMs> shipped_ms;
  std::optional<WallMs> pending_since_ms;
  bool unshippable = false;
};
// The path and state of one line; nullopt for a line that is not such an object.
std::optional<std::pair<std::string, TenantLive>> ParseTenantLive(std::string_view line);

// The JSON object of one `ls --json` line.
nlohmann::json TenantLineJson(const TenantLine& t);
// The text form: a header, then rows in the same fixed columns (a key longer
// than its column pushes the rest of its row right). `now_ms` for the lag.
std::string TenantTextHeader();
std::string TenantTextRow(const TenantLine& t);
// "12.3K", "4.0M": sizes for people.
std::string HumanBytes(std::uint64_t bytes);

int RunLs(const std::string& mount, bool json, std::ostream& out, std::ostream& err);

struct InspectArgs {
  std::string tenant;
  std::string mount;
  bool json = false;
  std::size_t tail = 5;  // replica log objects shown
  // s3:// replicas: as `fleetfs replica ls`; "" when not given.
  std::string endpoint, region, path_style;
};

int RunInspect(const InspectArgs& args, std::ostream& out, std::ostream& err);

}  // namespace fleetfs::agent
