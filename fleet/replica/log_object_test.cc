#include "fleet/replica/log_object.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKey = "176/acme.db";
constexpr std::uint64_t kEpoch = 3;

// Offsets of the header table in log_object.h, for forging.
constexpr std::size_t kOffVersion = 8, kOffKind = 12, kOffEpoch = 16, kOffSeq = 24,
                      kOffDbSize = 48, kOffCommits = 68, kOffPrev = 72, kOffBodyBytes = 80,
                      kOffBodyRaw = 88, kOffBodyHash = 96, kOffKeyLen = 104, kOffZero = 108;

LogPosition At(std::uint64_t seq, std::uint64_t prev = 0) { return {kKey, kEpoch, seq, prev}; }
LogExpectation Expect(std::optional<std::uint64_t> seq = std::nullopt) {
  return {kKey, seq, kEpoch, 10};
}

template <typename T>
void Set(std::string& s, std::size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}
template <typename T>
T Read(const std::string& s, std::size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

std::size_t HeaderSize(const std::string& obj) {
  return kLogFixedHeaderBytes + Read<std::uint32_t>(obj, kOffKeyLen) + kLogHeaderHashBytes;
}
// Recomputes the header checksum after a test changed header bytes, as a
// forger who can write the destination would.
void ResealHeader(std::string& obj) {
  const std::size_t at = HeaderSize(obj) - kLogHeaderHashBytes;
  Set<std::uint64_t>(obj, at, XXH64(obj.data(), at, 0));
}
// Makes the header's body length and checksum match whatever body follows.
void ResealBody(std::string& obj) {
  const std::size_t h = HeaderSize(obj);
  Set<std::uint64_t>(obj, kOffBodyBytes, obj.size() - h);
  Set<std::uint64_t>(obj, kOffBodyHash, XXH64(obj.data() + h, obj.size() - h, 0));
  ResealHeader(obj);
}

std::string Compress(const std::string& raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  const std::size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 1);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::vector<Txn> SampleTxns() {
  return {Txn{1000, 8192, {PageWrite{0, std::string(4096, 'a')}, PageWrite{4096, "tail"}}},
          Txn{1005, 12288, {PageWrite{8192, std::string(4096, 'b')}}}};
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

std::string RandomBytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Segment(std::uint64_t seq = 1, std::uint64_t prev = 77) {
  auto s = EncodeLogSegment(At(seq, prev), SampleTxns());
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s->bytes;
}

// A segment body's raw encoding, written out by hand from the format.
std::string RawTxn(WallMs at, std::uint64_t size, std::uint32_t nwrites) {
  std::string raw(20, '\0');
  Set<std::int64_t>(raw, 0, at);
  Set<std::uint64_t>(raw, 8, size);
  Set<std::uint32_t>(raw, 16, nwrites);
  return raw;
}
std::string RawWrite(std::uint64_t offset, std::uint32_t len, std::string_view data) {
  std::string raw(12, '\0');
  Set<std::uint64_t>(raw, 0, offset);
  Set<std::uint32_t>(raw, 8, len);
  return raw + std::string(data);
}
// A one-transaction segment around `raw`, its header sealed to match.
std::string ForgedSegment(const std::string& raw, WallMs at, std::uint64_t size) {
  LogHeader h;
  h.kind = LogKind::kSegment;
  h.epoch = kEpoch;
  h.seq = 1;
  h.first_ms = h.last_ms = at;
  h.db_size = size;
  h.commits = 1;
  h.key = kKey;
  const std::string stored = Compress(raw);
  h.body_bytes = stored.size();
  h.body_raw_bytes = raw.size();
  h.body_hash = XXH64(stored.data(), stored.size(), 0);
  return EncodeLogHeader(h) + stored;
}

void ExpectDataLoss(const Status& st, std::string_view words) {
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.message();
  EXPECT_NE(st.message().find(words), std::string::npos)
      << "'" << st.message() << "' does not say '" << words << "'";
}

class LogObject : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleetfs-log-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  UniqueFd Open(const std::string& name, int flags) {
    return UniqueFd(::open((dir_ / name).c_str(), flags | O_CLOEXEC, 0600));
  }
  std::string Slurp(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  struct Snapshot {
    std::string bytes;
    std::uint64_t checksum = 0;
  };
  // A snapshot of `db` (read as a file of `db_size` bytes) at `at`.
  Snapshot MakeSnapshot(const std::string& db, LogPosition at = At(0),
                        std::optional<std::uint64_t> db_size = std::nullopt,
                        const Overlay& overlay = nullptr) {
    std::ofstream(dir_ / "src", std::ios::binary | std::ios::trunc) << db;
    UniqueFd src = Open("src", O_RDONLY);
    UniqueFd out = Open("snap", O_RDWR | O_CREAT | O_TRUNC);
    auto sum = WriteLogSnapshot(src.get(), db_size.value_or(db.size()), at, 5000,
                                SnapshotOwner{1001, 1002, 0640}, overlay, out.get());
    EXPECT_TRUE(sum.ok()) << sum.status().message();
    return {Slurp("snap"), sum.ok() ? *sum : 0};
  }

  struct Restored {
    Status status;
    std::string db;
    std::uint64_t checksum = 0;
    std::optional<LogHeader> header;
  };
  // Reads `object` through a LogSnapshotReader in pieces of `piece` bytes.
  Restored ReadSnapshot(const std::string& object, const LogExpectation& expected,
                        std::size_t piece = 4096) {
    UniqueFd out = Open("restored", O_RDWR | O_CREAT | O_TRUNC);
    LogSnapshotReader reader(out.get(), expected);
    Restored r;
    for (std::size_t at = 0; at < object.size() && r.status.ok(); at += piece) {
      r.status = reader.Feed(std::string_view(object).substr(at, piece));
    }
    if (r.status.ok()) r.status = reader.Finish();
    r.db = Slurp("restored");
    r.checksum = reader.checksum();
    r.header = reader.header();
    EXPECT_EQ(reader.written(), r.db.size());
    return r;
  }

  fs::path dir_;
};

// ---- round trips ----

TEST_F(LogObject, a_segment_round_trips_with_its_header_and_chain_checksum) {
  auto enc = EncodeLogSegment(At(4, 1234), SampleTxns());
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  EXPECT_EQ(enc->checksum, XXH64(enc->bytes.data(), enc->bytes.size(), 0));
  EXPECT_EQ(enc->checksum, ObjectChecksum(enc->bytes));
  auto dec = DecodeLogSegment(enc->bytes, Expect(4));
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  EXPECT_TRUE(SameTxns(dec->txns, SampleTxns()));
  EXPECT_EQ(dec->checksum, enc->checksum);
  const LogHeader& h = dec->header;
  EXPECT_EQ(h.kind, LogKind::kSegment);
  EXPECT_EQ(h.key, kKey);
  EXPECT_EQ(h.epoch, kEpoch);
  EXPECT_EQ(h.seq, 4u);
  EXPECT_EQ(h.prev, 1234u);
  EXPECT_EQ(h.first_ms, 1000);
  EXPECT_EQ(h.last_ms, 1005);
  EXPECT_EQ(h.db_size, 12288u);
  EXPECT_EQ(h.commits, 2u);
  EXPECT_EQ(h.ObjectBytes(), enc->bytes.size());
}

TEST_F(LogObject, a_tombstone_round_trips_as_a_header_alone) {
  auto enc = EncodeLogTombstone(At(9, 55), 7000);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->bytes.size(), kLogFixedHeaderBytes + std::strlen(kKey) + kLogHeaderHashBytes);
  auto dec = DecodeLogObject(enc->bytes, Expect(9));
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  EXPECT_EQ(dec->header.kind, LogKind::kTombstone);
  EXPECT_EQ(dec->header.first_ms, 7000);
  EXPECT_EQ(dec->header.last_ms, 7000);
  EXPECT_EQ(dec->header.prev, 55u);
  EXPECT_TRUE(dec->txns.empty());
  EXPECT_EQ(dec->checksum, XXH64(enc->bytes.data(), enc->bytes.size(), 0));
}

TEST_F(LogObject, a_marker_round_trips_with_its_epoch_and_write_time) {
  LogPosition at{kKey, 8, 12, 99};
  auto enc = EncodeLogMarker(at, 8000);
  ASSERT_TRUE(enc.ok());
  auto dec = DecodeLogObject(enc->bytes, LogExpectation{kKey, 12, 8, 8});
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  EXPECT_EQ(dec->header.kind, LogKind::kMarker);
  EXPECT_EQ(dec->header.epoch, 8u);
  EXPECT_EQ(dec->header.first_ms, 8000);
  EXPECT_EQ(dec->checksum, enc->checksum);
}

TEST_F(LogObject, a_snapshot_round_trips_in_pieces_of_any_size) {
  // Incompressible and compressible halves, larger than one read chunk.
  const std::string db = RandomBytes(700 << 10, 1) + std::string(700 << 10, 'x');
  Snapshot snap = MakeSnapshot(db);
  EXPECT_EQ(snap.checksum, XXH64(snap.bytes.data(), snap.bytes.size(), 0));
  for (std::size_t piece : {std::size_t{4096}, std::size_t{100'003}, snap.bytes.size()}) {
    Restored r = ReadSnapshot(snap.bytes, Expect(0), piece);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_TRUE(r.db == db) << "piece " << piece;
    EXPECT_EQ(r.checksum, snap.checksum);
    ASSERT_TRUE(r.header);
    EXPECT_EQ(r.header->kind, LogKind::kSnapshot);
    EXPECT_EQ(r.header->db_size, db.size());
    EXPECT_EQ(r.header->first_ms, 5000);
    EXPECT_EQ(r.header->owner.uid, 1001u);
    EXPECT_EQ(r.header->owner.gid, 1002u);
    EXPECT_EQ(r.header->owner.mode, 0640u);
  }
}

TEST_F(LogObject, a_small_snapshot_reads_back_one_byte_at_a_time) {
  const std::string db = RandomBytes(5000, 2);
  Snapshot snap = MakeSnapshot(db);
  Restored r = ReadSnapshot(snap.bytes, Expect(0), 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.db == db);
  EXPECT_EQ(r.checksum, snap.checksum);
}

TEST_F(LogObject, an_empty_database_snapshots_and_restores_empty) {
  Snapshot snap = MakeSnapshot("");
  Restored r = ReadSnapshot(snap.bytes, Expect(0));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.db.empty());
}

TEST_F(LogObject, a_snapshot_takes_pages_from_the_overlay_and_zeros_past_the_file) {
  const std::string db(8192, 'm');
  Snapshot snap = MakeSnapshot(db, At(0), 12288, [](std::uint64_t offset, char* buf, std::size_t n) {
    for (std::uint64_t p = 4096; p < 8192; ++p) {
      if (p >= offset && p < offset + n) buf[p - offset] = 'w';  // page 2 is newer in the WAL
    }
  });
  Restored r = ReadSnapshot(snap.bytes, Expect(0));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.db == std::string(4096, 'm') + std::string(4096, 'w') + std::string(4096, '\0'));
}

TEST_F(LogObject, the_header_alone_summarises_any_object) {
  Snapshot snap = MakeSnapshot(RandomBytes(3000, 3));
  for (const std::string& obj : {snap.bytes, Segment(), EncodeLogMarker(At(2, 1), 9)->bytes}) {
    auto full = Summarize(obj, Expect());
    ASSERT_TRUE(full.ok()) << full.status().message();
    auto head = Summarize(obj.substr(0, full->HeaderBytes()), Expect());
    ASSERT_TRUE(head.ok()) << head.status().message();
    EXPECT_EQ(*head, *full);
    auto capped = Summarize(obj.substr(0, kMaxLogHeaderBytes), Expect());
    ASSERT_TRUE(capped.ok());
    EXPECT_EQ(*capped, *full);
    ExpectDataLoss(Summarize(obj.substr(0, full->HeaderBytes() - 1), Expect()).status(),
                   "shorter than its");
    ExpectDataLoss(Summarize(obj.substr(0, 50), Expect()).status(), "fixed part");
  }
}

// ---- the chain ----

TEST_F(LogObject, each_objects_prev_is_the_checksum_its_writer_returned_for_the_one_before) {
  Snapshot snap = MakeSnapshot(RandomBytes(9000, 4), At(0));
  auto seg = EncodeLogSegment(At(1, snap.checksum), SampleTxns());
  ASSERT_TRUE(seg.ok());
  auto marker = EncodeLogMarker(LogPosition{kKey, kEpoch + 1, 2, seg->checksum}, 6000);
  ASSERT_TRUE(marker.ok());

  Restored r = ReadSnapshot(snap.bytes, Expect(0));
  ASSERT_TRUE(r.status.ok());
  auto s = DecodeLogObject(seg->bytes, Expect(1));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(CheckChain(s->header, r.checksum).ok());
  auto m = DecodeLogObject(marker->bytes, LogExpectation{kKey, 2, std::nullopt, 10});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(CheckChain(m->header, s->checksum).ok());
}

TEST_F(LogObject, an_object_that_follows_another_object_breaks_the_chain) {
  auto seg = EncodeLogSegment(At(1, 1111), SampleTxns());
  ASSERT_TRUE(seg.ok());
  auto dec = DecodeLogObject(seg->bytes, Expect(1));
  ASSERT_TRUE(dec.ok());
  ExpectDataLoss(CheckChain(dec->header, 2222), "chain is broken");
}

TEST_F(LogObject, object_zero_follows_nothing) {
  auto dec = DecodeLogObject(EncodeLogMarker(At(0), 1)->bytes, Expect(0));
  ASSERT_TRUE(dec.ok());
  ExpectDataLoss(CheckChain(dec->header, 0), "begins the log");
}

TEST_F(LogObject, object_zero_with_a_previous_checksum_is_refused) {
  std::string obj = EncodeLogMarker(At(0), 1)->bytes;
  Set<std::uint64_t>(obj, kOffPrev, 42);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "sequence 0");
}

