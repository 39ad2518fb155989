// AgentConfig: what `fleetfs mount` runs with, from a TOML file and flags
// (flags win), checked as a whole before anything is touched.
//
// Thread-safety: values and pure functions (ResolveConfig reads the file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "fleet/layout.h"
#include "fleet/status.h"
#include "lease/owner_id.h"
#include "lease/slot_range.h"
#include "lease/store_url.h"

namespace fleetfs::agent {

struct Endpoint {
  std::string host;  // a loopback IPv4 address
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

struct AgentConfig {
  std::string backing;
  std::string mountpoint;
  FleetMode mode = FleetMode::kTenant;
  lease::OwnerId owner = lease::OwnerId::Make("unset").value();  // always set by ResolveConfig
  std::vector<lease::SlotRange> ranges;
  std::string store;
  lease::StoreTls store_tls;  // etcds:// only
  Millis ttl{30000};
  std::optional<Endpoint> admin;  // nullopt: no admin server
  bool allow_create = true;
  Millis shutdown_grace{5000};  // how long open handles may finish at SIGTERM
  int fuse_threads = 10;
  std::string replica;  // "" (off) or a destination URL (file:///DIR)
  Millis sync_interval{1000};
  Millis snapshot_interval{3600 * 1000};
  Millis retention{72 * 3600 * 1000};
  // Captured commits the destination has not taken: held in memory for all
  // tenants together up to capture_memory, then spilled to the backing
  // volume up to capture_spill (and what it can spare).
  std::uint64_t capture_memory = 256ull << 20;
  std::uint64_t capture_spill = 4ull << 30;
};

// The raw values, each as given; unset means "from the file, else the default".
struct ConfigInput {
  std::optional<std::string> config_file;
  std::optional<std::string> backing, mountpoint, mode, owner, ranges, store, store_ca,
      store_cert, store_key, ttl, admin,
      shutdown_grace, replica, sync_interval, snapshot_interval, retention, capture_memory,
      capture_spill;
  std::optional<bool> no_create;
};

inline constexpr const char* kDefaultBacking = "/var/lib/fleetfs/volume";
inline constexpr const char* kDefaultMount = "/mnt/fleet";
inline constexpr const char* kDefaultStore = "sqlite:///var/lib/fleetfs/control.db";
inline constexpr const char* kDefaultAdmin = "127.0.0.1:7878";

// Reads the file (when given), merges the flags over it, fills defaults, and
// checks every value: InvalidArgument naming the key and the rule for the
// first bad one, an unknown key in the file, or a value of the wrong type.
// The owner defaults to the host name.
Result<AgentConfig> ResolveConfig(const ConfigInput& input);

// "256MiB": a whole number and its unit (B, KiB, MiB, GiB or TiB). A bare
// number is refused: a size without its unit is a guess.
Result<std::uint64_t> ParseByteSize(std::string_view key, std::string_view text);

// "127.0.0.1:7878", loopback only; "off" is handled by the caller.
Result<Endpoint> ParseAdminEndpoint(std::string_view text);

}  // namespace fleetfs::agent
