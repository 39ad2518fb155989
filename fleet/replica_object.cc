#include "fleet/little_endian.h"
#include "fleet/replica_object.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "fleet/fd_io.h"

namespace fleetfs::replica {
namespace {

constexpr std::string_view kSnapshotMagic = "FLFSSNP1";
constexpr std::string_view kSegmentMagic = "FLFSSEG1";
constexpr std::string_view kTombstoneMagic = "FLFSTMB1";
constexpr int kZstdLevel = 1;  // restore speed is the same at any level; capture wants speed
constexpr std::size_t kChunk = 1 << 20;


std::string Header(std::string_view magic, std::uint32_t commits, WallMs first, WallMs last,
                   std::uint64_t size, std::uint64_t stored, std::uint64_t hash,
                   std::uint32_t extra = 0) {
  std::string h(magic);
  PutLittleEndian<std::uint32_t>(h, commits);
  PutLittleEndian<std::uint32_t>(h, extra);
  PutLittleEndian<std::int64_t>(h, first);
  PutLittleEndian<std::int64_t>(h, last);
  PutLittleEndian<std::uint64_t>(h, size);
  PutLittleEndian<std::uint64_t>(h, stored);
  PutLittleEndian<std::uint64_t>(h, hash);
  return h;
}

}  // namespace

std::string_view KindName(ObjectKind kind) {
  switch (kind) {
    case ObjectKind::kSnapshot: return "snapshot";
    case ObjectKind::kSegment: return "segment";
    case ObjectKind::kTombstone: return "tombstone";
  }
  return "unknown";
}

std::uint64_t Txn::Bytes() const {
  std::uint64_t n = 0;
  for (const auto& w : writes) n += w.data.size();
  return n;
}

Result<ObjectSummary> Summarize(std::string_view h) {
  if (h.size() < kObjectHeaderBytes) {
    return DataLoss("the object is " + std::to_string(h.size()) + " bytes, shorter than its " +
                    std::to_string(kObjectHeaderBytes) + "-byte header");
  }
  ObjectSummary s;
  std::string_view magic = h.substr(0, 8);
  if (magic == kSnapshotMagic) s.kind = ObjectKind::kSnapshot;
  else if (magic == kSegmentMagic) s.kind = ObjectKind::kSegment;
  else if (magic == kTombstoneMagic) s.kind = ObjectKind::kTombstone;
  else return DataLoss("the object does not start with a fleetfs replica header");
  s.commits = GetLittleEndian<std::uint32_t>(h, 8);
  s.first_ms = GetLittleEndian<std::int64_t>(h, 16);
  s.last_ms = GetLittleEndian<std::int64_t>(h, 24);
  if (s.kind == ObjectKind::kSnapshot) {
    // A snapshot keeps the file's mode in the spare word and its owner where
    // a segment keeps its stored length.
    s.db_size = GetLittleEndian<std::uint64_t>(h, 32);
    s.owner.mode = GetLittleEndian<std::uint32_t>(h, 12);
    s.owner.uid = GetLittleEndian<std::uint32_t>(h, 40);
    s.owner.gid = GetLittleEndian<std::uint32_t>(h, 44);
  }
  return s;
}

std::string EncodeSegment(const std::vector<Txn>& txns) {
  std::string raw;
  for (const Txn& t : txns) {
    PutLittleEndian<std::int64_t>(raw, t.commit_ms);
    PutLittleEndian<std::uint64_t>(raw, t.db_size);
    PutLittleEndian<std::uint32_t>(raw, static_cast<std::uint32_t>(t.writes.size()));
    for (const PageWrite& w : t.writes) {
      PutLittleEndian<std::uint64_t>(raw, w.offset);
      PutLittleEndian<std::uint32_t>(raw, static_cast<std::uint32_t>(w.data.size()));
      raw += w.data;
    }
  }
  std::string stored(ZSTD_compressBound(raw.size()), '\0');
  std::size_t n = ZSTD_compress(stored.data(), stored.size(), raw.data(), raw.size(), kZstdLevel);
  stored.resize(ZSTD_isError(n) ? 0 : n);
  WallMs first = txns.empty() ? 0 : txns.front().commit_ms;
  WallMs last = txns.empty() ? 0 : txns.back().commit_ms;
  std::string out = Header(kSegmentMagic, static_cast<std::uint32_t>(txns.size()), first, last,
                           raw.size(), stored.size(), XXH64(stored.data(), stored.size(), 0));
  return out + stored;
}

Result<std::vector<Txn>> DecodeSegment(std::string_view bytes) {
  FLEETFS_ASSIGN_OR_RETURN(ObjectSummary s, Summarize(bytes));
  if (s.kind != ObjectKind::kSegment) return DataLoss("expected a segment, found a " +
                                                      std::string(KindName(s.kind)));
  std::uint64_t raw_len = GetLittleEndian<std::uint64_t>(bytes, 32);
  std::uint64_t stored_len = GetLittleEndian<std::uint64_t>(bytes, 40);
  std::uint64_t hash = GetLittleEndian<std::uint64_t>(bytes, 48);
  std::string_view stored = bytes.substr(kObjectHeaderBytes);
  if (stored.size() != stored_len) {
    return DataLoss("truncated: " + std::to_string(stored.size()) + " of " +
                    std::to_string(stored_len) + " bytes");
  }
  if (XXH64(stored.data(), stored.size(), 0) != hash) return DataLoss("checksum mismatch");
  // A checksum proves only that the bytes are as written, not by whom: the
  // declared size is checked against the bound and the zstd frame before a
  // byte of memory is reserved for it.
  if (raw_len > kMaxSegmentRawBytes) {
    return DataLoss("declares " + std::to_string(raw_len) + " bytes of transactions, above the " +
                    std::to_string(kMaxSegmentRawBytes) + " a segment may hold");
  }
  if (ZSTD_getFrameContentSize(stored.data(), stored.size()) != raw_len) {
    return DataLoss("declares " + std::to_string(raw_len) +
                    " bytes of transactions, but its compressed frame says otherwise");
  }
  std::string raw(raw_len, '\0');
  std::size_t n = ZSTD_decompress(raw.data(), raw.size(), stored.data(), stored.size());
  if (ZSTD_isError(n) || n != raw_len) {
    return DataLoss(std::string("cannot decompress: ") +
                    (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size"));
  }
  std::vector<Txn> txns;
  std::size_t at = 0;
  auto need = [&](std::size_t k) { return at + k <= raw.size(); };
  for (std::uint32_t i = 0; i < s.commits; ++i) {
    if (!need(20)) return DataLoss("transaction " + std::to_string(i) + " is cut short");
    Txn t;
    t.commit_ms = GetLittleEndian<std::int64_t>(raw, at);
    t.db_size = GetLittleEndian<std::uint64_t>(raw, at + 8);
    std::uint32_t nwrites = GetLittleEndian<std::uint32_t>(raw, at + 16);
    at += 20;
    for (std::uint32_t w = 0; w < nwrites; ++w) {
      if (!need(12)) return DataLoss("transaction " + std::to_string(i) + " is cut short");
      PageWrite pw;
      pw.offset = GetLittleEndian<std::uint64_t>(raw, at);
      std::uint32_t len = GetLittleEndian<std::uint32_t>(raw, at + 8);
      at += 12;
      if (!need(len)) return DataLoss("transaction " + std::to_string(i) + " is cut short");
      pw.data.assign(raw, at, len);
      at += len;
      t.writes.push_back(std::move(pw));
    }
    txns.push_back(std::move(t));
  }
  if (at != raw.size()) return DataLoss("trailing bytes after the last transaction");
  return txns;
}

std::string EncodeTombstone(WallMs deleted_ms) {
  return Header(kTombstoneMagic, 0, deleted_ms, deleted_ms, 0, 0, 0);
}

Status WriteSnapshot(int src_fd, std::uint64_t db_size, WallMs as_of_ms, SnapshotOwner owner,
                     const Overlay& overlay, int out_fd) {
  const std::uint64_t ids = (std::uint64_t{owner.gid} << 32) | owner.uid;
  // The header goes first with its checksum left empty, and is rewritten at
  // the end, when the checksum is known.
  std::string header = Header(kSnapshotMagic, 0, as_of_ms, as_of_ms, db_size, ids, 0, owner.mode);
  FLEETFS_RETURN_IF_ERROR(WriteAll(out_fd, header.data(), header.size()));
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(),
                                                                 XXH64_freeState);
  XXH64_reset(hash.get(), 0);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, kZstdLevel);
  std::vector<char> in(kChunk);
  std::vector<char> out(ZSTD_CStreamOutSize());
  std::uint64_t offset = 0;
  while (true) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, db_size - offset));
    FLEETFS_ASSIGN_OR_RETURN(std::size_t got, PreadFull(src_fd, in.data(), want, offset));
    std::memset(in.data() + got, 0, want - got);  // pages that exist only in the WAL
    if (overlay && want > 0) overlay(offset, in.data(), want);
    XXH64_update(hash.get(), in.data(), want);
    offset += want;
    const bool last = offset >= db_size;
    ZSTD_inBuffer input{in.data(), want, 0};
    bool finished = false;
    while (!finished) {
      ZSTD_outBuffer output{out.data(), out.size(), 0};
      std::size_t left = ZSTD_compressStream2(cctx.get(), &output, &input,
                                              last ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(left)) return Internal(std::string("zstd: ") + ZSTD_getErrorName(left));
      FLEETFS_RETURN_IF_ERROR(WriteAll(out_fd, out.data(), output.pos));
      finished = last ? left == 0 : input.pos == input.size;
    }
    if (last) break;
  }
  header = Header(kSnapshotMagic, 0, as_of_ms, as_of_ms, db_size, ids, XXH64_digest(hash.get()),
                  owner.mode);
  if (::pwrite(out_fd, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size())) {
    return ErrnoStatus("writing the snapshot header", errno);
  }
  return Status::Ok();
}

