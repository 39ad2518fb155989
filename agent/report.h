// What operators see of a running agent: the status document (served as
// MOUNT/.fleetfs/status.json and /status), the ranges file, the Prometheus
// metrics and the health answer. Pure functions of a snapshot.
//
// Thread-safety: pure; the snapshot is a value.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/handoff.h"
#include "agent/admin_server.h"
#include "lease/store_url.h"
#include "agent/backing_watch.h"
#include "fleet/replica/counting_destination.h"
#include "fleet/histogram.h"
#include "fleet/replicator.h"
#include "lease/host_ownership.h"
#include "lease/timed_store.h"
#include "vfs/vfs_stats.h"

namespace fleetfs::agent {

// Refresh outcomes counted since the agent started.
enum class Outcome { kClaimed, kRenewed, kLost, kWaiting, kFailed, kCount };
std::string_view OutcomeKindName(Outcome outcome);

struct RangeSnapshot {
  lease::RangeStatus status;
  std::size_t open_files = 0;
  double replication_lag_s = 0;  // since the oldest commit not yet shipped; 0 when none
  // status.holder's expiry as a wall time (OwnershipStore::ToWallMs), for
  // display only: the holder's expiry itself is in the store's frame.
  WallMs holder_until_wall_ms = 0;
};

struct VfsSnapshot {
  std::array<std::uint64_t, vfs::kOpCount> ops{};
  std::array<std::array<std::uint64_t, vfs::kErrKindCount>, vfs::kOpCount> errors{};
  std::uint64_t fenced = 0;
  std::uint64_t fences = 0;
  std::uint64_t handles_fenced = 0;
  std::size_t open_handles = 0;
  std::array<HistogramSnapshot, vfs::kOpCount> latency{};  // by op
};
VfsSnapshot SnapshotOf(const vfs::VfsStats& stats, std::size_t open_handles);

struct AgentSnapshot {
  std::string owner, store, mode, backing, mountpoint, admin, phase;
  // The files of an etcds:// store (paths, never contents): the handoff
  // CLI watches the store as the agent reaches it.
  lease::StoreTls store_tls;
  Millis ttl{0};
  int pid = 0;
  WallMs now_ms = 0;           // wall time of the snapshot, for display
  double monotonic_now_s = 0;  // CLOCK_BOOTTIME of the snapshot, to compare lease ends
  MonoTime mono_now{};
  std::vector<RangeSnapshot> ranges;
  std::array<std::uint64_t, static_cast<std::size_t>(Outcome::kCount)> outcomes{};
  std::uint64_t refreshes = 0;
  std::optional<VfsSnapshot> vfs;  // nullopt before the mount
  // FleetFs::TransportName() ("io_uring" or "/dev/fuse") and TransportWhy()
  // (why auto did not run io_uring; else empty); both empty before the mount.
  std::string transport, transport_why;
  std::string replica;             // destination URL; empty when replication is off
  // Where an s3:// replica's requests go (never credentials): for `fleetfs
  // inspect`, which reads the replica as the agent does.
  replica::S3Settings replica_s3;
  std::optional<replica::ReplicationStats> replication;
  replica::RequestCounts replica_requests;  // to the destination, since start; with replication
  // How long the destination's requests took, by kind (replica::Request).
  std::array<HistogramSnapshot, replica::kRequestKinds> replica_request_time{};
  // How long the ownership store's calls took, by kind (lease::StoreCallKind).
  std::array<HistogramSnapshot, lease::kStoreCallKinds> store_call_time{};
  BackingReport backing_volume;    // whether the backing volume takes writes
  std::string failure;             // why the agent stood down (phase "failed"); else empty
  std::vector<HandoffStatus> handoffs;  // planned handovers since the start (or the last undo)
};

// "serving", "waiting", "lost", "failed", "lapsed", "pending" or "stopped".
std::string RangeState(const lease::RangeStatus& status, std::string_view phase);

nlohmann::json StatusJson(const AgentSnapshot& snapshot);
// The document as text, never throwing: bytes that are not UTF-8 (a path
// from the file system, a message quoting one) become U+FFFD.
std::string DumpJson(const nlohmann::json& doc);
std::string RangesText(const AgentSnapshot& snapshot);
// MOUNT/.fleetfs/tenants-live.jsonl: one JSON object a line per tenant the
// agent holds live state for (open handles, or replication's TenantStates),
// sorted by path, only those `served` (when given) says are served now:
//   {"path":"BBB/name.db","open_handles":N,"shipped_seq":S|null,
//    "shipped_ms":MS|null,"pending_since_ms":MS|null,"unshippable":BOOL}
// Its length follows the active tenants, never the volume's files.
std::string TenantsLiveJsonl(const std::vector<std::pair<std::string, std::size_t>>& open_handles,
                             const std::vector<replica::TenantReplication>& replication,
                             const std::function<bool(std::string_view)>& served = {});
std::string MetricsText(const AgentSnapshot& snapshot);
// 200 while every configured range is served or waiting; 503 naming the
// backing volume when it failed (the agent stood down) or is full, else the
// first range whose store call failed, whose lease lapsed, or that was lost.
// A 200 says "ok", then a warning line when tenants are not replicated
// because of their journal mode (UnshippableText) or need a full snapshot
// after a drop (SnapshotNeededText, also added to a 503's replication reason).
HttpResponse Health(const AgentSnapshot& snapshot);
// Why tenants are not replicated, naming one: for /health and the status.
std::string UnshippableText(const replica::ReplicationStats& stats);
// Tenants that need a full snapshot because their captured commits were
// dropped (the agent's capture memory and spill were full), naming the
// largest and its size; empty when none.
std::string SnapshotNeededText(const replica::ReplicationStats& stats);

}  // namespace fleetfs::agent
