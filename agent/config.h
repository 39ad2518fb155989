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
#include "fleet/replica/destination.h"
#include "fleet/status.h"
#include "lease/owner_id.h"
#include "lease/slot_range.h"
#include "lease/store_url.h"
#include "vfs/fleet_fs.h"

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
  // How FUSE requests reach the agent; the `transport` key (ParseTransport).
  vfs::Transport transport = vfs::Transport::kAuto;
  std::string replica;  // "" (off) or a destination URL (file:///DIR, s3://BUCKET/PREFIX)
  // Where an s3:// replica's requests go (replica_endpoint, replica_region,
  // replica_path_style); all unset for any other replica.
  replica::S3Settings replica_s3;
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
      capture_spill, replica_endpoint, replica_region, transport;
  // "true" or "false" as a flag gives it; the file's is a TOML boolean.
  std::optional<std::string> replica_path_style;
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

// replica_endpoint: http:// or https://, a host (a name, an IPv4 address or
// a bracketed IPv6 one), an optional port, and nothing after but one '/': the
// bucket and prefix belong to the replica URL, credentials never sit in a URL.
// Returns it without the trailing '/'. "" is unset (AWS's endpoint).
Result<std::string> ParseReplicaEndpoint(std::string_view text);

// replica_region: 1 to 32 lowercase letters, digits and hyphens (eu-west-1).
// "" is unset. Whether the store knows the region is its to say, at the
// first request: configuration never touches the network.
Status CheckReplicaRegion(std::string_view text);

// replica_path_style: "true" or "false"; "" is unset (the default).
Result<std::optional<bool>> ParseReplicaPathStyle(std::string_view text);

// The S3 settings mean nothing to any other replica: set for a file://
// replica or with replication off, they are refused, naming the first key
// set, so that a typo in `replica` does not pass as a working S3 set-up.
Status CheckS3SettingsApply(std::string_view replica, const replica::S3Settings& s3);

// transport: "auto" (io_uring when the kernel allows it, else /dev/fuse),
// "io_uring" (no mount without it) or "dev_fuse".
Result<vfs::Transport> ParseTransport(std::string_view text);
// The value ParseTransport takes for `transport`: "auto", "io_uring" or "dev_fuse".
std::string_view TransportValue(vfs::Transport transport);

// "127.0.0.1:7878", loopback only; "off" is handled by the caller.
Result<Endpoint> ParseAdminEndpoint(std::string_view text);

}  // namespace fleetfs::agent
