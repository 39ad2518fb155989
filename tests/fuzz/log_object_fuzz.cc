// Replica log objects as read back from a destination (Summarize,
// DecodeLogObject, LogSnapshotReader): DESIGN section 7 says a corrupt or
// forged object gets a clear error, whatever its checksums, lengths or counts.
//
// Input: one byte of options, then the object, read as of key
// "176/acme.db" (the key of the seed corpus, which
// fleet/replica/log_object_test.cc writes). Option bit 0 forges the body's
// length and checksum to match the bytes after the header and reseals the
// header checksum, as someone who can write the destination could, so every
// field past the checksums is reached. Bit 1 takes the bytes after the header
// as a segment's uncompressed transactions and forges the body around them,
// so the fuzzer reaches the transaction decoding. The high four bits choose
// the pieces a snapshot is fed in.
//
// Properties: nothing crashes; a header that reads encodes back to its bytes
// and reads from the header alone; a decoded object's checksum is the XXH64
// of its bytes, and it encodes back to an object that decodes the same; a
// snapshot read in pieces is accepted exactly when it is read at once, with
// the size its header says.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fleet/replica/log_object.h"
#include "fleet/unique_fd.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace fleetfs::replica;  // NOLINT: the fuzz target's own file

constexpr const char* kKey = "176/acme.db";
constexpr std::size_t kOffBodyBytes = 80, kOffBodyRaw = 88, kOffBodyHash = 96, kOffKeyLen = 104;

void Put64(std::string& s, std::size_t at, std::uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

// The header size the fixed part declares, when it is within bounds.
std::size_t DeclaredHeaderBytes(const std::string& obj) {
  if (obj.size() < kLogFixedHeaderBytes) return 0;
  std::uint32_t key_len;
  std::memcpy(&key_len, obj.data() + kOffKeyLen, 4);
  if (key_len == 0 || key_len > kMaxLogKeyBytes) return 0;
  const std::size_t size = kLogFixedHeaderBytes + key_len + kLogHeaderHashBytes;
  return obj.size() >= size ? size : 0;
}

void Reseal(std::string& obj, std::size_t header) {
  const std::string_view body = std::string_view(obj).substr(header);
  Put64(obj, kOffBodyBytes, body.size());
  Put64(obj, kOffBodyHash, XXH64(body.data(), body.size(), 0));
  const std::size_t at = header - kLogHeaderHashBytes;
  Put64(obj, at, XXH64(obj.data(), at, 0));
}

bool SameTxns(const std::vector<Txn>& a, const std::vector<Txn>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].commit_ms != b[i].commit_ms || a[i].db_size != b[i].db_size ||
        a[i].writes.size() != b[i].writes.size()) {
      return false;
    }
    for (std::size_t w = 0; w < a[i].writes.size(); ++w) {
      if (a[i].writes[w].offset != b[i].writes[w].offset ||
          a[i].writes[w].data != b[i].writes[w].data) {
        return false;
      }
    }
  }
  return true;
}

struct SnapshotRead {
  fleetfs::Status status;
  std::uint64_t written = 0;
  std::uint64_t checksum = 0;
  std::optional<LogHeader> header;
};

