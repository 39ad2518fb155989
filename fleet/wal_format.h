// The SQLite write-ahead log, read the way SQLite's own recovery reads it
// (src/wal.c, walformat.html): a 32-byte header, then frames of a 24-byte
// header and one page. A frame counts only when its salts equal the header's
// and its checksum continues the running checksum; a transaction counts only
// when such a chain reaches a commit frame (one whose second field, the
// database size in pages, is not zero). Everything after the last valid
// commit frame is not committed, even when it looks complete: SQLite may
// still rewrite checksums after writing a commit frame.
//
// WalCursor remembers where the committed part of a log ends, with the
// running checksum there, so reading resumes without rereading the log. A
// restart (a new header with new salts) is recognised by the header, never by
// the size: the file is not truncated and old frames stay beyond the tail.
//
// Thread-safety: pure functions and values; ReadCommitted reads a descriptor
// with pread and keeps no state of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fleet/status.h"

namespace fleetfs::wal {

inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::size_t kFrameHeaderSize = 24;
inline constexpr std::uint32_t kMagicLittleEndian = 0x377f0682;
inline constexpr std::uint32_t kMagicBigEndian = 0x377f0683;

struct Checksum {
  std::uint32_t s0 = 0;
  std::uint32_t s1 = 0;
  bool operator==(const Checksum&) const = default;
};

// Continues `sum` over `n` bytes (a multiple of 8), words in the given order.
Checksum Continue(Checksum sum, bool big_endian_words, const std::uint8_t* data, std::size_t n);

struct Header {
  std::uint32_t magic = 0;
  std::uint32_t version = 0;
  std::uint32_t page_size = 0;
  std::uint32_t checkpoint_seq = 0;
  std::uint32_t salt1 = 0;
  std::uint32_t salt2 = 0;
  Checksum checksum;
  bool big_endian_words() const { return magic == kMagicBigEndian; }
};

// The header in `bytes` (at least 32), or nullopt when its magic, page size
// or checksum is not valid (an empty, zeroed or half-written header).
std::optional<Header> ParseHeader(const std::uint8_t* bytes, std::size_t n);

struct FrameHeader {
  std::uint32_t page_number = 0;
  std::uint32_t commit_pages = 0;  // database size after a commit; 0 otherwise
  std::uint32_t salt1 = 0;
  std::uint32_t salt2 = 0;
  Checksum checksum;
};
FrameHeader ParseFrameHeader(const std::uint8_t* bytes);

// Where the committed part of one log incarnation ends.
struct WalCursor {
  std::optional<Header> header;  // nullopt: not read yet (or no log)
  std::uint64_t offset = kHeaderSize;  // of the first frame not yet read
  Checksum chain;                      // running checksum up to `offset`
};

// One committed transaction: its pages (the last version of each, in page
// order) and the database size after it.
struct CommittedTxn {
  std::uint32_t page_size = 0;
  std::uint32_t db_pages = 0;
  std::uint64_t commit_frame_offset = 0;  // of the commit frame in the log
  std::vector<std::pair<std::uint32_t, std::string>> pages;
  // Its pages came to more than ReadCommitted's `max_txn_bytes`: `pages` is
  // empty (the transaction is committed, and only the file holds it).
  bool oversized = false;
};

struct ReadResult {
  std::vector<CommittedTxn> txns;
  bool restarted = false;  // the header's salts differ from the cursor's
  bool more = false;       // stopped at `max_bytes`: committed transactions may follow
};

// Reads the transactions committed after `cursor` from the log open on `fd`,
// and advances `cursor` past the last of them. When the header is new (or the
// cursor had none), reading starts at the first frame of the new log and
// `restarted` is set when the cursor had another header. An absent or
// unreadable header reads as no transactions. `max_bytes` bounds the page
// bytes returned in one call (0: no bound); the cursor stops at a commit.
// `max_txn_bytes` bounds what one transaction may hold in memory (0: no
// bound): a larger one comes back `oversized`, without its pages, so memory
// stays bounded however large a transaction is.
Result<ReadResult> ReadCommitted(int fd, WalCursor& cursor, std::uint64_t max_bytes = 0,
                                 std::uint64_t max_txn_bytes = 0);

// Where the newest committed version of each page is in the log open on
// `fd`: what a snapshot lays over the main file, read from the log as it
// copies, so a log of any size costs a few bytes per page, never its pages.
struct CommittedIndex {
  std::uint32_t page_size = 0;
  std::uint32_t db_pages = 0;  // the database's size after the last commit; 0: no commit
  std::uint64_t committed_frames = 0;  // frames up to the last commit
  std::map<std::uint32_t, std::uint64_t> pages;  // page number -> offset of its bytes in the log
};
Result<CommittedIndex> IndexCommitted(int fd);

// The frames of the log open on `fd` that belong to its current header
// (salts equal to the header's, checksum chain unbroken), as SQLite's
// recovery would keep them: a log reused after a checkpoint keeps old frames
// past its tail, so the file's size says nothing of them. At most
// `max_frames` are read (`capped` then), for a bound on the work.
struct FrameCount {
  bool header_valid = false;
  std::uint32_t page_size = 0;
  std::uint32_t checkpoint_seq = 0;
  std::uint64_t valid = 0;      // frames that continue the chain
  std::uint64_t committed = 0;  // of those, up to the last commit frame
  bool capped = false;          // stopped at max_frames: more may follow
};
Result<FrameCount> CountFrames(int fd, std::uint64_t max_frames);

}  // namespace fleetfs::wal
