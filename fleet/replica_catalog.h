// The replica catalogue: how a key's generations and objects are named at the
// destination, which generation a restore takes, and the restore itself.
//
//   <bucket>/<file>/e<epoch:020>-g<index:08>/<seq:010>.<snap|seg|tomb>
//
// A generation is written under one epoch by one agent run; its objects are
// numbered without gaps from 0, which is always a snapshot (or a tombstone);
// retention may remove a prefix of them up to a later snapshot.
// Generations order by (epoch, index), so the newest epoch of a key is one
// listing away. A restore takes the newest generation (at time T: the newest
// whose first object is not after T), never an older epoch's generation that
// happens to be newer in time, since a fenced host may still ship late. It
// rebuilds the database into a file the caller owns, checking every object's
// checksum and the numbering; a failure names the object.
//
// Thread-safety: functions over a Destination, which is thread-safe.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fleet/layout.h"
#include "fleet/replica_destination.h"
#include "fleet/replica_object.h"

namespace fleetfs::replica {

struct GenerationId {
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;
  std::string Name() const;
  static std::optional<GenerationId> Parse(std::string_view name);
  auto operator<=>(const GenerationId&) const = default;
};

struct ObjectId {
  std::uint64_t seq = 0;
  ObjectKind kind = ObjectKind::kSegment;
  std::string Name() const;
  static std::optional<ObjectId> Parse(std::string_view name);
};

// "BBB/<file>": a key's directory at the destination (its main path).
std::string KeyDir(const FleetFile& main);
std::string GenerationDir(std::string_view key_dir, const GenerationId& gen);
std::string ObjectPath(std::string_view key_dir, const GenerationId& gen, const ObjectId& obj);

// The key's generations, oldest first.
Result<std::vector<GenerationId>> ListGenerations(Destination& dest, std::string_view key_dir);
// The newest epoch of any generation of the key, or nullopt when none.
Result<std::optional<std::uint64_t>> NewestEpoch(Destination& dest, std::string_view key_dir);

struct ObjectInfo {
  ObjectId id;
  ObjectSummary summary;
  std::uint64_t bytes = 0;
};

struct GenerationInfo {
  GenerationId id;
  std::vector<ObjectInfo> objects;  // by sequence number
  bool tombstone = false;
  std::uint64_t commits = 0;
  WallMs first_ms = 0;  // first object's time
  WallMs last_ms = 0;   // last commit (or snapshot, or deletion) time
  std::uint64_t bytes = 0;
};
// Reads the headers of a generation's objects.
Result<GenerationInfo> DescribeGeneration(Destination& dest, std::string_view key_dir,
                                          const GenerationId& gen);

enum class RestoreResult { kRestored, kNoReplica, kDeleted };

struct RestoreOutcome {
  RestoreResult result = RestoreResult::kNoReplica;
  GenerationId generation;
  std::uint64_t commits = 0;  // transactions applied after the snapshot
  WallMs as_of_ms = 0;        // time of the last commit in the restored file
  std::uint64_t bytes = 0;    // database size
  SnapshotOwner owner;        // of the file the snapshot was taken from
};

// Called with the bytes read so far and the total to read.
using Progress = std::function<void(std::uint64_t done, std::uint64_t total)>;

// Rebuilds the key's database into `out_fd` (an empty file the caller owns):
// the newest generation, or at `at_ms` the state after every commit up to that
// time. kNoReplica and kDeleted leave `out_fd` empty.
Result<RestoreOutcome> RestoreTo(Destination& dest, std::string_view key_dir,
                                 std::optional<WallMs> at_ms, int out_fd,
                                 const Progress& progress = nullptr);

// Retention: removes generations whose last time is before `before_ms`
// (never the newest), and inside the others the objects that precede their
// newest snapshot taken before `before_ms`. Returns how many it removed.
Result<int> PruneGenerations(Destination& dest, std::string_view key_dir, WallMs before_ms);

}  // namespace fleetfs::replica