SnapshotRead ReadSnapshot(int out_fd, const std::string& object, const LogExpectation& expected,
                          std::size_t piece) {
  LogSnapshotReader reader(out_fd, expected);
  SnapshotRead r;
  for (std::size_t at = 0; at < object.size() && r.status.ok(); at += piece) {
    r.status = reader.Feed(std::string_view(object).substr(at, piece));
  }
  if (r.status.ok()) r.status = reader.Finish();
  r.written = reader.written();
  r.checksum = reader.checksum();
  r.header = reader.header();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t options = data[0];
  std::string object(reinterpret_cast<const char*>(data + 1), size - 1);

  if (const std::size_t header = DeclaredHeaderBytes(object); header > 0) {
    if (options & 2) {
      const std::string raw = object.substr(header);
      std::string stored(ZSTD_compressBound(raw.size()), '\0');
      const std::size_t n = ZSTD_compress(stored.data(), stored.size(), raw.data(), raw.size(), 1);
      FUZZ_CHECK(!ZSTD_isError(n), "zstd");
      stored.resize(n);
      object.resize(header);
      object += stored;
      Put64(object, kOffBodyRaw, raw.size());
      Reseal(object, header);
    } else if (options & 1) {
      Reseal(object, header);
    }
  }

  const LogExpectation expected{kKey, std::nullopt, std::nullopt, std::uint64_t{1} << 32};

  auto summary = Summarize(object, expected);
  if (summary.ok()) {
    const LogHeader& h = *summary;
    FUZZ_CHECK(EncodeLogHeader(h) == object.substr(0, h.HeaderBytes()),
               "a header that reads does not encode back to its bytes");
    auto alone = Summarize(object.substr(0, h.HeaderBytes()), expected);
    FUZZ_CHECK(alone.ok() && *alone == h, "the header alone reads otherwise");
    FUZZ_CHECK(Summarize(object, LogExpectation{kKey, h.seq, h.epoch, h.epoch}).ok(),
               "a header refused when its own sequence and epoch are expected");
    FUZZ_CHECK(!Summarize(object, LogExpectation{kKey, h.seq + 1, std::nullopt, std::nullopt}).ok(),
               "a header accepted under another sequence's name");
  } else {
    FUZZ_CHECK(!summary.status().message().empty(), "a refusal that does not say why");
  }

  auto decoded = DecodeLogObject(object, expected);
  if (decoded.ok()) {
    const LogHeader& h = decoded->header;
    FUZZ_CHECK(summary.ok() && *summary == h, "decoded and summarised headers differ");
    FUZZ_CHECK(h.kind != LogKind::kSnapshot, "a snapshot decoded whole");
    FUZZ_CHECK(decoded->checksum == XXH64(object.data(), object.size(), 0),
               "a chain checksum that is not the XXH64 of the object");
    const LogPosition at{h.key, h.epoch, h.seq, h.prev};
    if (h.kind == LogKind::kSegment) {
      FUZZ_CHECK(decoded->txns.size() == h.commits, "a segment with another count than its header");
      auto again = EncodeLogSegment(at, decoded->txns);
      FUZZ_CHECK(again.ok(), "a decoded segment the writer refuses");
      auto back = DecodeLogSegment(again->bytes, expected);
      FUZZ_CHECK(back.ok() && SameTxns(back->txns, decoded->txns),
                 "a segment does not encode back to its transactions");
      LogHeader a = back->header, b = h;
      a.body_bytes = b.body_bytes = a.body_hash = b.body_hash = 0;  // zstd may compress otherwise
      FUZZ_CHECK(a == b, "a segment encodes back to another header");
    } else {
      auto again = h.kind == LogKind::kMarker ? EncodeLogMarker(at, h.first_ms)
                                              : EncodeLogTombstone(at, h.first_ms);
      FUZZ_CHECK(again.ok() && again->bytes == object, "a marker or tombstone encodes otherwise");
    }
  } else {
    FUZZ_CHECK(!decoded.status().message().empty(), "a refusal that does not say why");
  }

  // As a restore reads a snapshot: in pieces, to a file; and at once.
  fleetfs::UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  FUZZ_CHECK(out.get() >= 0, "/dev/null");
  const std::size_t hi = options >> 4;
  const std::size_t piece = hi == 0 ? 1 : hi * hi * 16;
  const SnapshotRead pieces = ReadSnapshot(out.get(), object, expected, piece);
  const SnapshotRead whole = ReadSnapshot(out.get(), object, expected, object.size() + 1);
  // The same verdict, not always the same words: on a forged frame zstd's
  // one-pass path (the whole frame at hand) and its streaming path can name
  // different faults.
  if (pieces.status.ok() != whole.status.ok()) {
    std::fprintf(stderr, "in pieces of %zu: %s\nat once: %s\n", piece,
                 pieces.status.message().c_str(), whole.status.message().c_str());
  }
  FUZZ_CHECK(pieces.status.code() == whole.status.code(),
             "a snapshot read in pieces ends otherwise than read at once");
  if (whole.status.ok()) {
    FUZZ_CHECK(whole.header && summary.ok() && *whole.header == *summary,
               "a snapshot's header reads otherwise streaming");
    FUZZ_CHECK(whole.written == whole.header->db_size && pieces.written == whole.written,
               "a snapshot read to its end with another size than its header");
    FUZZ_CHECK(whole.checksum == XXH64(object.data(), object.size(), 0) &&
                   pieces.checksum == whole.checksum,
               "a snapshot's chain checksum is not the XXH64 of the object");
  } else {
    FUZZ_CHECK(!whole.status.message().empty(), "a refusal that does not say why");
  }
  return 0;
}
