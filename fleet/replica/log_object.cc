#include "fleet/little_endian.h"
#include "fleet/replica/log_object.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fleet/fd_io.h"
#include "fleet/replica/log_names.h"

namespace fleetfs::replica {
namespace {

constexpr std::string_view kMagic = "FLFSRLOG";
// The magics of the generations layout's objects, recognised only to say so.
constexpr std::string_view kOldMagics[] = {"FLFSSNP1", "FLFSSEG1", "FLFSTMB1"};

// Offsets of the fixed header part (see the table in log_object.h).
constexpr std::size_t kOffVersion = 8, kOffKind = 12, kOffEpoch = 16, kOffSeq = 24,
                      kOffFirst = 32, kOffLast = 40, kOffDbSize = 48, kOffUid = 56,
                      kOffGid = 60, kOffMode = 64, kOffCommits = 68, kOffPrev = 72,
                      kOffBodyBytes = 80, kOffBodyRaw = 88, kOffBodyHash = 96, kOffKeyLen = 104,
                      kOffZero = 108;
static_assert(kOffZero + 4 == kLogFixedHeaderBytes);

// Each transaction of a segment body: commit_ms, db_size, write count; each
// page write: offset, length, then its bytes.
constexpr std::size_t kTxnHeadBytes = 20;
constexpr std::size_t kWriteHeadBytes = 12;

constexpr int kZstdLevel = 1;  // restore speed is the same at any level; capture wants speed
// The snapshot writer's window, and the most a reader lets a frame ask for:
// a forged frame header cannot make the decoder reserve more than 1 MiB.
constexpr int kZstdWindowLog = 20;
constexpr std::size_t kChunk = 1 << 20;
// A snapshot reader's writes: large, so restores run near disk speed, but
// never larger than the database (a page at least).
constexpr std::uint64_t kOutBufMaxBytes = 4 << 20;
constexpr std::uint64_t kOutBufMinBytes = 4096;


std::string N(std::uint64_t v) { return std::to_string(v); }

const std::uint64_t kEmptyHash = XXH64(nullptr, 0, 0);

// The first bytes of a zstd frame: a body is one frame, never a skippable or
// legacy one (zstd reads those differently depending on where a stream is
// cut, and no writer here makes them).
constexpr unsigned char kZstdMagic[4] = {0x28, 0xb5, 0x2f, 0xfd};  // ZSTD_MAGICNUMBER
static_assert(ZSTD_MAGICNUMBER == 0xFD2FB528);

bool StartsAsZstdFrame(std::string_view body) {
  return body.size() >= sizeof kZstdMagic &&
         std::memcmp(body.data(), kZstdMagic, sizeof kZstdMagic) == 0;
}

// The most bytes zstd may store for `raw` bytes compressed in one frame
// without intermediate flushes, as both writers do.
std::uint64_t StoredBound(std::uint64_t raw) { return ZSTD_compressBound(raw); }

// What the fixed part says the whole header's size is; checks the magic,
// version and key length, the fields needed before the header checksum can be
// computed.
Result<std::size_t> HeaderSizeFromFixed(std::string_view head) {
  if (head.size() < kLogFixedHeaderBytes) {
    return DataLoss("the object is " + N(head.size()) + " bytes, shorter than the " +
                    N(kLogFixedHeaderBytes) + "-byte fixed part of a replica log header");
  }
  const std::string_view magic = head.substr(0, kMagic.size());
  if (magic != kMagic) {
    for (std::string_view old : kOldMagics) {
      if (magic == old) {
        return DataLoss("the object is of the old replica layout (generations as directories), "
                        "not a replica log object");
      }
    }
    return DataLoss("the object does not start with a fleetfs replica log header");
  }
  const auto version = GetLittleEndian<std::uint32_t>(head, kOffVersion);
  if (version != kLogFormatVersion) {
    return DataLoss("the object is in replica log format version " + N(version) +
                    "; this fleetfs reads version " + N(kLogFormatVersion));
  }
  const auto key_len = GetLittleEndian<std::uint32_t>(head, kOffKeyLen);
  if (key_len == 0 || key_len > kMaxLogKeyBytes) {
    return DataLoss("the header declares a key of " + N(key_len) + " bytes; a key is 1 to " +
                    N(kMaxLogKeyBytes) + " bytes");
  }
  return kLogFixedHeaderBytes + key_len + kLogHeaderHashBytes;
}

// The rules a header's fields obey among themselves and for its kind.
Status CheckFields(const LogHeader& h) {
  const std::string kind(LogKindName(h.kind));
  const bool has_owner = h.owner != SnapshotOwner{};
  if (h.seq == 0 && h.prev != 0) {
    return DataLoss("the object is sequence 0 but names a previous object's checksum");
  }
  switch (h.kind) {
    case LogKind::kSnapshot:
      if (h.db_size > kMaxLogDatabaseBytes) {
        return DataLoss("the snapshot declares a database of " + N(h.db_size) +
                        " bytes, above the " + N(kMaxLogDatabaseBytes) + " a snapshot may hold");
      }
      if (h.body_raw_bytes != h.db_size) {
        return DataLoss("the snapshot declares " + N(h.body_raw_bytes) +
                        " uncompressed bytes for a database of " + N(h.db_size));
      }
      if (h.body_bytes > StoredBound(h.body_raw_bytes)) {
        return DataLoss("the snapshot declares " + N(h.body_bytes) + " stored bytes, more than " +
                        N(h.body_raw_bytes) + " bytes ever compress to");
      }
      if (h.commits != 0) return DataLoss("the snapshot declares commits, which only a segment has");
      if (h.first_ms != h.last_ms) return DataLoss("the snapshot declares two times");
      return Status::Ok();
    case LogKind::kSegment:
      if (h.commits == 0) return DataLoss("the segment declares no transactions");
      if (h.body_raw_bytes > kMaxSegmentRawBytes) {
        return DataLoss("the segment declares " + N(h.body_raw_bytes) +
                        " bytes of transactions, above the " + N(kMaxSegmentRawBytes) +
                        " a segment may hold");
      }
      if (h.body_raw_bytes < std::uint64_t{h.commits} * kTxnHeadBytes) {
        return DataLoss("the segment declares " + N(h.commits) + " transactions in " +
                        N(h.body_raw_bytes) + " bytes, too few to hold them");
      }
      if (h.body_bytes > StoredBound(h.body_raw_bytes)) {
        return DataLoss("the segment declares " + N(h.body_bytes) + " stored bytes, more than " +
                        N(h.body_raw_bytes) + " bytes ever compress to");
      }
      if (h.db_size > kMaxLogDatabaseBytes) {
        return DataLoss("the segment declares a database of " + N(h.db_size) +
                        " bytes, above the " + N(kMaxLogDatabaseBytes) + " fleetfs replicates");
      }
      if (has_owner) return DataLoss("the segment declares a file owner, which only a snapshot has");
      return Status::Ok();
    case LogKind::kTombstone:
    case LogKind::kMarker:
      if (h.body_bytes != 0 || h.body_raw_bytes != 0) {
        return DataLoss("the " + kind + " declares a body, which it never has");
      }
      if (h.db_size != 0 || h.commits != 0 || has_owner) {
        return DataLoss("the " + kind + " declares a database size, commits or an owner");
      }
      if (h.first_ms != h.last_ms) return DataLoss("the " + kind + " declares two times");
      return Status::Ok();
  }
  return DataLoss("kind " + N(static_cast<std::uint32_t>(h.kind)) + " is no log object kind");
}

Status CheckExpected(const LogHeader& h, const LogExpectation& e) {
  if (h.key != e.key) {
    return DataLoss("the object belongs to key " + QuotedName(h.key) + ", not " +
                    QuotedName(e.key));
  }
  if (e.seq && h.seq != *e.seq) {
    return DataLoss("the header says sequence " + N(h.seq) + ", but the object is named " +
                    N(*e.seq));
  }
  if (e.max_epoch && h.epoch > *e.max_epoch) {
    return DataLoss("the object claims epoch " + N(h.epoch) +
                    ", above any the ownership store has granted (" + N(*e.max_epoch) + ")");
  }
  if (e.epoch && h.epoch != *e.epoch) {
    return DataLoss("the object is of epoch " + N(h.epoch) + ", not " + N(*e.epoch));
  }
  return Status::Ok();
}

Status CheckPosition(const LogPosition& at) {
  if (at.key.empty() || at.key.size() > kMaxLogKeyBytes) {
    return InvalidArgument("replica log key " + QuotedName(at.key) + " is " + N(at.key.size()) +
                           " bytes; a key is 1 to " + N(kMaxLogKeyBytes) + " bytes");
  }
  if (at.seq == 0 && at.prev != 0) {
    return InvalidArgument("object 0 of replica log " + QuotedName(at.key) +
                           " has no previous object, yet a previous checksum was given");
  }
  return Status::Ok();
}

LogHeader HeaderAt(const LogPosition& at, LogKind kind, WallMs first, WallMs last) {
  LogHeader h;
  h.kind = kind;
  h.epoch = at.epoch;
  h.seq = at.seq;
  h.first_ms = first;
  h.last_ms = last;
  h.prev = at.prev;
  h.key = at.key;
  h.body_hash = kEmptyHash;
  return h;
}

EncodedLogObject Finished(std::string bytes) {
  const std::uint64_t sum = ObjectChecksum(bytes);
  return EncodedLogObject{std::move(bytes), sum};
}

Result<std::vector<TxnView>> ParseTxnViews(std::string_view raw, std::uint32_t commits) {
  // Every count is checked against the bytes left before it is used; nothing
  // is reserved ahead on a count's word: a decoded transaction or page write
  // takes more memory than its bytes, so memory grows only with what parsed.
  std::vector<TxnView> txns;
  std::size_t at = 0;
  auto left = [&] { return raw.size() - at; };
  for (std::uint32_t i = 0; i < commits; ++i) {
    const std::string which = "transaction " + N(i);
    if (left() < kTxnHeadBytes) return DataLoss(which + " is cut short");
    TxnView t;
    t.commit_ms = GetLittleEndian<std::int64_t>(raw, at);
    t.db_size = GetLittleEndian<std::uint64_t>(raw, at + 8);
    const auto nwrites = GetLittleEndian<std::uint32_t>(raw, at + 16);
    at += kTxnHeadBytes;
    if (t.db_size > kMaxLogDatabaseBytes) {
      return DataLoss(which + " leaves a database of " + N(t.db_size) + " bytes, above the " +
                      N(kMaxLogDatabaseBytes) + " fleetfs replicates");
    }
    if (nwrites > left() / kWriteHeadBytes) {
      return DataLoss(which + " declares " + N(nwrites) + " page writes, more than its " +
                      N(left()) + " remaining bytes hold");
    }
    for (std::uint32_t w = 0; w < nwrites; ++w) {
      if (left() < kWriteHeadBytes) return DataLoss(which + " is cut short");
      PageView pw;
      pw.offset = GetLittleEndian<std::uint64_t>(raw, at);
      const auto len = GetLittleEndian<std::uint32_t>(raw, at + 8);
      at += kWriteHeadBytes;
      if (len > left()) return DataLoss(which + " is cut short");
      if (pw.offset > kMaxLogDatabaseBytes - len) {
        return DataLoss(which + " writes at offset " + N(pw.offset) + ", past the " +
                        N(kMaxLogDatabaseBytes) + " bytes fleetfs replicates");
      }
      pw.data = raw.substr(at, len);
      at += len;
      t.writes.push_back(std::move(pw));
    }
    txns.push_back(std::move(t));
  }
  if (at != raw.size()) {
    return DataLoss(N(raw.size() - at) + " bytes follow the last transaction");
  }
  return txns;
}

}  // namespace

std::string_view LogKindName(LogKind kind) {
  switch (kind) {
    case LogKind::kSnapshot: return "snapshot";
    case LogKind::kSegment: return "segment";
    case LogKind::kTombstone: return "tombstone";
    case LogKind::kMarker: return "marker";
  }
  return "unknown";
}

std::uint64_t ObjectChecksum(std::string_view object) {
  return XXH64(object.data(), object.size(), 0);
}

std::string EncodeLogHeader(const LogHeader& h) {
  std::string out(kMagic);
  PutLittleEndian<std::uint32_t>(out, kLogFormatVersion);
  PutLittleEndian<std::uint32_t>(out, static_cast<std::uint32_t>(h.kind));
  PutLittleEndian<std::uint64_t>(out, h.epoch);
  PutLittleEndian<std::uint64_t>(out, h.seq);
  PutLittleEndian<std::int64_t>(out, h.first_ms);
  PutLittleEndian<std::int64_t>(out, h.last_ms);
  PutLittleEndian<std::uint64_t>(out, h.db_size);
  PutLittleEndian<std::uint32_t>(out, h.owner.uid);
  PutLittleEndian<std::uint32_t>(out, h.owner.gid);
  PutLittleEndian<std::uint32_t>(out, h.owner.mode);
  PutLittleEndian<std::uint32_t>(out, h.commits);
  PutLittleEndian<std::uint64_t>(out, h.prev);
  PutLittleEndian<std::uint64_t>(out, h.body_bytes);
  PutLittleEndian<std::uint64_t>(out, h.body_raw_bytes);
  PutLittleEndian<std::uint64_t>(out, h.body_hash);
  PutLittleEndian<std::uint32_t>(out, static_cast<std::uint32_t>(h.key.size()));
  PutLittleEndian<std::uint32_t>(out, 0);
  out += h.key;
  PutLittleEndian<std::uint64_t>(out, XXH64(out.data(), out.size(), 0));
  return out;
}

Result<LogHeader> Summarize(std::string_view head, const LogExpectation& expected) {
  FLEETFS_ASSIGN_OR_RETURN(const std::size_t size, HeaderSizeFromFixed(head));
  if (head.size() < size) {
    return DataLoss("the object is " + N(head.size()) + " bytes, shorter than its " + N(size) +
                    "-byte header");
  }
  const std::size_t hash_at = size - kLogHeaderHashBytes;
  if (XXH64(head.data(), hash_at, 0) != GetLittleEndian<std::uint64_t>(head, hash_at)) {
    return DataLoss("header checksum mismatch");
  }
  // From here every field is as its writer wrote it; what is left is whether
  // the writer followed the rules, and whether it is the object expected.
  LogHeader h;
  const auto kind = GetLittleEndian<std::uint32_t>(head, kOffKind);
  if (kind < static_cast<std::uint32_t>(LogKind::kSnapshot) ||
      kind > static_cast<std::uint32_t>(LogKind::kMarker)) {
    return DataLoss("kind " + N(kind) + " is no log object kind");
  }
  h.kind = static_cast<LogKind>(kind);
  h.epoch = GetLittleEndian<std::uint64_t>(head, kOffEpoch);
  h.seq = GetLittleEndian<std::uint64_t>(head, kOffSeq);
  h.first_ms = GetLittleEndian<std::int64_t>(head, kOffFirst);
  h.last_ms = GetLittleEndian<std::int64_t>(head, kOffLast);
  h.db_size = GetLittleEndian<std::uint64_t>(head, kOffDbSize);
  h.owner.uid = GetLittleEndian<std::uint32_t>(head, kOffUid);
  h.owner.gid = GetLittleEndian<std::uint32_t>(head, kOffGid);
  h.owner.mode = GetLittleEndian<std::uint32_t>(head, kOffMode);
  h.commits = GetLittleEndian<std::uint32_t>(head, kOffCommits);
  h.prev = GetLittleEndian<std::uint64_t>(head, kOffPrev);
  h.body_bytes = GetLittleEndian<std::uint64_t>(head, kOffBodyBytes);
  h.body_raw_bytes = GetLittleEndian<std::uint64_t>(head, kOffBodyRaw);
  h.body_hash = GetLittleEndian<std::uint64_t>(head, kOffBodyHash);
  if (GetLittleEndian<std::uint32_t>(head, kOffZero) != 0) {
    return DataLoss("the header's reserved word is not zero");
  }
  h.key.assign(head.substr(kLogFixedHeaderBytes, size - kLogFixedHeaderBytes - kLogHeaderHashBytes));
  FLEETFS_RETURN_IF_ERROR(CheckFields(h));
  FLEETFS_RETURN_IF_ERROR(CheckExpected(h, expected));
  return h;
}

Status CheckChain(const LogHeader& header, std::uint64_t prev_checksum) {
  if (header.seq == 0) {
    return DataLoss("object 0 begins the log; no object comes before it");
  }
  if (header.prev != prev_checksum) {
    return DataLoss("object " + N(header.seq) + " follows an object with checksum " +
                    N(header.prev) + ", but object " + N(header.seq - 1) + " has checksum " +
                    N(prev_checksum) + " (the chain is broken)");
  }
  return Status::Ok();
}

Result<EncodedLogObject> EncodeLogSegment(const LogPosition& at, const std::vector<Txn>& txns) {
  FLEETFS_RETURN_IF_ERROR(CheckPosition(at));
  const std::string where = "segment " + N(at.seq) + " of replica log " + QuotedName(at.key);
  if (txns.empty()) return InvalidArgument(where + " has no transactions");
  if (txns.size() > kMaxSegmentRawBytes / kTxnHeadBytes) {
    return InvalidArgument(where + " has " + N(txns.size()) + " transactions, too many for one");
  }
  // Sized first, so a segment too large to read back is refused before it is built.
  std::uint64_t raw_size = 0;
  for (const Txn& t : txns) {
    if (t.db_size > kMaxLogDatabaseBytes) {
      return InvalidArgument(where + ": a transaction leaves a database of " + N(t.db_size) +
                             " bytes, above the " + N(kMaxLogDatabaseBytes) + " replicated");
    }
    raw_size += kTxnHeadBytes;
    for (const PageWrite& w : t.writes) {
      if (w.data.size() > kMaxSegmentRawBytes || w.offset > kMaxLogDatabaseBytes - w.data.size()) {
        return InvalidArgument(where + ": a page write at offset " + N(w.offset) + " of " +
                               N(w.data.size()) + " bytes reaches past " +
                               N(kMaxLogDatabaseBytes) + " bytes");
      }
      raw_size += kWriteHeadBytes + w.data.size();
    }
    if (raw_size > kMaxSegmentRawBytes) {
      return InvalidArgument(where + " holds more than the " + N(kMaxSegmentRawBytes) +
                             " bytes of transactions a segment may hold");
    }
  }
  std::string raw;
  raw.reserve(raw_size);
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
  const std::size_t n =
      ZSTD_compress(stored.data(), stored.size(), raw.data(), raw.size(), kZstdLevel);
  if (ZSTD_isError(n)) return Internal(where + ": zstd: " + ZSTD_getErrorName(n));
  stored.resize(n);
  LogHeader h = HeaderAt(at, LogKind::kSegment, txns.front().commit_ms, txns.back().commit_ms);
  h.db_size = txns.back().db_size;
  h.commits = static_cast<std::uint32_t>(txns.size());
  h.body_bytes = stored.size();
  h.body_raw_bytes = raw.size();
  h.body_hash = XXH64(stored.data(), stored.size(), 0);
  return Finished(EncodeLogHeader(h) + stored);
}

Result<EncodedLogObject> EncodeLogTombstone(const LogPosition& at, WallMs deleted_ms) {
  FLEETFS_RETURN_IF_ERROR(CheckPosition(at));
  return Finished(EncodeLogHeader(HeaderAt(at, LogKind::kTombstone, deleted_ms, deleted_ms)));
}

Result<EncodedLogObject> EncodeLogMarker(const LogPosition& at, WallMs written_ms) {
  FLEETFS_RETURN_IF_ERROR(CheckPosition(at));
  return Finished(EncodeLogHeader(HeaderAt(at, LogKind::kMarker, written_ms, written_ms)));
}

Result<DecodedLogObject> DecodeLogObject(std::string_view object, const LogExpectation& expected) {
  FLEETFS_ASSIGN_OR_RETURN(DecodedLogViews views, DecodeLogObjectViews(object, expected));
  DecodedLogObject out;
  out.header = std::move(views.header);
  out.checksum = views.checksum;
  out.txns.reserve(views.txns.size());
  for (const TxnView& v : views.txns) {
    Txn t;
    t.commit_ms = v.commit_ms;
    t.db_size = v.db_size;
    t.writes.reserve(v.writes.size());
    for (const PageView& w : v.writes) t.writes.push_back(PageWrite{w.offset, std::string(w.data)});
    out.txns.push_back(std::move(t));
  }
  return out;
}

Result<DecodedLogViews> DecodeLogObjectViews(std::string_view object,
                                             const LogExpectation& expected) {
  DecodedLogViews out;
  FLEETFS_ASSIGN_OR_RETURN(out.header, Summarize(object, expected));
  const LogHeader& h = out.header;
  if (h.kind == LogKind::kSnapshot) {
    return InvalidArgument("the object is a snapshot, which is read streaming, not whole");
  }
  if (object.size() != h.ObjectBytes()) {
    return DataLoss(object.size() < h.ObjectBytes()
                        ? "truncated: " + N(object.size()) + " of " + N(h.ObjectBytes()) + " bytes"
                        : N(object.size() - h.ObjectBytes()) +
                              " bytes follow the end its header declares");
  }
  const std::string_view stored = object.substr(h.HeaderBytes());
  if (XXH64(stored.data(), stored.size(), 0) != h.body_hash) {
    return DataLoss("body checksum mismatch");
  }
  if (h.kind == LogKind::kSegment) {
    // A checksum proves only that the bytes are as written, not by whom: the
    // declared size was bounded with the header, and must be the frame's own
    // before a byte of memory is reserved for it.
    if (!StartsAsZstdFrame(stored)) return DataLoss("the segment's body is not a zstd frame");
    if (ZSTD_getFrameContentSize(stored.data(), stored.size()) != h.body_raw_bytes ||
        ZSTD_findFrameCompressedSize(stored.data(), stored.size()) != stored.size()) {
      return DataLoss("the segment declares " + N(h.body_raw_bytes) +
                      " bytes of transactions, but its compressed frame says otherwise");
    }
    // Not zeroed first: the decompression writes every byte of it, or fails.
    out.body = std::make_unique_for_overwrite<char[]>(h.body_raw_bytes);
    const std::size_t n =
        ZSTD_decompress(out.body.get(), h.body_raw_bytes, stored.data(), stored.size());
    if (ZSTD_isError(n) || n != h.body_raw_bytes) {
      return DataLoss(std::string("cannot decompress the segment: ") +
                      (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size"));
    }
    FLEETFS_ASSIGN_OR_RETURN(
        out.txns, ParseTxnViews(std::string_view(out.body.get(), h.body_raw_bytes), h.commits));
    if (out.txns.front().commit_ms != h.first_ms || out.txns.back().commit_ms != h.last_ms ||
        out.txns.back().db_size != h.db_size) {
      return DataLoss("the segment's header disagrees with its transactions (times or size)");
    }
  }
  out.checksum = ObjectChecksum(object);
  return out;
}

Result<DecodedLogObject> DecodeLogSegment(std::string_view object, const LogExpectation& expected) {
  FLEETFS_ASSIGN_OR_RETURN(LogHeader h, Summarize(object, expected));
  if (h.kind != LogKind::kSegment) {
    return DataLoss("expected a segment, found a " + std::string(LogKindName(h.kind)));
  }
  return DecodeLogObject(object, expected);
}

Result<std::uint64_t> WriteLogSnapshot(int src_fd, std::uint64_t db_size, const LogPosition& at,
                                       WallMs as_of_ms, SnapshotOwner owner,
                                       const Overlay& overlay, int out_fd) {
  FLEETFS_RETURN_IF_ERROR(CheckPosition(at));
  if (db_size > kMaxLogDatabaseBytes) {
    return InvalidArgument("a snapshot of " + N(db_size) + " bytes is above the " +
                           N(kMaxLogDatabaseBytes) + " a snapshot may hold");
  }
  LogHeader h = HeaderAt(at, LogKind::kSnapshot, as_of_ms, as_of_ms);
  h.db_size = db_size;
  h.body_raw_bytes = db_size;
  h.owner = owner;
  // The header goes first with the body's length and checksum left empty,
  // and is rewritten at the end, when they are known (its size stays).
  std::string header = EncodeLogHeader(h);
  FLEETFS_RETURN_IF_ERROR(PwriteAll(out_fd, header.data(), header.size(), 0));
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(),
                                                                 XXH64_freeState);
  if (!cctx || !hash) return Internal("out of memory for a snapshot's compressor");
  XXH64_reset(hash.get(), 0);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, kZstdLevel);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_windowLog, kZstdWindowLog);
  ZSTD_CCtx_setPledgedSrcSize(cctx.get(), db_size);
  std::vector<char> in(kChunk);
  std::vector<char> out(ZSTD_CStreamOutSize());
  std::uint64_t offset = 0;
  std::uint64_t stored = 0;
  while (true) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, db_size - offset));
    FLEETFS_ASSIGN_OR_RETURN(const std::size_t got, PreadFull(src_fd, in.data(), want, offset));
    std::memset(in.data() + got, 0, want - got);  // pages that exist only in the WAL
    if (overlay && want > 0) overlay(offset, in.data(), want);
    offset += want;
    const bool last = offset >= db_size;
    ZSTD_inBuffer input{in.data(), want, 0};
    bool finished = false;
    while (!finished) {
      ZSTD_outBuffer output{out.data(), out.size(), 0};
      const std::size_t left = ZSTD_compressStream2(cctx.get(), &output, &input,
                                                    last ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(left)) return Internal(std::string("zstd: ") + ZSTD_getErrorName(left));
      XXH64_update(hash.get(), out.data(), output.pos);
      FLEETFS_RETURN_IF_ERROR(PwriteAll(out_fd, out.data(), output.pos, header.size() + stored));
      stored += output.pos;
      finished = last ? left == 0 : input.pos == input.size;
    }
    if (last) break;
  }
  h.body_bytes = stored;
  h.body_hash = XXH64_digest(hash.get());
  if (stored > StoredBound(db_size)) {
    return Internal("a snapshot compressed to " + N(stored) + " bytes, above the bound readers "
                    "hold it to (" + N(StoredBound(db_size)) + ")");
  }
  header = EncodeLogHeader(h);
  FLEETFS_RETURN_IF_ERROR(PwriteAll(out_fd, header.data(), header.size(), 0));
  const std::uint64_t total = h.ObjectBytes();
  if (::ftruncate(out_fd, static_cast<off_t>(total)) != 0) {
    return ErrnoStatus("sizing the snapshot", errno);
  }
  // The chain checksum covers the header, written last: read the object back.
  XXH64_reset(hash.get(), 0);
  for (std::uint64_t done = 0; done < total;) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, total - done));
    FLEETFS_ASSIGN_OR_RETURN(const std::size_t got, PreadFull(out_fd, in.data(), want, done));
    if (got != want) return Internal("the snapshot file shrank while it was written");
    XXH64_update(hash.get(), in.data(), got);
    done += got;
  }
  return static_cast<std::uint64_t>(XXH64_digest(hash.get()));
}

