#include "fleet/wal_format.h"

#include <unistd.h>

#include <algorithm>
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

namespace {

// The valid frames after `cursor` (the checksum chain and salts hold), in
// order: `on_frame(page number, page bytes, page size, offset of the frame)`
// for each, then `on_commit(frame header, offset of the frame)` for a commit
// frame. The page size is the header's as read now, never the cursor's: a
// header rewritten with the same salts and another page size (anyone who
// can write the file can) must not make a page read as larger than its frame.
// The cursor advances past each commit; frames after the last commit are
// read and not kept. False from on_commit stops the walk (after it).
template <typename OnFrame, typename OnCommit>
Result<std::optional<Header>> WalkCommitted(int fd, WalCursor& cursor, bool* restarted,
                                            OnFrame on_frame, OnCommit on_commit) {
  std::uint8_t hbuf[kHeaderSize];
  FLEETFS_ASSIGN_OR_RETURN(std::size_t got, PreadFull(fd, hbuf, sizeof hbuf, 0));
  std::optional<Header> header = ParseHeader(hbuf, got);
  if (!header) return header;  // no log yet, or a header being written
  if (!cursor.header || cursor.header->salt1 != header->salt1 ||
      cursor.header->salt2 != header->salt2 || cursor.header->page_size != header->page_size ||
      cursor.header->magic != header->magic) {
    if (restarted) *restarted = cursor.header.has_value();
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
  std::uint64_t offset = cursor.offset;
  Checksum chain = cursor.chain;
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
      on_frame(fh.page_number, f + kFrameHeaderSize, page_size, offset);
      offset += frame_size;
      if (fh.commit_pages != 0) {
        cursor.offset = offset;
        cursor.chain = chain;
        if (!on_commit(fh, offset - frame_size)) return header;
      }
    }
    if (stop || frames < kBatchFrames) break;
  }
  return header;
}

}  // namespace

Result<ReadResult> ReadCommitted(int fd, WalCursor& cursor, std::uint64_t max_bytes,
                                 std::uint64_t max_txn_bytes) {
  ReadResult result;
  std::map<std::uint32_t, std::string> open_pages;  // of the transaction being read
  std::uint64_t open_bytes = 0;
  bool oversized = false;  // its pages are no longer kept
  std::uint64_t returned = 0;
  std::uint32_t page_size = 0;
  auto walked = WalkCommitted(
      fd, cursor, &result.restarted,
      [&](std::uint32_t pgno, const std::uint8_t* data, std::uint32_t size, std::uint64_t) {
        page_size = size;
        if (oversized) return;
        auto [it, added] = open_pages.try_emplace(pgno);
        if (added) open_bytes += size;
        it->second.assign(reinterpret_cast<const char*>(data), size);
        if (max_txn_bytes != 0 && open_bytes > max_txn_bytes) {
          // Held whole it would be as large as it is (many GB): it is
          // reported instead, for the caller to ship the file.
          oversized = true;
          open_pages.clear();
        }
      },
      [&](const FrameHeader& fh, std::uint64_t frame_offset) {
        CommittedTxn txn;
        txn.page_size = page_size;
        txn.db_pages = fh.commit_pages;
        txn.commit_frame_offset = frame_offset;
        txn.oversized = oversized;
        for (auto& [pgno, data] : open_pages) {
          returned += data.size();
          txn.pages.emplace_back(pgno, std::move(data));
        }
        open_pages.clear();
        open_bytes = 0;
        oversized = false;
        result.txns.push_back(std::move(txn));
        if (max_bytes != 0 && returned >= max_bytes) {
          result.more = true;
          return false;
        }
        return true;
      });
  if (!walked.ok()) return walked.status();
  return result;
}

Result<CommittedIndex> IndexCommitted(int fd) {
  CommittedIndex index;
  WalCursor cursor;
  std::map<std::uint32_t, std::uint64_t> open;  // of the transaction being read
  std::uint64_t frames = 0;
  auto walked = WalkCommitted(
      fd, cursor, nullptr,
      [&](std::uint32_t pgno, const std::uint8_t*, std::uint32_t, std::uint64_t frame_offset) {
        open[pgno] = frame_offset + kFrameHeaderSize;
        ++frames;
      },
      [&](const FrameHeader& fh, std::uint64_t) {
        for (auto& [pgno, at] : open) index.pages[pgno] = at;
        open.clear();
        index.committed_frames = frames;
        index.db_pages = fh.commit_pages;
        return true;
      });
  if (!walked.ok()) return walked.status();
  if (*walked) index.page_size = (*walked)->page_size;
  return index;
}

Result<FrameCount> CountFrames(int fd, std::uint64_t max_frames) {
  FrameCount count;
  std::uint8_t hbuf[kHeaderSize];
  FLEETFS_ASSIGN_OR_RETURN(std::size_t got, PreadFull(fd, hbuf, sizeof hbuf, 0));
  const std::optional<Header> header = ParseHeader(hbuf, got);
  if (!header) return count;
  count.header_valid = true;
  count.page_size = header->page_size;
  count.checkpoint_seq = header->checkpoint_seq;
  const bool be = header->big_endian_words();
  std::vector<std::uint8_t> frame(kFrameHeaderSize + header->page_size);
  std::uint64_t offset = kHeaderSize;
  Checksum chain = header->checksum;
  while (true) {
    if (count.valid >= max_frames) {
      count.capped = true;
      break;
    }
    FLEETFS_ASSIGN_OR_RETURN(std::size_t n, PreadFull(fd, frame.data(), frame.size(), offset));
    if (n < frame.size()) break;
    const FrameHeader fh = ParseFrameHeader(frame.data());
    if (fh.salt1 != header->salt1 || fh.salt2 != header->salt2 || fh.page_number == 0) break;
    Checksum next = Continue(chain, be, frame.data(), 8);
    next = Continue(next, be, frame.data() + kFrameHeaderSize, header->page_size);
    if (next != fh.checksum) break;
    chain = next;
    ++count.valid;
    if (fh.commit_pages != 0) count.committed = count.valid;
    offset += frame.size();
  }
  return count;
}

}  // namespace fleetfs::wal
