// SpillFile: one tenant's captured commits that did not fit in the agent's
// capture memory (CaptureBudget in capture.h), oldest first, in an
// append-only file under BACKING/.fleetfs/spill/ (issue 10 item 11).
//
// The file is local and lives no longer than the process: nothing a restart
// needs is in it (the tenant's unshipped marker makes a restart ship it from
// a snapshot), so its records carry no checksum and the agent removes every
// spill file at start. What was taken from its front is punched out of the
// file, so a spill that never empties (writes as fast as the shipping) does
// not keep growing on disk; the file is removed once empty.
//
// Thread-safety: none; its Capture uses it under its own lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "fleet/replica_object.h"
#include "fleet/status.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {

// Under the backing directory: the spill files, named as the unshipped
// markers are (MarkerName in capture.h).
inline constexpr std::string_view kSpillDir = ".fleetfs/spill";

class SpillFile {
 public:
  // `root` (the backing directory) must outlive the spill; `path` is relative
  // to it. Nothing is made until the first Append.
  SpillFile(int root, std::string path) : root_(root), path_(std::move(path)) {}
  ~SpillFile() { Clear(); }
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // The bytes `txn` takes in the file.
  static std::uint64_t RecordBytes(const Txn& txn);

  bool empty() const { return count_ == 0; }
  std::size_t size() const { return count_; }
  // Bytes of the records not yet taken.
  std::uint64_t live_bytes() const { return end_ - read_; }
  // Bytes the file holds on the volume: the records not taken, and what was
  // taken but could not be punched out yet.
  std::uint64_t disk_bytes() const { return end_ - freed_; }
  // The oldest record's commit time; 0 when empty.
  WallMs front_ms() const { return front_ms_; }

  // Appends `txn` (made 0600 on the first). On an error nothing of it counts.
  Status Append(const Txn& txn);
  // Takes the oldest record.
  Result<Txn> Pop();
  // The commit times of every record not taken, oldest first.
  Result<std::vector<WallMs>> CommitTimes() const;
  // Frees on the volume what was taken: the file goes once empty, else the
  // taken front is punched out. Returns how many bytes disk_bytes() dropped.
  std::uint64_t Trim();
  // Forgets every record and removes the file.
  void Clear();

 private:
  struct Head {
    std::uint64_t record_bytes = 0;
    WallMs commit_ms = 0;
  };
  Result<Head> ReadHead(std::uint64_t at) const;

  const int root_;
  const std::string path_;
  UniqueFd fd_;
  std::uint64_t read_ = 0;   // the oldest record not taken
  std::uint64_t end_ = 0;    // where the next record goes
  std::uint64_t freed_ = 0;  // [0, freed_) is punched out
  std::size_t count_ = 0;
  WallMs front_ms_ = 0;
};

}  // namespace fleetfs::replica