struct LogSnapshotReader::HashState {
  HashState() : body(XXH64_createState()), whole(XXH64_createState()) {
    XXH64_reset(body, 0);
    XXH64_reset(whole, 0);
  }
  ~HashState() {
    XXH64_freeState(body);
    XXH64_freeState(whole);
  }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
  XXH64_state_t* body;   // the stored body, against the header's body checksum
  XXH64_state_t* whole;  // every byte, for the chain checksum
};

LogSnapshotReader::LogSnapshotReader(int out_fd, LogExpectation expected)
    : out_fd_(out_fd),
      expected_(std::move(expected)),
      dctx_(ZSTD_createDCtx()),
      hashes_(std::make_unique<HashState>()) {
  ZSTD_DCtx_setParameter(dctx_.get(), ZSTD_d_windowLogMax, kZstdWindowLog);
}

LogSnapshotReader::~LogSnapshotReader() = default;

Status LogSnapshotReader::Feed(std::string_view bytes) {
  if (!failed_.ok()) return failed_;
  Status st = header_ ? Status::Ok() : FeedHeader(bytes);
  if (st.ok() && header_) st = FeedBody(bytes);
  if (!st.ok()) failed_ = st;
  return st;
}

Status LogSnapshotReader::FeedHeader(std::string_view& bytes) {
  // The fixed part first, whose key length says how much header follows.
  std::size_t want = kLogFixedHeaderBytes;
  if (head_.size() >= kLogFixedHeaderBytes) {
    FLEETFS_ASSIGN_OR_RETURN(want, HeaderSizeFromFixed(head_));
  }
  while (head_.size() < want) {
    const std::size_t take = std::min(bytes.size(), want - head_.size());
    head_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (head_.size() < want) return Status::Ok();  // wait for more
    if (want == kLogFixedHeaderBytes) {
      FLEETFS_ASSIGN_OR_RETURN(want, HeaderSizeFromFixed(head_));
    }
  }
  FLEETFS_ASSIGN_OR_RETURN(LogHeader h, Summarize(head_, expected_));
  if (h.kind != LogKind::kSnapshot) {
    return DataLoss("expected a snapshot, found a " + std::string(LogKindName(h.kind)));
  }
  XXH64_update(hashes_->whole, head_.data(), head_.size());
  out_buf_bytes_ = static_cast<std::size_t>(
      std::clamp(h.body_raw_bytes, kOutBufMinBytes, kOutBufMaxBytes));
  out_buf_ = std::make_unique_for_overwrite<char[]>(out_buf_bytes_);
  header_ = std::move(h);
  head_.clear();
  head_.shrink_to_fit();
  return Status::Ok();
}