SnapshotReader::SnapshotReader(int out_fd)
    : out_fd_(out_fd), out_buf_(4u << 20) {  // large writes: restores run near disk speed
  dctx_ = ZSTD_createDCtx();
  auto* state = XXH64_createState();
  XXH64_reset(state, 0);
  hash_state_ = state;
}

SnapshotReader::~SnapshotReader() {
  ZSTD_freeDCtx(dctx_);
  XXH64_freeState(static_cast<XXH64_state_t*>(hash_state_));
}

Status SnapshotReader::Emit(const char* data, std::size_t n) {
  if (written_ + n > summary_.db_size) return DataLoss("more bytes than the header says");
  XXH64_update(static_cast<XXH64_state_t*>(hash_state_), data, n);
  FLEETFS_RETURN_IF_ERROR(PwriteAll(out_fd_, data, n, written_));
  written_ += n;
  return Status::Ok();
}

Status SnapshotReader::Feed(std::string_view bytes) {
  if (!have_header_) {
    std::size_t take = std::min(bytes.size(), kObjectHeaderBytes - header_.size());
    header_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (header_.size() < kObjectHeaderBytes) return Status::Ok();
    FLEETFS_ASSIGN_OR_RETURN(summary_, Summarize(header_));
    if (summary_.kind != ObjectKind::kSnapshot) {
      return DataLoss("expected a snapshot, found a " + std::string(KindName(summary_.kind)));
    }
    expected_hash_ = GetLittleEndian<std::uint64_t>(header_, 48);
    have_header_ = true;
  }
  ZSTD_inBuffer input{bytes.data(), bytes.size(), 0};
  while (input.pos < input.size) {
    ZSTD_outBuffer output{out_buf_.data(), out_buf_.size(), 0};
    std::size_t r = ZSTD_decompressStream(dctx_, &output, &input);
    if (ZSTD_isError(r)) return DataLoss(std::string("cannot decompress: ") + ZSTD_getErrorName(r));
    FLEETFS_RETURN_IF_ERROR(Emit(out_buf_.data(), output.pos));
  }
  return Status::Ok();
}

Status SnapshotReader::Finish() {
  if (!have_header_) return DataLoss("the snapshot is shorter than its header");
  // Drain what zstd still holds.
  while (true) {
    ZSTD_inBuffer input{nullptr, 0, 0};
    ZSTD_outBuffer output{out_buf_.data(), out_buf_.size(), 0};
    std::size_t r = ZSTD_decompressStream(dctx_, &output, &input);
    if (ZSTD_isError(r)) return DataLoss(std::string("cannot decompress: ") + ZSTD_getErrorName(r));
    FLEETFS_RETURN_IF_ERROR(Emit(out_buf_.data(), output.pos));
    if (output.pos == 0) break;
  }
  if (written_ != summary_.db_size) {
    return DataLoss("truncated: " + std::to_string(written_) + " of " +
                    std::to_string(summary_.db_size) + " bytes");
  }
  if (XXH64_digest(static_cast<XXH64_state_t*>(hash_state_)) != expected_hash_) {
    return DataLoss("checksum mismatch");
  }
  return Status::Ok();
}

}  // namespace fleetfs::replica