// ---- what the caller expects ----

TEST_F(LogObject, an_object_of_another_key_is_refused) {
  auto enc = EncodeLogSegment(LogPosition{"176/other.db", kEpoch, 1, 0}, SampleTxns());
  ASSERT_TRUE(enc.ok());
  ExpectDataLoss(DecodeLogSegment(enc->bytes, Expect(1)).status(),
                 "belongs to key '176/other.db', not '176/acme.db'");
  // A key that only starts like the expected one is another key too.
  enc = EncodeLogSegment(LogPosition{"176/acme.db2", kEpoch, 1, 0}, SampleTxns());
  ExpectDataLoss(DecodeLogSegment(enc->bytes, Expect(1)).status(), "belongs to key");
}

TEST_F(LogObject, a_sequence_other_than_the_name_is_refused) {
  ExpectDataLoss(DecodeLogSegment(Segment(5), Expect(6)).status(),
                 "header says sequence 5, but the object is named 6");
  Snapshot snap = MakeSnapshot("abc", At(3, 9));
  Restored r = ReadSnapshot(snap.bytes, Expect(4));
  ExpectDataLoss(r.status, "header says sequence 3");
  EXPECT_TRUE(r.db.empty());
}

TEST_F(LogObject, an_epoch_above_any_granted_is_corruption_not_a_fence) {
  auto enc = EncodeLogMarker(LogPosition{kKey, 1ull << 60, 1, 0}, 1);
  ASSERT_TRUE(enc.ok());
  ExpectDataLoss(Summarize(enc->bytes, LogExpectation{kKey, 1, std::nullopt, 10}).status(),
                 "above any the ownership store has granted (10)");
}

