// The `fleetfs replica ls|verify` and `fleetfs restore` commands: read a
// tenant's replica log (DESIGN 5) at a destination, without an agent and
// without an ownership store. They only read: nothing at the destination is
// made, written or removed.
//
// Thread-safety: each call runs alone.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "fleet/replica/destination.h"
#include "fleet/status.h"

namespace fleetfs::agent {

struct ReplicaArgs {
  std::string tenant;
  std::string replica;
  // s3:// only, "" when not given: as the agent's replica_endpoint,
  // replica_region and replica_path_style ("true" or "false").
  std::string endpoint, region, path_style;
  std::string mode = "tenant";
  std::string at;      // restore: a time, "" for the newest
  std::string output;  // restore: the file to write
  bool json = false;
};

// One object of a replica log, as `fleetfs inspect` shows it.
struct ReplicaObjectInfo {
  std::uint64_t seq = 0;
  std::string kind;  // snapshot, segment, tombstone, marker
  std::uint64_t epoch = 0;
  WallMs first_ms = 0, last_ms = 0;
  std::uint64_t bytes = 0;
  // Its epoch is above the highest the store ever granted: forged or
  // corrupt, refused by a restore, and never shown as the newest epoch.
  bool refused = false;
};

// The end of a tenant's replica log and its restore points.
struct ReplicaTail {
  std::string log_dir;  // the key's log directory at the destination
  std::size_t objects = 0;
  std::vector<ReplicaObjectInfo> tail;  // the last objects, oldest first
  std::optional<std::uint64_t> newest_epoch;
  // The oldest snapshot's time and the newest commit's; none without a snapshot.
  std::optional<WallMs> restorable_from_ms, restorable_to_ms;
  bool deleted = false;  // the newest object other than markers is a tombstone
};

// "2026-11-29T16:30:00.123" in local time: the form `fleetfs restore --at`
// takes back ("@<ms>" for a time no calendar shows).
std::string RestoreTimeText(WallMs ms);

// Objects from the start of a log searched for its oldest snapshot.
inline constexpr std::size_t kTailSnapshotSearch = 8;

// One listing, then the headers of the last `last_n` objects and of at most
// kTailSnapshotSearch from the log's start (for the oldest snapshot):
// never the whole log's headers. Objects above `max_epoch` (the store's
// counter) are marked refused, as a restore would refuse them.
Result<ReplicaTail> ReadLogTail(replica::Destination& dest, const std::string& dir,
                                std::size_t last_n, std::uint64_t max_epoch);
Result<ReplicaTail> ReadReplicaTail(const ReplicaArgs& args, std::size_t last_n,
                                    std::uint64_t max_epoch);

int RunReplicaLs(const ReplicaArgs& args, std::ostream& out, std::ostream& err);
int RunRestore(const ReplicaArgs& args, std::ostream& out, std::ostream& err);
int RunReplicaVerify(const ReplicaArgs& args, std::ostream& out, std::ostream& err);

}  // namespace fleetfs::agent
