// Replica objects as read back from a destination (Summarize, DecodeSegment,
// SnapshotReader): DESIGN section 7 says a corrupt or forged object gets a
// clear error, whatever its checksums, lengths or counts.
//
// Input: one byte of options, then the object. Option bit 0 forges a
// segment's stored length and checksum to match the bytes after its header,
// as someone who can write the destination could. Bit 1 takes the bytes
// after the 56-byte header as a segment's uncompressed payload and forges a
// whole valid header around it (magic, lengths, checksum), so the fuzzer
// reaches the transaction decoding. Otherwise the bytes are read as given.
//
// Properties: nothing throws or crashes; a decoded segment encodes back to
// the same transactions and has the count its header says; a snapshot that
// reads to its end has the size its header says.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "fleet/replica_object.h"
#include "fleet/unique_fd.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace fleetfs::replica;  // NOLINT: the fuzz target's own file

void Put64(std::string& s, std::size_t at, std::uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t options = data[0];
  std::string object(reinterpret_cast<const char*>(data + 1), size - 1);

  if ((options & 2) && object.size() >= kObjectHeaderBytes) {
    const std::string raw = object.substr(kObjectHeaderBytes);
    std::string stored(ZSTD_compressBound(raw.size()), '\0');
    std::size_t n = ZSTD_compress(stored.data(), stored.size(), raw.data(), raw.size(), 1);
    FUZZ_CHECK(!ZSTD_isError(n), "zstd");
    stored.resize(n);
    object = EncodeSegment({}).substr(0, 8) + object.substr(8, 24);  // magic, count, times
    object.resize(kObjectHeaderBytes);
    Put64(object, 32, raw.size());
    Put64(object, 40, stored.size());
    Put64(object, 48, XXH64(stored.data(), stored.size(), 0));
    object += stored;
  } else if ((options & 1) && object.size() >= kObjectHeaderBytes) {
    const std::string_view stored = std::string_view(object).substr(kObjectHeaderBytes);
    const std::uint64_t hash = XXH64(stored.data(), stored.size(), 0);
    Put64(object, 40, stored.size());
    Put64(object, 48, hash);
  }

  auto summary = Summarize(object);
  auto txns = DecodeSegment(object);
  if (txns.ok()) {
    FUZZ_CHECK(summary.ok() && summary->kind == ObjectKind::kSegment, "a segment's summary");
    FUZZ_CHECK(summary->commits == txns->size(), "a segment with another count than its header");
    auto again = DecodeSegment(EncodeSegment(*txns));
    FUZZ_CHECK(again.ok() && SameTxns(*again, *txns), "a segment does not encode back");
  } else {
    FUZZ_CHECK(!txns.status().message().empty(), "a refusal that does not say why");
  }

  // As a restore reads a snapshot: in pieces, to a file.
  fleetfs::UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  FUZZ_CHECK(out.get() >= 0, "/dev/null");
  SnapshotReader reader(out.get());
  fleetfs::Status fed = fleetfs::Status::Ok();
  for (std::size_t at = 0; at < object.size() && fed.ok(); at += 1000) {
    fed = reader.Feed(std::string_view(object).substr(at, 1000));
  }
  if (fed.ok() && reader.Finish().ok()) {
    FUZZ_CHECK(reader.written() == reader.summary().db_size,
               "a snapshot read to its end with another size than its header");
  }
  return 0;
}