TEST_F(LogObject, an_epoch_other_than_the_expected_one_is_refused) {
  ExpectDataLoss(Summarize(Segment(), LogExpectation{kKey, 1, 4, std::nullopt}).status(),
                 "epoch 3, not 4");
}

// ---- damage ----

TEST_F(LogObject, every_flipped_header_byte_is_refused) {
  const std::string good = Segment();
  const std::size_t header = HeaderSize(good);
  for (std::size_t i = 0; i < header; ++i) {
    std::string bad = good;
    bad[i] ^= 0x01;
    auto st = Summarize(bad, Expect(1)).status();
    EXPECT_EQ(st.code(), Code::kDataLoss) << "byte " << i;
    if (i < 8) {
      EXPECT_NE(st.message().find("does not start"), std::string::npos) << st.message();
    } else if (i < 12) {
      EXPECT_NE(st.message().find("format version"), std::string::npos) << st.message();
    } else if (i < kOffKeyLen || i >= kOffKeyLen + 4) {
      EXPECT_EQ(st.message(), "header checksum mismatch") << "byte " << i;
    }
    EXPECT_FALSE(DecodeLogSegment(bad, Expect(1)).ok()) << "byte " << i;
  }
}

TEST_F(LogObject, every_flipped_segment_body_byte_fails_the_body_checksum) {
  const std::string good = Segment();
  for (std::size_t i = HeaderSize(good); i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x40;
    auto st = DecodeLogSegment(bad, Expect(1)).status();
    EXPECT_EQ(st.code(), Code::kDataLoss);
    EXPECT_EQ(st.message(), "body checksum mismatch") << "byte " << i;
  }
}

