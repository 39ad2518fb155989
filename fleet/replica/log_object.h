// The objects of a key's replica log, and their byte formats.
//
//   snapshot   the whole database at one commit, a zstd stream; written and
//              read streaming, never whole in memory
//   segment    committed transactions in commit order, each with its commit
//              time, the database size after it and the byte ranges it
//              wrote; one zstd frame
//   tombstone  the key was deleted through the mount at that time
//   marker     a new owner took the key at its epoch: it restored or checked
//              the log, and writes this at the next sequence, so an old
//              owner's next upload finds its sequence taken
//
// Every object is a header, then a body (empty for tombstones and markers).
// The header is little-endian, a fixed part then the key:
//
//   off size
//     0   8  magic "FLFSRLOG"
//     8   4  format version (1)
//    12   4  kind: 1 snapshot, 2 segment, 3 tombstone, 4 marker
//    16   8  epoch the writer owned the key at
//    24   8  sequence in the key's log (its name)
//    32   8  first_ms  first commit (segment), as-of (snapshot), deletion
//    40   8  last_ms   (tombstone), write time (marker); times are wall ms
//    48   8  db_size   database bytes after the object (snapshot, segment)
//    56  12  uid, gid, mode of the database file (snapshot)
//    68   4  commits (segment)
//    72   8  prev: ObjectChecksum of the object at sequence-1 (0 at 0)
//    80   8  body_bytes, as stored
//    88   8  body_raw_bytes, uncompressed, as declared
//    96   8  XXH64 of the stored body
//   104   4  key length (1 to kMaxLogKeyBytes)
//   108   4  zero
//   112   k  the key: its log directory ("176/acme.db")
//   112+k 8  XXH64 of every header byte before it
//
// So the first kMaxLogHeaderBytes of an object summarise it. Every length is
// bounded and covered by a checksum before it is used; a decoded object's
// fields must agree with each other, with its kind, and with what the caller
// expects (the key always; the sequence from the name, the epoch where
// known). Anything else is DataLoss, with a message naming what is wrong; the
// caller adds which object it is.
//
// An object's chain checksum (ObjectChecksum) is the XXH64 of all its bytes;
// the next object's `prev` holds it. Writers return it and readers compute it
// as they read, so a chain is checked without reading anything twice.
//
// Thread-safety: values and pure functions; a LogSnapshotReader is used by
// one thread.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/replica_object.h"  // Txn, PageWrite, SnapshotOwner, Overlay, kMaxSegmentRawBytes
#include "fleet/status.h"

namespace fleetfs::replica {

enum class LogKind : std::uint32_t { kSnapshot = 1, kSegment = 2, kTombstone = 3, kMarker = 4 };
std::string_view LogKindName(LogKind kind);

inline constexpr std::uint32_t kLogFormatVersion = 1;
// The header before the key, and the header checksum after it.
inline constexpr std::size_t kLogFixedHeaderBytes = 112;
inline constexpr std::size_t kLogHeaderHashBytes = 8;
// A key is its log directory: a bucket and a file name of at most a tenant id
// and a suffix, far below this.
inline constexpr std::size_t kMaxLogKeyBytes = 1024;
// Read this many bytes of an object to summarise it, whatever its key.
inline constexpr std::size_t kMaxLogHeaderBytes =
    kLogFixedHeaderBytes + kMaxLogKeyBytes + kLogHeaderHashBytes;
// The largest database a snapshot may declare (and a page write may reach):
// far above any SQLite file fleetfs serves. A restore writes no more than the
// declared size, whatever the compressed stream holds.
inline constexpr std::uint64_t kMaxLogDatabaseBytes = 1ull << 40;

// What an object's header says.
struct LogHeader {
  LogKind kind = LogKind::kSegment;
  std::uint64_t epoch = 0;
  std::uint64_t seq = 0;
  WallMs first_ms = 0;
  WallMs last_ms = 0;
  std::uint64_t db_size = 0;  // snapshot and segment
  SnapshotOwner owner;        // snapshot
  std::uint32_t commits = 0;  // segment
  std::uint64_t prev = 0;
  std::string key;
  std::uint64_t body_bytes = 0;
  std::uint64_t body_raw_bytes = 0;
  std::uint64_t body_hash = 0;