Status LogSnapshotReader::FeedBody(std::string_view bytes) {
  if (bytes.empty()) return Status::Ok();
  if (bytes.size() > header_->body_bytes - body_seen_) {
    return DataLoss("the snapshot is longer than the " + N(header_->ObjectBytes()) +
                    " bytes its header declares");
  }
  // The frame's magic, checked byte by byte wherever the pieces are cut.
  for (std::uint64_t i = body_seen_; i < sizeof kZstdMagic && i - body_seen_ < bytes.size(); ++i) {
    if (static_cast<unsigned char>(bytes[i - body_seen_]) != kZstdMagic[i] && body_error_.ok()) {
      body_error_ = DataLoss("the snapshot's body is not a zstd frame");
    }
  }
  body_seen_ += bytes.size();
  XXH64_update(hashes_->body, bytes.data(), bytes.size());
  XXH64_update(hashes_->whole, bytes.data(), bytes.size());
  // A stream that will not decompress is judged at the end, once the body's
  // checksum says whether it was damaged on the way or written so; until
  // then the rest is only hashed.
  if (!body_error_.ok()) return Status::Ok();
  ZSTD_inBuffer input{bytes.data(), bytes.size(), 0};
  bool out_full = false;
  while (input.pos < input.size || out_full) {
    if (frame_ended_) {
      body_error_ = DataLoss("the snapshot holds bytes after the end of its compressed frame");
      return Status::Ok();
    }
    ZSTD_outBuffer output{out_buf_.get(), out_buf_bytes_, 0};
    const std::size_t r = ZSTD_decompressStream(dctx_.get(), &output, &input);
    if (ZSTD_isError(r)) {
      body_error_ = DataLoss(std::string("cannot decompress the snapshot: ") + ZSTD_getErrorName(r));
      return Status::Ok();
    }
    // The bound on what a stream may expand to: the declared size, itself
    // bounded and checksum-covered with the header.
    if (output.pos > header_->body_raw_bytes - written_) {
      body_error_ = DataLoss("the snapshot decompresses to more than the " +
                             N(header_->body_raw_bytes) + " bytes its header declares");
      return Status::Ok();
    }
    FLEETFS_RETURN_IF_ERROR(PwriteAll(out_fd_, out_buf_.get(), output.pos, written_));
    written_ += output.pos;
    if (r == 0) frame_ended_ = true;
    out_full = !frame_ended_ && output.pos == output.size;  // zstd may hold more output
  }
  return Status::Ok();
}

Status LogSnapshotReader::Finish() {
  if (!failed_.ok()) return failed_;
  auto fail = [&](Status st) {
    failed_ = st;
    return st;
  };
  if (!header_) {
    return fail(DataLoss("the object is " + N(head_.size()) + " bytes, shorter than its header"));
  }
  if (body_seen_ != header_->body_bytes) {
    return fail(DataLoss("truncated: " + N(header_->HeaderBytes() + body_seen_) + " of " +
                         N(header_->ObjectBytes()) + " bytes"));
  }
  if (XXH64_digest(hashes_->body) != header_->body_hash) {
    return fail(DataLoss("body checksum mismatch"));
  }
  if (!body_error_.ok()) return fail(body_error_);
  if (!frame_ended_) return fail(DataLoss("the snapshot's compressed stream ends inside its frame"));
  if (written_ != header_->body_raw_bytes) {
    return fail(DataLoss("the snapshot decompresses to " + N(written_) + " bytes, not the " +
                         N(header_->body_raw_bytes) + " its header declares"));
  }
  checksum_ = XXH64_digest(hashes_->whole);
  return Status::Ok();
}

}  // namespace fleetfs::replica