TEST_F(LogObject, a_flipped_snapshot_body_byte_fails_the_body_checksum) {
  Snapshot snap = MakeSnapshot(RandomBytes(20000, 5) + std::string(20000, 'z'));
  const std::size_t header = HeaderSize(snap.bytes);
  for (std::size_t i = header; i < snap.bytes.size(); i += 997) {
    std::string bad = snap.bytes;
    bad[i] ^= 0x10;
    Restored r = ReadSnapshot(bad, Expect(0));
    EXPECT_EQ(r.status.code(), Code::kDataLoss);
    EXPECT_EQ(r.status.message(), "body checksum mismatch") << "byte " << i;
  }
}

TEST_F(LogObject, a_flipped_snapshot_header_byte_is_refused_before_a_byte_is_written) {
  Snapshot snap = MakeSnapshot(RandomBytes(3000, 6));
  std::string bad = snap.bytes;
  bad[kOffDbSize] ^= 0x01;
  Restored r = ReadSnapshot(bad, Expect(0));
  ExpectDataLoss(r.status, "header checksum mismatch");
  EXPECT_TRUE(r.db.empty());
}

TEST_F(LogObject, every_truncation_of_a_segment_or_tombstone_is_refused) {
  for (const std::string& good : {Segment(), EncodeLogTombstone(At(1, 5), 2)->bytes}) {
    const std::size_t header = HeaderSize(good);
    for (std::size_t n = 0; n < good.size(); ++n) {
      auto st = DecodeLogObject(good.substr(0, n), Expect(1)).status();
      EXPECT_EQ(st.code(), Code::kDataLoss) << n;
      if (n >= header) {
        EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
      }
    }
  }
}

