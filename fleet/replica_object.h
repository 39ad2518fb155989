// The objects a replica generation is made of, and their byte formats.
//
//   snapshot   the whole database at one commit: a header, then the file's
//              bytes as a zstd stream; the header carries the size and an
//              XXH64 of the uncompressed bytes
//   segment    one or more committed transactions, in commit order, each
//              with its commit time, the database size after it and the
//              byte ranges it wrote; zstd-compressed, the header carries an
//              XXH64 of the stored bytes
//   tombstone  the tenant was deleted through the mount at that time
//
// Every header is fixed-size and little-endian, so a listing can summarise an
// object from its first bytes. A checksum that does not match is a DataLoss
// error; the caller names the object.
//
// Thread-safety: values and pure functions; a SnapshotWriter or
// SnapshotReader is used by one thread.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/status.h"

namespace fleetfs::replica {

enum class ObjectKind { kSnapshot, kSegment, kTombstone };
std::string_view KindName(ObjectKind kind);

struct PageWrite {
  std::uint64_t offset = 0;
  std::string data;
};

// One committed transaction as the replica keeps it.
struct Txn {
  WallMs commit_ms = 0;
  std::uint64_t db_size = 0;  // bytes of the database file after the commit
  std::vector<PageWrite> writes;
  std::uint64_t Bytes() const;
};

// What the header of an object says.
// Who owned the database file and its mode, so a restore gives them back.
struct SnapshotOwner {
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint32_t mode = 0;
  bool operator==(const SnapshotOwner&) const = default;
};

struct ObjectSummary {
  ObjectKind kind = ObjectKind::kSegment;
  std::uint32_t commits = 0;     // transactions in a segment; 0 for the others
  WallMs first_ms = 0;           // first commit (segment), as-of (snapshot), deletion (tombstone)
  WallMs last_ms = 0;
  std::uint64_t db_size = 0;     // snapshot only
  SnapshotOwner owner;           // snapshot only
};

// The fixed header size: read this many bytes to summarise any object.
inline constexpr std::size_t kObjectHeaderBytes = 56;
// The most transaction bytes one segment may declare. The shipper keeps at
// most 256 MiB captured per tenant; anything declaring more was not written
// by it, and is refused before memory is reserved for it.
inline constexpr std::uint64_t kMaxSegmentRawBytes = 1ull << 30;

Result<ObjectSummary> Summarize(std::string_view header);

std::string EncodeSegment(const std::vector<Txn>& txns);
Result<std::vector<Txn>> DecodeSegment(std::string_view bytes);

std::string EncodeTombstone(WallMs deleted_ms);

// Writes a snapshot of `db_size` bytes read from `src_fd` at offset 0 to
// `out_fd`, through a page-overlay callback that may replace a page's bytes
// (WAL frames newer than the main file). `overlay(offset, buf, n)` is called
// for each chunk read.
using Overlay = std::function<void(std::uint64_t offset, char* buf, std::size_t n)>;
Status WriteSnapshot(int src_fd, std::uint64_t db_size, WallMs as_of_ms, SnapshotOwner owner,
                     const Overlay& overlay, int out_fd);

// Reads a snapshot pushed to it in pieces, writing the database to `out_fd`.
class SnapshotReader {
 public:
  explicit SnapshotReader(int out_fd);
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  Status Feed(std::string_view bytes);
  // Checks that the whole database arrived and its checksum matches.
  Status Finish();
  std::uint64_t written() const { return written_; }
  const ObjectSummary& summary() const { return summary_; }

 private:
  Status Emit(const char* data, std::size_t n);

  int out_fd_;
  std::string header_;
  bool have_header_ = false;
  ObjectSummary summary_;
  std::uint64_t expected_hash_ = 0;
  ZSTD_DCtx* dctx_ = nullptr;
  void* hash_state_ = nullptr;  // XXH64_state_t
  std::vector<char> out_buf_;
  std::uint64_t written_ = 0;
};

}  // namespace fleetfs::replica
