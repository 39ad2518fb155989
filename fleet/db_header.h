// The SQLite database file header (fileformat2.html, "The Database Header"):
// the first 100 bytes of a main file. Only what operators are shown is read
// here: the page size, the page count and whether the file is in WAL mode.
// Bytes from a tenant file are untrusted: a wrong magic or an impossible
// page size reads as no header, never as a crash.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fleetfs::db {

inline constexpr std::size_t kHeaderSize = 100;

struct Header {
  std::uint32_t page_size = 0;  // 512..65536, a power of two
  std::uint8_t write_version = 0;  // byte 18: 1 legacy (rollback journal), 2 WAL
  std::uint8_t read_version = 0;   // byte 19: as byte 18
  // The "in-header database size" (offset 28), believed only when the
  // version-valid-for number (offset 92) equals the change counter (24);
  // else 0, and the size comes from the file's length (as SQLite does).
  std::uint32_t header_pages = 0;
  bool wal() const { return write_version == 2 || read_version == 2; }
};

// The header in `bytes`, or nullopt when there are fewer than 100 bytes, the
// magic "SQLite format 3\0" is missing or the page size is invalid.
std::optional<Header> ParseHeader(const std::uint8_t* bytes, std::size_t n);

// Pages in a main file of `file_bytes` with header `h`: the header's count
// when valid and no more than the file holds, else the length divided by
// the page size.
std::uint64_t PageCount(const Header& h, std::uint64_t file_bytes);

// How a main file keeps its transactions, as `fleetfs ls` shows it:
//   "empty"       0 bytes (a database not written yet)
//   "not-sqlite"  some bytes, but no valid header
//   "wal"         the header says WAL, or a -wal file is there
//   "rollback"    a rollback journal (DELETE, TRUNCATE, PERSIST, ...)
std::string_view JournalMode(const std::optional<Header>& h, std::uint64_t file_bytes,
                             bool wal_file_exists);

}  // namespace fleetfs::db