TEST_F(LogObject, a_truncated_snapshot_is_refused_at_the_end) {
  Snapshot snap = MakeSnapshot(RandomBytes(30000, 7));
  const std::size_t header = HeaderSize(snap.bytes);
  for (std::size_t n : {std::size_t{0}, std::size_t{100}, header - 1, header, header + 1,
                        snap.bytes.size() / 2, snap.bytes.size() - 1}) {
    Restored r = ReadSnapshot(snap.bytes.substr(0, n), Expect(0));
    EXPECT_EQ(r.status.code(), Code::kDataLoss) << n;
    if (n >= header) {
      EXPECT_NE(r.status.message().find("truncated"), std::string::npos) << n;
    } else {
      EXPECT_NE(r.status.message().find("shorter than"), std::string::npos) << n;
    }
  }
}

TEST_F(LogObject, bytes_after_an_objects_declared_end_are_refused) {
  ExpectDataLoss(DecodeLogSegment(Segment() + "x", Expect(1)).status(),
                 "1 bytes follow the end its header declares");
  Snapshot snap = MakeSnapshot("abc");
  ExpectDataLoss(ReadSnapshot(snap.bytes + "x", Expect(0)).status, "longer than");
}

TEST_F(LogObject, an_object_of_the_old_layout_is_named_as_such) {
  std::string old = EncodeSegment(SampleTxns());  // fleet/replica_object.h
  old.resize(std::max(old.size(), kLogFixedHeaderBytes));
  ExpectDataLoss(Summarize(old, Expect()).status(), "old replica layout");
  ExpectDataLoss(Summarize(std::string(200, 'q'), Expect()).status(),
                 "does not start with a fleetfs replica log header");
}

TEST_F(LogObject, another_format_version_is_refused_with_its_number) {
  std::string obj = Segment();
  Set<std::uint32_t>(obj, kOffVersion, 2);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "format version 2; this fleetfs reads version 1");
}

// ---- forged lengths and fields (checksums resealed to match) ----

TEST_F(LogObject, a_key_length_out_of_bounds_is_refused_before_it_is_read) {
  std::string obj = Segment();
  Set<std::uint32_t>(obj, kOffKeyLen, 2000);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "declares a key of 2000 bytes");
  Set<std::uint32_t>(obj, kOffKeyLen, 0);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "declares a key of 0 bytes");
  Set<std::uint32_t>(obj, kOffKeyLen, 0xffffffffu);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "declares a key of 4294967295 bytes");
}

TEST_F(LogObject, a_segment_declaring_more_than_a_segment_may_hold_is_refused) {
  std::string obj = Segment();
  Set<std::uint64_t>(obj, kOffBodyRaw, kMaxSegmentRawBytes + 1);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "above the 1073741824 a segment may hold");
}

TEST_F(LogObject, a_snapshot_declaring_more_than_a_database_may_hold_is_refused) {
  Snapshot snap = MakeSnapshot("abc");
  std::string obj = snap.bytes;
  Set<std::uint64_t>(obj, kOffDbSize, kMaxLogDatabaseBytes + 1);
  Set<std::uint64_t>(obj, kOffBodyRaw, kMaxLogDatabaseBytes + 1);
  ResealHeader(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0)).status, "above the 1099511627776 a snapshot may hold");
}

TEST_F(LogObject, a_stored_length_above_what_the_raw_size_compresses_to_is_refused) {
  std::string obj = Segment();
  Set<std::uint64_t>(obj, kOffBodyBytes, 1ull << 50);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "ever compress to");
}