  // Header bytes, key and checksum included.
  std::size_t HeaderBytes() const {
    return kLogFixedHeaderBytes + key.size() + kLogHeaderHashBytes;
  }
  // The whole object's bytes as the header declares them.
  std::uint64_t ObjectBytes() const { return HeaderBytes() + body_bytes; }
  bool operator==(const LogHeader&) const = default;
};

// What a reader knows of an object before it reads it. The key is required;
// the rest is checked where given.
struct LogExpectation {
  std::string key;                         // the log directory it was listed in
  std::optional<std::uint64_t> seq;        // from the object's name
  std::optional<std::uint64_t> epoch;      // exactly this epoch
  std::optional<std::uint64_t> max_epoch;  // the highest epoch the store ever granted
};

// Where a writer puts an object: its key's log, at `seq`, under `epoch`,
// after the object whose ObjectChecksum is `prev` (0 at sequence 0).
struct LogPosition {
  std::string key;
  std::uint64_t epoch = 0;
  std::uint64_t seq = 0;
  std::uint64_t prev = 0;
};

// An object built in memory, with its chain checksum.
struct EncodedLogObject {
  std::string bytes;
  std::uint64_t checksum = 0;
};

// XXH64 of an object's bytes: what the next object's `prev` holds.
std::uint64_t ObjectChecksum(std::string_view object);

// The header's bytes for `header`, checksum computed, exactly as given: no
// rule is checked (the Encode functions check them before calling it, and
// tests use it to forge headers a reader must refuse).
std::string EncodeLogHeader(const LogHeader& header);

// Reads and checks the header at the start of `head` (the first
// kMaxLogHeaderBytes of an object suffice; more bytes are ignored).
Result<LogHeader> Summarize(std::string_view head, const LogExpectation& expected);

// Checks that `header`'s object follows the object whose checksum is
// `prev_checksum` in the chain.
Status CheckChain(const LogHeader& header, std::uint64_t prev_checksum);

// The Encode functions refuse (InvalidArgument) what a reader would refuse:
// a key of 0 or more than kMaxLogKeyBytes, a `prev` at sequence 0, a segment
// without transactions or above kMaxSegmentRawBytes, a page write or size
// beyond kMaxLogDatabaseBytes.
Result<EncodedLogObject> EncodeLogSegment(const LogPosition& at, const std::vector<Txn>& txns);
Result<EncodedLogObject> EncodeLogTombstone(const LogPosition& at, WallMs deleted_ms);
Result<EncodedLogObject> EncodeLogMarker(const LogPosition& at, WallMs written_ms);

// An object read whole from memory: a segment, tombstone or marker.
struct DecodedLogObject {
  LogHeader header;
  std::vector<Txn> txns;  // a segment's; empty for the others
  std::uint64_t checksum = 0;
};
// A segment's transaction as views into its decompressed body.
struct PageView {
  std::uint64_t offset = 0;
  std::string_view data;
};
struct TxnView {
  WallMs commit_ms = 0;
  std::uint64_t db_size = 0;
  std::vector<PageView> writes;
};
// An object decoded with every check DecodeLogObject makes, its
// transactions as views into `body` (which it owns): for a restore, which
// writes the pages out and keeps none, so no page is copied or allocated.
struct DecodedLogViews {
  LogHeader header;
  std::unique_ptr<char[]> body;  // a segment's decompressed body; null for the others
  std::vector<TxnView> txns;     // views into `body`
  std::uint64_t checksum = 0;
};
// Decodes a segment, tombstone or marker. A snapshot is refused: it is read
// streaming, with a LogSnapshotReader. The transactions' lengths are bounded
// by the declared raw size, itself bounded and checked against the zstd frame
// and the body checksum before memory is reserved for it.
Result<DecodedLogObject> DecodeLogObject(std::string_view object, const LogExpectation& expected);
Result<DecodedLogViews> DecodeLogObjectViews(std::string_view object, const LogExpectation& expected);
// As DecodeLogObject, refusing any kind but a segment.
Result<DecodedLogObject> DecodeLogSegment(std::string_view object, const LogExpectation& expected);

// Writes a snapshot of the `db_size` bytes of `src_fd` (from offset 0,
// through `overlay` as WriteSnapshot does) to `out_fd`, an empty file open
// for reading and writing, from its offset 0. The header goes first and is
// rewritten once the body's checksum is known, so the object is then read
// back once to compute its chain checksum, which is returned.
Result<std::uint64_t> WriteLogSnapshot(int src_fd, std::uint64_t db_size, const LogPosition& at,
                                       WallMs as_of_ms, SnapshotOwner owner,
                                       const Overlay& overlay, int out_fd);

// Reads a snapshot pushed to it in pieces, writing the database to `out_fd`
// (from offset 0), never more than the declared size. The body's checksum
// can only be judged at the end: until Finish() succeeds, what was written is
// not the database, and the caller discards it on any error. A bad header or
// an object longer than declared fails Feed at once; a body that will not
// decompress is reported by Finish, after the checksum that tells damage on
// the way from a bad writer.
class LogSnapshotReader {
 public:
  LogSnapshotReader(int out_fd, LogExpectation expected);
  ~LogSnapshotReader();
  LogSnapshotReader(const LogSnapshotReader&) = delete;
  LogSnapshotReader& operator=(const LogSnapshotReader&) = delete;

  // Once a call fails, every later call returns the same error.
  Status Feed(std::string_view bytes);
  // Checks that the whole object arrived, the body's checksum matches and it
  // decompressed to exactly the declared size.
  Status Finish();

  // The header, once Feed has passed it.
  const std::optional<LogHeader>& header() const { return header_; }
  std::uint64_t written() const { return written_; }
  // The chain checksum; meaningful once Finish() succeeded.
  std::uint64_t checksum() const { return checksum_; }

 private:
  Status FeedHeader(std::string_view& bytes);
  Status FeedBody(std::string_view bytes);

  int out_fd_;
  LogExpectation expected_;
  std::string head_;  // header bytes while they arrive
  std::optional<LogHeader> header_;
  Status failed_;      // the error every later call returns
  Status body_error_;  // a stream that would not decompress, told at Finish
  struct ZstdFree {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
  };
  std::unique_ptr<ZSTD_DCtx, ZstdFree> dctx_;
  struct HashState;  // XXH64 states, kept out of this header
  std::unique_ptr<HashState> hashes_;
  std::unique_ptr<char[]> out_buf_;  // decompressed bytes on their way to out_fd
  std::size_t out_buf_bytes_ = 0;
  std::uint64_t body_seen_ = 0;
  std::uint64_t written_ = 0;
  bool frame_ended_ = false;
  std::uint64_t checksum_ = 0;
};

}  // namespace fleetfs::replica
