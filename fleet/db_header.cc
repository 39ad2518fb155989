#include "fleet/db_header.h"

#include <cstring>

namespace fleetfs::db {
namespace {

constexpr char kMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f',
                             'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};

// The header's integers are big-endian.
std::uint32_t Be16(const std::uint8_t* p) { return (std::uint32_t(p[0]) << 8) | p[1]; }
std::uint32_t Be32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         p[3];
}

}  // namespace

std::optional<Header> ParseHeader(const std::uint8_t* bytes, std::size_t n) {
  if (bytes == nullptr || n < kHeaderSize || std::memcmp(bytes, kMagic, sizeof kMagic) != 0) {
    return std::nullopt;
  }
  Header h;
  const std::uint32_t raw = Be16(bytes + 16);
  // 1 stands for 65536, which sixteen bits cannot hold.
  h.page_size = raw == 1 ? 65536 : raw;
  if (h.page_size < 512 || h.page_size > 65536 || (h.page_size & (h.page_size - 1)) != 0) {
    return std::nullopt;
  }
  h.write_version = bytes[18];
  h.read_version = bytes[19];
  if (Be32(bytes + 24) == Be32(bytes + 92)) h.header_pages = Be32(bytes + 28);
  return h;
}

std::uint64_t PageCount(const Header& h, std::uint64_t file_bytes) {
  const std::uint64_t in_file = h.page_size == 0 ? 0 : file_bytes / h.page_size;
  // A header is the tenant's bytes: a count the file cannot hold is not believed.
  if (h.header_pages != 0 && h.header_pages <= in_file) return h.header_pages;
  return in_file;
}

std::string_view JournalMode(const std::optional<Header>& h, std::uint64_t file_bytes,
                             bool wal_file_exists) {
  if (file_bytes == 0) return wal_file_exists ? "wal" : "empty";
  if (!h) return "not-sqlite";
  if (h->wal() || wal_file_exists) return "wal";
  return "rollback";
}

}  // namespace fleetfs::db