TEST_F(LogObject, a_commit_count_the_raw_size_cannot_hold_is_refused) {
  std::string obj = Segment();
  Set<std::uint32_t>(obj, kOffCommits, 0xffffffffu);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "too few to hold them");
}

TEST_F(LogObject, a_zstd_bomb_in_a_segment_is_refused_before_it_is_decompressed) {
  // 64 MiB of zeros in a few kilobytes: more stored bytes than 100 declared
  // bytes ever compress to, and another size than 1 MiB declared.
  const std::string good = Segment();
  const std::string bomb = Compress(std::string(64 << 20, '\0'));
  std::string obj = good.substr(0, HeaderSize(good)) + bomb;
  Set<std::uint64_t>(obj, kOffBodyRaw, 100);
  ResealBody(obj);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "more than 100 bytes ever compress to");
  Set<std::uint64_t>(obj, kOffBodyRaw, 1 << 20);
  ResealBody(obj);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "its compressed frame says otherwise");
}

TEST_F(LogObject, a_snapshot_that_decompresses_beyond_its_declared_size_stops_there) {
  Snapshot snap = MakeSnapshot(std::string(4096, 'd'));
  const std::size_t header = HeaderSize(snap.bytes);
  // 64 MiB of zeros in a frame without a content size, declared as 4096 bytes.
  std::string bomb(ZSTD_compressBound(64 << 20), '\0');
  {
    std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> c(ZSTD_createCCtx(), ZSTD_freeCCtx);
    ZSTD_CCtx_setParameter(c.get(), ZSTD_c_contentSizeFlag, 0);
    ZSTD_CCtx_setParameter(c.get(), ZSTD_c_windowLog, 20);
    const std::string zeros(64 << 20, '\0');
    const std::size_t n = ZSTD_compress2(c.get(), bomb.data(), bomb.size(), zeros.data(), zeros.size());
    ASSERT_FALSE(ZSTD_isError(n));
    bomb.resize(n);
  }
  std::string obj = snap.bytes.substr(0, header) + bomb;
  ResealBody(obj);
  Restored r = ReadSnapshot(obj, Expect(0));
  ExpectDataLoss(r.status, "decompresses to more than the 4096 bytes its header declares");
  EXPECT_LE(r.db.size(), 4096u);
}

TEST_F(LogObject, a_snapshot_that_decompresses_short_of_its_declared_size_is_refused) {
  Snapshot snap = MakeSnapshot(std::string(4096, 'd'));
  std::string obj = snap.bytes.substr(0, HeaderSize(snap.bytes)) + Compress(std::string(100, 'd'));
  ResealBody(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0)).status,
                 "decompresses to 100 bytes, not the 4096 its header declares");
}

TEST_F(LogObject, a_snapshot_body_that_is_no_zstd_frame_is_refused) {
  Snapshot snap = MakeSnapshot(std::string(4096, 'd'));
  const std::string header = snap.bytes.substr(0, HeaderSize(snap.bytes));
  std::string obj = header + std::string(64, '\x55');
  ResealBody(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0)).status, "the snapshot's body is not a zstd frame");
  // A skippable frame before the real one: zstd reads past it or stops after
  // it depending on where the stream is cut, so it is no snapshot.
  std::string skippable(8, '\0');
  Set<std::uint32_t>(skippable, 0, 0x184D2A50u);
  obj = header + skippable + snap.bytes.substr(HeaderSize(snap.bytes));
  ResealBody(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0), 1).status, "not a zstd frame");
  // A frame's magic, then garbage.
  obj = header + std::string("\x28\xb5\x2f\xfd", 4) + std::string(64, '\x55');
  ResealBody(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0)).status, "cannot decompress the snapshot");
}

TEST_F(LogObject, a_segment_body_that_is_no_zstd_frame_is_refused) {
  const std::string good = Segment();
  std::string obj = good.substr(0, HeaderSize(good)) + std::string(64, '\x55');
  ResealBody(obj);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "the segment's body is not a zstd frame");
}

TEST_F(LogObject, a_snapshot_with_a_second_frame_after_its_first_is_refused) {
  Snapshot snap = MakeSnapshot(std::string(4096, 'd'));
  std::string obj = snap.bytes + Compress("");
  ResealBody(obj);
  ExpectDataLoss(ReadSnapshot(obj, Expect(0)).status, "after the end of its compressed frame");
}

TEST_F(LogObject, a_page_write_count_beyond_the_bytes_left_is_refused_before_reserving) {
  std::string obj = ForgedSegment(RawTxn(1, 4096, 0xffffffffu) + RawWrite(0, 1, "x"), 1, 4096);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "declares 4294967295 page writes");
}

