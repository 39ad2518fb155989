#include "fleet/wal_format.h"

#include <unistd.h>

#include <cerrno>
#include <map>

#include "fleet/fd_io.h"

namespace fleetfs::wal {
namespace {

std::uint32_t Be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}
std::uint32_t Le32(const std::uint8_t* p) {
  return (std::uint32_t{p[3]} << 24) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[1]} << 8) |
         std::uint32_t{p[0]};
}

bool ValidPageSize(std::uint32_t size) {
  return size >= 512 && size <= 65536 && (size & (size - 1)) == 0;
}

}  // namespace

namespace {
// One loop per byte order, so the word reads inline (this runs over every
// byte the log holds).
template <bool kBigEndian>
Checksum ContinueIn(Checksum sum, const std::uint8_t* data, std::size_t n) {
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    sum.s0 += (kBigEndian ? Be32(data + i) : Le32(data + i)) + sum.s1;
    sum.s1 += (kBigEndian ? Be32(data + i + 4) : Le32(data + i + 4)) + sum.s0;
  }
  return sum;
}
}  // namespace

Checksum Continue(Checksum sum, bool big_endian_words, const std::uint8_t* data, std::size_t n) {
  return big_endian_words ? ContinueIn<true>(sum, data, n) : ContinueIn<false>(sum, data, n);
}

std::optional<Header> ParseHeader(const std::uint8_t* bytes, std::size_t n) {
  if (n < kHeaderSize) return std::nullopt;
  Header h;
  h.magic = Be32(bytes);
  if (h.magic != kMagicLittleEndian && h.magic != kMagicBigEndian) return std::nullopt;
  h.version = Be32(bytes + 4);
  h.page_size = Be32(bytes + 8);
  h.checkpoint_seq = Be32(bytes + 12);
  h.salt1 = Be32(bytes + 16);
  h.salt2 = Be32(bytes + 20);
  h.checksum = {Be32(bytes + 24), Be32(bytes + 28)};
  if (!ValidPageSize(h.page_size)) return std::nullopt;
  if (Continue({}, h.big_endian_words(), bytes, 24) != h.checksum) return std::nullopt;
  return h;
}

FrameHeader ParseFrameHeader(const std::uint8_t* bytes) {
  return FrameHeader{Be32(bytes),      Be32(bytes + 4),
                     Be32(bytes + 8),  Be32(bytes + 12),
                     {Be32(bytes + 16), Be32(bytes + 20)}};
}

Result<ReadResult> ReadCommitted(int fd, WalCursor& cursor, std::uint64_t max_bytes) {
  ReadResult result;
  std::uint8_t hbuf[kHeaderSize];
  FLEETFS_ASSIGN_OR_RETURN(std::size_t got, PreadFull(fd, hbuf, sizeof hbuf, 0));
  std::optional<Header> header = ParseHeader(hbuf, got);
  if (!header) return result;  // no log yet, or a header being written
  if (!cursor.header || cursor.header->salt1 != header->salt1 ||
      cursor.header->salt2 != header->salt2) {
    result.restarted = cursor.header.has_value();
    cursor.header = header;
    cursor.offset = kHeaderSize;
    cursor.chain = header->checksum;
  }
  const std::uint32_t page_size = header->page_size;
  const std::size_t frame_size = kFrameHeaderSize + page_size;
  const bool be = header->big_endian_words();

  // Frames are read in batches; a transaction may span batches.
  constexpr std::size_t kBatchFrames = 64;
  // Kept between calls: a fresh buffer of this size is a fresh mapping, and
  // its page faults cost more than the read.
  thread_local std::vector<std::uint8_t> batch;
  batch.resize(frame_size * kBatchFrames);
  std::map<std::uint32_t, std::string> open_pages;  // of the transaction being read
  std::uint64_t offset = cursor.offset;
  Checksum chain = cursor.chain;
  std::uint64_t returned = 0;
  while (true) {
    FLEETFS_ASSIGN_OR_RETURN(std::size_t n, PreadFull(fd, batch.data(), batch.size(), offset));
    std::size_t frames = n / frame_size;
    if (frames == 0) break;
    bool stop = false;
    for (std::size_t i = 0; i < frames && !stop; ++i) {
      const std::uint8_t* f = batch.data() + i * frame_size;
      FrameHeader fh = ParseFrameHeader(f);
      if (fh.salt1 != header->salt1 || fh.salt2 != header->salt2 || fh.page_number == 0) {
        stop = true;
        break;
      }
      Checksum next = Continue(chain, be, f, 8);
      next = Continue(next, be, f + kFrameHeaderSize, page_size);
      if (next != fh.checksum) {
        stop = true;
        break;
      }
      chain = next;
      open_pages[fh.page_number].assign(reinterpret_cast<const char*>(f + kFrameHeaderSize),
                                        page_size);
      offset += frame_size;
      if (fh.commit_pages != 0) {
        CommittedTxn txn;
        txn.page_size = page_size;
        txn.db_pages = fh.commit_pages;
        txn.commit_frame_offset = offset - frame_size;
        for (auto& [pgno, data] : open_pages) {
          returned += data.size();
          txn.pages.emplace_back(pgno, std::move(data));
        }
        open_pages.clear();
        result.txns.push_back(std::move(txn));
        cursor.offset = offset;
        cursor.chain = chain;
        if (max_bytes != 0 && returned >= max_bytes) return result;
      }
    }
    if (stop || frames < kBatchFrames) break;
  }
  return result;
}

}  // namespace fleetfs::wal
