// The `fleetfs replica ls|verify` and `fleetfs restore` commands: read a
// tenant's replica log (DESIGN 5) at a destination, without an agent and
// without an ownership store. They only read: nothing at the destination is
// made, written or removed.
//
// Thread-safety: each call runs alone.
#pragma once

#include <optional>
#include <ostream>
#include <string>

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

int RunReplicaLs(const ReplicaArgs& args, std::ostream& out, std::ostream& err);
int RunRestore(const ReplicaArgs& args, std::ostream& out, std::ostream& err);
int RunReplicaVerify(const ReplicaArgs& args, std::ostream& out, std::ostream& err);

}  // namespace fleetfs::agent