TEST_F(LogObject, a_page_write_longer_than_the_bytes_left_is_refused) {
  std::string obj = ForgedSegment(RawTxn(1, 4096, 1) + RawWrite(0, 5000, "short"), 1, 4096);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "transaction 0 is cut short");
}

TEST_F(LogObject, a_page_write_past_the_largest_database_is_refused) {
  std::string obj =
      ForgedSegment(RawTxn(1, 4096, 1) + RawWrite(kMaxLogDatabaseBytes - 2, 4, "abcd"), 1, 4096);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "past the 1099511627776 bytes");
}

TEST_F(LogObject, bytes_after_the_last_transaction_are_refused) {
  std::string obj = ForgedSegment(RawTxn(1, 4096, 1) + RawWrite(0, 1, "x") + "junk", 1, 4096);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "4 bytes follow the last transaction");
}

TEST_F(LogObject, a_segment_header_that_disagrees_with_its_transactions_is_refused) {
  std::string obj = ForgedSegment(RawTxn(1, 4096, 1) + RawWrite(0, 1, "x"), 2, 4096);
  ExpectDataLoss(DecodeLogSegment(obj, Expect()).status(), "disagrees with its transactions");
}

TEST_F(LogObject, an_unknown_kind_is_refused) {
  std::string obj = EncodeLogMarker(At(1, 1), 1)->bytes;
  Set<std::uint32_t>(obj, kOffKind, 9);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "kind 9 is no log object kind");
}

TEST_F(LogObject, a_marker_or_tombstone_with_a_body_is_refused) {
  std::string obj = EncodeLogTombstone(At(1, 1), 1)->bytes + "body";
  ResealBody(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "declares a body, which it never has");
}

TEST_F(LogObject, a_nonzero_reserved_word_is_refused) {
  std::string obj = EncodeLogMarker(At(1, 1), 1)->bytes;
  Set<std::uint32_t>(obj, kOffZero, 1);
  ResealHeader(obj);
  ExpectDataLoss(Summarize(obj, Expect()).status(), "reserved word");
}

TEST_F(LogObject, each_reader_refuses_the_kinds_it_does_not_read) {
  ExpectDataLoss(DecodeLogSegment(EncodeLogMarker(At(1, 1), 1)->bytes, Expect()).status(),
                 "expected a segment, found a marker");
  Snapshot snap = MakeSnapshot("abc");
  EXPECT_EQ(DecodeLogObject(snap.bytes, Expect()).status().code(), Code::kInvalidArgument);
  ExpectDataLoss(ReadSnapshot(Segment(), Expect()).status, "expected a snapshot, found a segment");
}

TEST_F(LogObject, a_failed_reader_keeps_failing) {
  UniqueFd out = Open("restored", O_RDWR | O_CREAT | O_TRUNC);
  LogSnapshotReader reader(out.get(), Expect());
  EXPECT_FALSE(reader.Feed(Segment()).ok());
  Snapshot snap = MakeSnapshot("abc");
  EXPECT_FALSE(reader.Feed(snap.bytes).ok());
  EXPECT_FALSE(reader.Finish().ok());
}

// ---- writers refuse what readers would ----

