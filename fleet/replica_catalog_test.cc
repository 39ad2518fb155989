#include "fleet/replica_catalog.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKey = "176/acme.db";

class Catalog : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleetfs-cat-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
    dest_ = *OpenDestination("file://" + (dir_ / "replica").string());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A snapshot of `bytes` taken at `as_of`.
  void PutSnapshot(GenerationId gen, std::uint64_t seq, const std::string& bytes, WallMs as_of) {
    std::string src = (dir_ / "work" / "src").string();
    std::ofstream(src, std::ios::binary | std::ios::trunc) << bytes;
    UniqueFd in(::open(src.c_str(), O_RDONLY));
    std::string out = (dir_ / "work" / "snap").string();
    UniqueFd fd(::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600));
    ASSERT_TRUE(WriteSnapshot(in.get(), bytes.size(), as_of, SnapshotOwner{1, 2, 0640}, nullptr,
                              fd.get())
                    .ok());
    ASSERT_TRUE(dest_->PutFile(ObjectPath(kKey, gen, {seq, ObjectKind::kSnapshot}), fd.get()).ok());
  }
  void PutSegment(GenerationId gen, std::uint64_t seq, std::vector<Txn> txns) {
    ASSERT_TRUE(dest_->Put(ObjectPath(kKey, gen, {seq, ObjectKind::kSegment}), EncodeSegment(txns)).ok());
  }
  static Txn Write(WallMs at, std::uint64_t offset, std::string data, std::uint64_t size) {
    return Txn{at, size, {PageWrite{offset, std::move(data)}}};
  }
  // Restores into a fresh file; returns its bytes.
  Result<std::string> Restore(std::optional<WallMs> at, RestoreOutcome* outcome = nullptr) {
    std::string out = (dir_ / "work" / ("out" + std::to_string(n_++))).string();
    UniqueFd fd(::open(out.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
    auto r = RestoreTo(*dest_, kKey, at, fd.get());
    if (!r.ok()) return r.status();
    if (outcome) *outcome = *r;
    std::ifstream in(out, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::shared_ptr<Destination> dest_;
  int n_ = 0;
};

TEST(Segment, round_trips_and_a_flipped_byte_is_a_checksum_mismatch) {
  std::vector<Txn> txns = {Txn{10, 8192, {PageWrite{0, std::string(4096, 'a')}}},
                           Txn{20, 4096, {PageWrite{4096, std::string(4096, 'b')}}}};
  std::string bytes = EncodeSegment(txns);
  auto back = DecodeSegment(bytes);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].commit_ms, 20);
  EXPECT_EQ((*back)[1].writes[0].data, std::string(4096, 'b'));
  auto summary = Summarize(bytes);
  EXPECT_EQ(summary->commits, 2u);
  EXPECT_EQ(summary->first_ms, 10);
  EXPECT_EQ(summary->last_ms, 20);
  bytes[bytes.size() - 3] ^= 1;
  auto bad = DecodeSegment(bytes);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kDataLoss);
  EXPECT_EQ(bad.status().message(), "checksum mismatch");
}

// Found by the replica_object fuzz target: the checksum covers the stored
// bytes, so a forger can declare any size in the header.
TEST(Segment, a_forged_size_is_refused_before_memory_is_reserved_for_it) {
  std::vector<Txn> txns = {Txn{10, 4096, {PageWrite{0, std::string(4096, 'a')}}}};
  const std::string good = EncodeSegment(txns);
  for (std::uint64_t forged : {std::uint64_t{1} << 62, std::uint64_t{4097 + 20 + 12}}) {
    std::string bytes = good;
    std::memcpy(bytes.data() + 32, &forged, sizeof forged);
    auto bad = DecodeSegment(bytes);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), Code::kDataLoss);
    EXPECT_NE(bad.status().message().find("declares " + std::to_string(forged)), std::string::npos)
        << bad.status().message();
  }
}

TEST(Names, generations_order_by_epoch_then_index) {
  GenerationId a{2, 1}, b{1, 9};
  EXPECT_LT(b, a);
  EXPECT_EQ(GenerationId::Parse(a.Name()), a);
  EXPECT_FALSE(GenerationId::Parse("e1-g1"));
  EXPECT_EQ(ObjectId::Parse("0000000003.seg")->seq, 3u);
  EXPECT_FALSE(ObjectId::Parse("0000000003.tmp"));
}

TEST_F(Catalog, a_restore_applies_the_segments_after_the_snapshot) {
  GenerationId gen{1, 1};
  PutSnapshot(gen, 0, std::string(8192, 'x'), 100);
  PutSegment(gen, 1, {Write(150, 0, "AAAA", 8192)});
  PutSegment(gen, 2, {Write(250, 4096, "BBBB", 12288)});
  RestoreOutcome outcome;
  auto bytes = Restore(std::nullopt, &outcome);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  EXPECT_EQ(bytes->size(), 12288u);
  EXPECT_EQ(bytes->substr(0, 5), "AAAAx");
  EXPECT_EQ(bytes->substr(4096, 4), "BBBB");
  EXPECT_EQ(outcome.commits, 2u);
  EXPECT_EQ(outcome.as_of_ms, 250);
  EXPECT_EQ(outcome.owner.uid, 1u);
  EXPECT_EQ(outcome.owner.mode, 0640u);
}