TEST_F(LogObject, writers_refuse_objects_no_reader_would_accept) {
  EXPECT_EQ(EncodeLogSegment(At(1), {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeLogSegment(LogPosition{"", kEpoch, 1, 0}, SampleTxns()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeLogMarker(LogPosition{std::string(kMaxLogKeyBytes + 1, 'k'), 1, 1, 0}, 1)
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeLogTombstone(At(0, 5), 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EncodeLogSegment(At(1), {Txn{1, 1, {PageWrite{kMaxLogDatabaseBytes, "x"}}}})
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EncodeLogSegment(At(1), {Txn{1, kMaxLogDatabaseBytes + 1, {}}}).status().code(),
            Code::kInvalidArgument);
  UniqueFd src = Open("src", O_RDWR | O_CREAT | O_TRUNC);
  UniqueFd out = Open("snap", O_RDWR | O_CREAT | O_TRUNC);
  EXPECT_EQ(WriteLogSnapshot(src.get(), kMaxLogDatabaseBytes + 1, At(0), 1, {}, nullptr, out.get())
                .status()
                .code(),
            Code::kInvalidArgument);
}

TEST_F(LogObject, a_key_of_the_largest_length_round_trips) {
  const std::string key(kMaxLogKeyBytes, 'k');
  auto enc = EncodeLogMarker(LogPosition{key, 1, 1, 0}, 1);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->bytes.size(), kMaxLogHeaderBytes);
  EXPECT_TRUE(DecodeLogObject(enc->bytes, LogExpectation{key, 1, 1, 1}).ok());
}

// ---- the fuzz target's seed corpus ----

// The seeds of tests/fuzz/log_object_fuzz.cc: an option byte (see there),
// then the object. FLEETFS_WRITE_FUZZ_CORPUS=1 rewrites them; every run checks
// that the committed ones are still objects this format reads.
struct Seed {
  std::string name;
  std::uint8_t options = 0;
  std::string object;
  bool valid = true;  // decodes as it stands
};

TEST_F(LogObject, the_fuzz_seed_corpus_holds_objects_this_format_reads) {
  std::vector<Seed> seeds;
  const std::string page = "SQLite format 3" + std::string(1, '\0') + std::string(4080, 'p');
  Snapshot snap = MakeSnapshot(page + RandomBytes(4096, 8), At(0));
  seeds.push_back({"snapshot_8k", 0, snap.bytes});
  seeds.push_back({"snapshot_8k_in_small_pieces", 0xf0, snap.bytes});
  seeds.push_back({"snapshot_empty", 0, MakeSnapshot("", At(0)).bytes});
  auto seg = EncodeLogSegment(At(1, snap.checksum), SampleTxns());
  ASSERT_TRUE(seg.ok());
  seeds.push_back({"segment_two_txns", 0, seg->bytes});
  seeds.push_back({"segment_resealed", 1, seg->bytes});
  auto one = EncodeLogSegment(At(2, seg->checksum), {Txn{2000, 4096, {PageWrite{0, "hello"}}}});
  seeds.push_back({"segment_one_txn", 0, one->bytes});
  seeds.push_back({"tombstone", 0, EncodeLogTombstone(At(3, one->checksum), 3000)->bytes});
  seeds.push_back({"marker", 0, EncodeLogMarker(LogPosition{kKey, 4, 4, 1}, 4000)->bytes});
  // Option 2: the bytes after the header are a segment body's raw payload.
  std::string head = seg->bytes.substr(0, HeaderSize(seg->bytes));
  seeds.push_back({"segment_payload", 2,
                   head + RawTxn(1000, 8192, 2) + RawWrite(0, 4, "abcd") + RawWrite(4096, 2, "ef") +
                       RawTxn(1005, 8192, 0),
                   false});

  const fs::path dir = fs::path(FLEETFS_SOURCE_DIR) / "tests/fuzz/corpus/log_object";
  if (const char* w = std::getenv("FLEETFS_WRITE_FUZZ_CORPUS"); w && std::string(w) == "1") {
    fs::create_directories(dir);
    for (const Seed& s : seeds) {
      std::ofstream(dir / s.name, std::ios::binary | std::ios::trunc)
          << static_cast<char>(s.options) << s.object;
    }
  }
  for (const Seed& s : seeds) {
    std::ifstream in(dir / s.name, std::ios::binary);
    ASSERT_TRUE(in) << "missing seed " << (dir / s.name) << " (FLEETFS_WRITE_FUZZ_CORPUS=1 writes it)";
    const std::string bytes(std::istreambuf_iterator<char>(in), {});
    ASSERT_FALSE(bytes.empty());
    EXPECT_EQ(static_cast<std::uint8_t>(bytes[0]), s.options) << s.name;
    const std::string committed = bytes.substr(1);
    if (!s.valid) {
      EXPECT_EQ(committed, s.object) << s.name;
      continue;
    }
    auto want = Summarize(s.object, LogExpectation{kKey, std::nullopt, std::nullopt, std::nullopt});
    ASSERT_TRUE(want.ok()) << s.name << ": " << want.status().message();
    auto got = Summarize(committed, LogExpectation{kKey, want->seq, want->epoch, want->epoch});
    ASSERT_TRUE(got.ok()) << s.name << ": " << got.status().message();
    EXPECT_EQ(got->kind, want->kind) << s.name;
    if (got->kind == LogKind::kSnapshot) {
      Restored r = ReadSnapshot(committed, LogExpectation{kKey, got->seq, got->epoch, std::nullopt});
      EXPECT_TRUE(r.status.ok()) << s.name << ": " << r.status.message();
      EXPECT_EQ(r.db.size(), want->db_size) << s.name;
    } else {
      auto dec = DecodeLogObject(committed, LogExpectation{kKey, got->seq, got->epoch, got->epoch});
      EXPECT_TRUE(dec.ok()) << s.name << ": " << dec.status().message();
    }
  }
}

}  // namespace
}  // namespace fleetfs::replica