TEST_F(Catalog, at_a_time_only_the_commits_up_to_it_are_applied) {
  GenerationId gen{1, 1};
  PutSnapshot(gen, 0, std::string(8192, 'x'), 100);
  PutSegment(gen, 1, {Write(150, 0, "A", 8192), Write(200, 1, "B", 8192)});
  PutSegment(gen, 2, {Write(250, 2, "C", 8192)});
  EXPECT_EQ(Restore(199)->substr(0, 3), "Axx");
  EXPECT_EQ(Restore(200)->substr(0, 3), "ABx");
  EXPECT_EQ(Restore(300)->substr(0, 3), "ABC");
  RestoreOutcome before;
  ASSERT_TRUE(Restore(99, &before).ok());
  EXPECT_EQ(before.result, RestoreResult::kNoReplica);  // before the first snapshot
}

TEST_F(Catalog, the_newest_epoch_wins_over_a_later_time) {
  // Epoch 2's owner took over; the fenced owner of epoch 1 shipped late.
  PutSnapshot({2, 1}, 0, std::string(4096, 'n'), 1000);
  PutSnapshot({1, 7}, 0, std::string(4096, 'o'), 5000);
  RestoreOutcome outcome;
  auto bytes = Restore(std::nullopt, &outcome);
  EXPECT_EQ((*bytes)[0], 'n');
  EXPECT_EQ(outcome.generation, (GenerationId{2, 1}));
  EXPECT_EQ(*NewestEpoch(*dest_, kKey), 2u);
}

TEST_F(Catalog, a_tombstone_means_deleted) {
  PutSnapshot({1, 1}, 0, std::string(4096, 'x'), 100);
  ASSERT_TRUE(dest_->Put(ObjectPath(kKey, {1, 2}, {0, ObjectKind::kTombstone}), EncodeTombstone(200)).ok());
  RestoreOutcome outcome;
  ASSERT_TRUE(Restore(std::nullopt, &outcome).ok());
  EXPECT_EQ(outcome.result, RestoreResult::kDeleted);
  ASSERT_TRUE(Restore(150, &outcome).ok());  // before the delete, it was there
  EXPECT_EQ(outcome.result, RestoreResult::kRestored);
}

TEST_F(Catalog, a_gap_in_the_numbering_names_the_missing_object) {
  GenerationId gen{1, 1};
  PutSnapshot(gen, 0, std::string(4096, 'x'), 100);
  PutSegment(gen, 2, {Write(150, 0, "A", 4096)});
  auto r = Restore(std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find("missing object 0000000001.seg"), std::string::npos)
      << r.status().message();
}

TEST_F(Catalog, a_corrupt_snapshot_is_named) {
  GenerationId gen{1, 1};
  PutSnapshot(gen, 0, std::string(100000, 'x'), 100);
  std::string path = (dir_ / "replica" / ObjectPath(kKey, gen, {0, ObjectKind::kSnapshot})).string();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-5, std::ios::end);
  f.put('\x7f');
  f.close();
  auto r = Restore(std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0000000000.snap"), std::string::npos) << r.status().message();
}

TEST_F(Catalog, pruning_removes_old_generations_but_never_the_newest) {
  PutSnapshot({1, 1}, 0, "a", 100);
  PutSnapshot({1, 2}, 0, "b", 200);
  PutSnapshot({2, 3}, 0, "c", 300);
  auto removed = PruneGenerations(*dest_, kKey, 10'000);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 2);
  auto gens = ListGenerations(*dest_, kKey);
  ASSERT_EQ(gens->size(), 1u);
  EXPECT_EQ(gens->front(), (GenerationId{2, 3}));
}

TEST_F(Catalog, pruning_never_removes_the_state_behind_a_newer_empty_generation) {
  PutSnapshot({1, 1}, 0, "state", 100);
  // A takeover's marker at epoch 2: a generation with no object.
  ASSERT_TRUE(dest_->Put(GenerationDir(kKey, GenerationId{2, 2}) + "/taken", "taken\n").ok());
  auto removed = PruneGenerations(*dest_, kKey, 10'000);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 0);
  EXPECT_EQ(Restore(std::nullopt)->substr(0, 5), "state");
}

TEST_F(Catalog, pruning_inside_a_generation_keeps_every_restore_within_the_retention) {
  GenerationId gen{1, 1};
  PutSnapshot(gen, 0, std::string(4096, 'x'), 100);
  PutSegment(gen, 1, {Write(150, 0, "A", 4096)});
  PutSnapshot(gen, 2, "A" + std::string(4095, 'x'), 300);
  PutSegment(gen, 3, {Write(350, 1, "B", 4096)});
  auto removed = PruneGenerations(*dest_, kKey, 320);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 2);  // objects 0 and 1; the snapshot at 300 stays
  EXPECT_EQ(Restore(std::nullopt)->substr(0, 3), "ABx");
  EXPECT_EQ(Restore(300)->substr(0, 3), "Axx");
  RestoreOutcome outcome;
  ASSERT_TRUE(Restore(200, &outcome).ok());  // before the retention: gone
  EXPECT_EQ(outcome.result, RestoreResult::kNoReplica);
}

TEST(Destination, only_absolute_file_urls_are_taken) {
  EXPECT_EQ(ValidateDestinationUrl("s3://bucket/x").code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateDestinationUrl("file://relative").code(), Code::kInvalidArgument);
  EXPECT_TRUE(ValidateDestinationUrl("file:///srv/replica").ok());
}

}  // namespace
}  // namespace fleetfs::replica
