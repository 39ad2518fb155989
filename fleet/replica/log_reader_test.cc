#include "fleet/replica/log_reader.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fleet/replica/destination_fakes.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_test_support.h"
#include "fleet/replica/log_writer.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

using testing::LogBuilder;
constexpr const char* kDir = testing::kLogDir;
constexpr std::size_t kPage = testing::kLogPage;

std::string ReadAll(int fd) {
  struct stat st;
  EXPECT_EQ(::fstat(fd, &st), 0);
  std::string s(static_cast<std::size_t>(st.st_size), '\0');
  EXPECT_EQ(::pread(fd, s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
  return s;
}

struct Restored {
  Result<LogRestoreOutcome> outcome;
  std::string file;
};
Restored Restore(Destination& dest, std::optional<WallMs> at,
                 std::uint64_t max_epoch = LogBuilder::kMaxEpoch) {
  UniqueFd out(::memfd_create("restore", 0));
  auto r = RestoreFromLog(dest, kDir, at, out.get(), max_epoch);
  return Restored{std::move(r), ReadAll(out.get())};
}

std::string Path(std::uint64_t seq) { return LogObjectPath(kDir, seq); }

TEST(ListLog, a_log_directory_of_the_old_layout_is_refused_with_what_to_do) {
  MemoryDestination dest;
  ASSERT_TRUE(
      dest.Put(std::string(kDir) + "/e00000000000000000001-g00000000/0000000000.snap", "x").ok());
  auto seqs = ListLog(dest, kDir);
  EXPECT_EQ(seqs.status().code(), Code::kFailedPrecondition);
  UniqueFd out(::memfd_create("restore", 0));
  EXPECT_EQ(RestoreFromLog(dest, kDir, std::nullopt, out.get(), 5).status().code(),
            Code::kFailedPrecondition);
}

TEST(ListLog, lists_the_sequences_after_a_given_one_in_order) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  for (int i = 0; i < 12; ++i) log.Segment({{100 + i, 'a'}});
  auto all = ListLog(dest, kDir);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 13u);
  auto after = ListLog(dest, kDir, 9);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, (std::vector<std::uint64_t>{10, 11, 12}));
}

TEST(ReadLogHeader, an_object_whose_header_names_another_sequence_is_refused_naming_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  ASSERT_TRUE(dest.Put(Path(7), *dest.Peek(Path(0))).ok());
  auto h = ReadLogHeader(dest, kDir, 7, 5);
  EXPECT_EQ(h.status().code(), Code::kDataLoss);
  EXPECT_NE(h.status().message().find(Path(7)), std::string::npos) << h.status().message();
}

TEST(RestoreFromLog, an_empty_log_is_no_replica) {
  MemoryDestination dest;
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok());
  EXPECT_EQ(r.outcome->result, LogRestoreResult::kNoReplica);
  EXPECT_FALSE(r.outcome->tail_seq.has_value());
}

TEST(RestoreFromLog, a_log_of_markers_only_is_no_replica) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Take(2);
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.outcome->result, LogRestoreResult::kNoReplica);
  EXPECT_EQ(r.outcome->tail_epoch, 2u);
  EXPECT_EQ(r.outcome->tail_seq, 1u);
}

TEST(RestoreFromLog, the_newest_state_is_the_snapshot_and_every_segment_after_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Segment({{110, 'b'}, {120, 'c'}}, 1);
  log.Segment({{130, 'd'}}, 3);
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.outcome->result, LogRestoreResult::kRestored);
  EXPECT_EQ(r.file, log.db());
  EXPECT_EQ(r.outcome->as_of_ms, 130);
  EXPECT_EQ(r.outcome->commits, 3u);
  EXPECT_EQ(r.outcome->bytes, 4 * kPage);
  EXPECT_EQ(r.outcome->owner, (SnapshotOwner{1000, 1000, 0600}));
  EXPECT_EQ(r.outcome->tail_seq, 3u);
  EXPECT_EQ(r.outcome->as_of_seq, 3u);
  EXPECT_EQ(r.outcome->tail_epoch, 1u);
  // What a writer continuing the log needs: the tail's chain checksum.
  EXPECT_EQ(r.outcome->tail_checksum, log.position().prev);
}

// Review: a page write of no bytes (no writer makes one; a hostile object
// can) made the restore's pwritev answer 0 for ever.
TEST(RestoreFromLog, a_page_write_of_no_bytes_is_nothing_written_and_the_restore_ends) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.RawSegment({Txn{110, kPage, {PageWrite{0, std::string(kPage, 'b')}, PageWrite{kPage, ""}}},
                  Txn{120, kPage, {PageWrite{kPage, ""}}}});
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.outcome->commits, 2u);
  EXPECT_EQ(r.file, std::string(kPage, 'b'));
}

TEST(RestoreFromLog, a_point_in_time_takes_the_newest_snapshot_at_or_before_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1, 50);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Segment({{110, 'b'}, {120, 'c'}});
  log.Snapshot(130);
  log.Segment({{140, 'd'}}, 1);
  const std::pair<WallMs, WallMs> as_of[] = {{100, 100}, {109, 100}, {110, 110},
                                             {115, 110}, {120, 120}, {129, 120},
                                             {130, 130}, {140, 140}, {1000, 140}};
  for (auto [at, expected] : as_of) {
    auto r = Restore(dest, at);
    ASSERT_TRUE(r.outcome.ok()) << at << ": " << r.outcome.status().message();
    EXPECT_EQ(r.outcome->result, LogRestoreResult::kRestored) << at;
    EXPECT_EQ(r.file, log.StateAt(at)) << at;
    EXPECT_EQ(r.outcome->as_of_ms, expected) << at;
  }
  // Before the first snapshot of a whole log, the key had no replica.
  auto before = Restore(dest, 99);
  ASSERT_TRUE(before.outcome.ok()) << before.outcome.status().message();
  EXPECT_EQ(before.outcome->result, LogRestoreResult::kNoReplica);
  EXPECT_TRUE(before.file.empty());
}

TEST(RestoreFromLog, markers_are_skipped_and_a_new_epoch_continues_the_log) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Segment({{110, 'b'}});
  log.Take(2, 115);
  log.Segment({{120, 'c'}}, 2);
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.file, log.db());
  EXPECT_EQ(r.outcome->tail_epoch, 2u);
  EXPECT_EQ(r.outcome->commits, 2u);
}

TEST(RestoreFromLog, a_tombstone_ends_the_key_and_a_later_snapshot_revives_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Segment({{110, 'b'}});
  log.Tombstone(200);
  auto deleted = Restore(dest, std::nullopt);
  ASSERT_TRUE(deleted.outcome.ok()) << deleted.outcome.status().message();
  EXPECT_EQ(deleted.outcome->result, LogRestoreResult::kDeleted);
  EXPECT_EQ(deleted.outcome->as_of_ms, 200);
  EXPECT_TRUE(deleted.file.empty());
  auto before = Restore(dest, 150);
  ASSERT_TRUE(before.outcome.ok());
  EXPECT_EQ(before.outcome->result, LogRestoreResult::kRestored);
  EXPECT_EQ(before.file, log.StateAt(150));
}

TEST(RestoreFromLog, a_segment_after_a_tombstone_without_a_snapshot_between_is_corruption) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Tombstone(200);
  log.Segment({{300, 'z'}});
  auto r = Restore(dest, std::nullopt);
  EXPECT_EQ(r.outcome.status().code(), Code::kDataLoss);
  EXPECT_NE(r.outcome.status().message().find(Path(3)), std::string::npos)
      << r.outcome.status().message();
}

TEST(RestoreFromLog, a_snapshot_after_a_tombstone_revives_the_key) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Tombstone(200);
  log.Recreate(std::string(2 * kPage, 'n'));  // a new file under the same name
  log.Snapshot(300);
  log.Segment({{310, 's'}}, 1);
  auto r = Restore(dest, std::nullopt);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.outcome->result, LogRestoreResult::kRestored);
  EXPECT_EQ(r.file, log.db());
  auto mid = Restore(dest, 250);
  ASSERT_TRUE(mid.outcome.ok());
  EXPECT_EQ(mid.outcome->result, LogRestoreResult::kDeleted);
  auto revived = Restore(dest, 300);
  ASSERT_TRUE(revived.outcome.ok());
  EXPECT_EQ(revived.outcome->result, LogRestoreResult::kRestored);
  EXPECT_EQ(revived.file, std::string(2 * kPage, 'n'));
}

TEST(RestoreFromLog, a_segment_with_no_snapshot_before_it_is_corruption) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1);
  log.Segment({{100, 'a'}});
  auto r = Restore(dest, std::nullopt);
  EXPECT_EQ(r.outcome.status().code(), Code::kDataLoss);
  EXPECT_NE(r.outcome.status().message().find(Path(1)), std::string::npos)
      << r.outcome.status().message();
}

// A log of one epoch: marker 0, snapshot 1, segments 2 and 3.
void SmallLog(LogBuilder& log) {
  log.Take(1);
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);
  log.Segment({{110, 'b'}});
  log.Segment({{120, 'c'}}, 1);
}

void ExpectDataLossNaming(const Restored& r, std::uint64_t seq, std::string_view says) {
  ASSERT_FALSE(r.outcome.ok());
  EXPECT_EQ(r.outcome.status().code(), Code::kDataLoss);
  const std::string& m = r.outcome.status().message();
  EXPECT_NE(m.find(Path(seq)), std::string::npos) << m;
  EXPECT_NE(m.find(says), std::string::npos) << m;
}

TEST(RestoreFromLog, a_broken_chain_is_corruption_naming_the_object) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  // Object 2 replaced by one that follows another object 1.
  auto forged = EncodeLogSegment(LogPosition{kDir, 1, 2, 12345}, {Txn{110, kPage, {}}});
  ASSERT_TRUE(dest.Put(Path(2), forged->bytes).ok());
  ExpectDataLossNaming(Restore(dest, std::nullopt), 2, "chain is broken");
}

TEST(RestoreFromLog, a_damaged_segment_is_corruption_naming_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  std::string seg = *dest.Peek(Path(2));
  seg.back() ^= 1;
  ASSERT_TRUE(dest.Put(Path(2), seg).ok());
  ExpectDataLossNaming(Restore(dest, std::nullopt), 2, "checksum");
}

TEST(RestoreFromLog, a_damaged_snapshot_is_corruption_naming_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  std::string snap = *dest.Peek(Path(1));
  snap.back() ^= 1;
  ASSERT_TRUE(dest.Put(Path(1), snap).ok());
  ExpectDataLossNaming(Restore(dest, std::nullopt), 1, "checksum");
}

TEST(RestoreFromLog, a_gap_in_the_sequence_is_corruption) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  ASSERT_TRUE(dest.Remove(Path(2)).ok());
  auto r = Restore(dest, std::nullopt);
  EXPECT_EQ(r.outcome.status().code(), Code::kDataLoss);
  EXPECT_NE(r.outcome.status().message().find("missing object 2"), std::string::npos)
      << r.outcome.status().message();
}

TEST(RestoreFromLog, an_epoch_that_decreases_along_the_log_is_corruption) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  log.Take(3);  // marker 4
  LogPosition late = log.position();
  late.epoch = 2;
  auto marker = EncodeLogMarker(late, 200);
  ASSERT_TRUE(dest.Create(Path(late.seq), marker->bytes).ok());
  ExpectDataLossNaming(Restore(dest, std::nullopt), 4, "epochs never decrease");
}

TEST(RestoreFromLog, an_epoch_above_what_the_store_granted_is_corruption) {
  MemoryDestination dest;
  LogBuilder log(dest);
  SmallLog(log);
  log.Take(3);
  ExpectDataLossNaming(Restore(dest, std::nullopt, /*max_epoch=*/2), 4, "above any");
}

TEST(RestoreFromLog, progress_counts_the_bytes_read_up_to_the_total) {
  MemoryDestination dest("memory://test", /*get_piece=*/1000);
  LogBuilder log(dest);
  SmallLog(log);
  std::uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  UniqueFd out(::memfd_create("restore", 0));
  auto r = RestoreFromLog(dest, kDir, std::nullopt, out.get(), 5,
                          [&](std::uint64_t done, std::uint64_t total) {
                            EXPECT_GE(done, last_done);
                            last_done = done;
                            last_total = total;
                            ++calls;
                          });
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::uint64_t expected = 0;
  for (std::uint64_t seq = 1; seq <= 3; ++seq) expected += dest.Peek(Path(seq))->size();
  EXPECT_EQ(last_total, expected);
  EXPECT_EQ(last_done, expected);
  EXPECT_GT(calls, 2);
}

LogHeader H(LogKind kind, std::uint64_t seq, WallMs ms) {
  LogHeader h;
  h.kind = kind;
  h.seq = seq;
  h.first_ms = h.last_ms = ms;
  h.key = kDir;
  return h;
}

TEST(PlanRetention, a_log_without_a_snapshot_at_or_before_the_cutoff_keeps_everything) {
  const std::vector<LogHeader> log = {H(LogKind::kMarker, 0, 10), H(LogKind::kSnapshot, 1, 500),
                                      H(LogKind::kSegment, 2, 600)};
  EXPECT_TRUE(PlanRetention(log, 499).empty());
  EXPECT_TRUE(PlanRetention({}, 499).empty());
}

TEST(PlanRetention, drops_what_precedes_the_newest_snapshot_at_or_before_the_cutoff) {
  const std::vector<LogHeader> log = {H(LogKind::kMarker, 3, 10),   H(LogKind::kSnapshot, 4, 100),
                                      H(LogKind::kSegment, 5, 150), H(LogKind::kSnapshot, 6, 200),
                                      H(LogKind::kSegment, 7, 250), H(LogKind::kSnapshot, 8, 300)};
  EXPECT_EQ(PlanRetention(log, 250), (std::vector<std::uint64_t>{3, 4, 5}));
  // A snapshot exactly at the cutoff is the one kept.
  EXPECT_EQ(PlanRetention(log, 200), (std::vector<std::uint64_t>{3, 4, 5}));
  EXPECT_EQ(PlanRetention(log, 199), (std::vector<std::uint64_t>{3}));
}

TEST(PlanRetention, never_drops_the_tail) {
  const std::vector<LogHeader> log = {H(LogKind::kSnapshot, 0, 100), H(LogKind::kSegment, 1, 150),
                                      H(LogKind::kSnapshot, 2, 200)};
  EXPECT_EQ(PlanRetention(log, 10000), (std::vector<std::uint64_t>{0, 1}));
  const std::vector<LogHeader> deleted = {H(LogKind::kSnapshot, 0, 100),
                                          H(LogKind::kTombstone, 1, 150)};
  EXPECT_EQ(PlanRetention(deleted, 10000), (std::vector<std::uint64_t>{}));
}

TEST(PruneLog, commits_at_the_cutoff_and_just_after_it_stay_restorable) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1, 50);  // 0
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);                         // 1
  log.Segment({{150, 'b'}});                 // 2
  log.Snapshot(200);                         // 3
  log.Segment({{250, 'c'}, {251, 'd'}}, 1);  // 4: a commit at the cutoff, one just after
  log.Snapshot(252);                         // 5
  log.Segment({{300, 'e'}});                 // 6
  constexpr WallMs kCutoff = 250;
  auto removed = PruneLog(dest, kDir, kCutoff, 5);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 3);
  EXPECT_FALSE(dest.Peek(Path(2)).has_value());
  EXPECT_TRUE(dest.Peek(Path(3)).has_value());
  for (WallMs at : {kCutoff, kCutoff + 1, WallMs{252}, WallMs{300}}) {
    auto r = Restore(dest, at);
    ASSERT_TRUE(r.outcome.ok()) << at << ": " << r.outcome.status().message();
    EXPECT_EQ(r.outcome->result, LogRestoreResult::kRestored);
    EXPECT_EQ(r.file, log.StateAt(at)) << at;
    EXPECT_EQ(r.outcome->as_of_ms, at);
  }
  auto newest = Restore(dest, std::nullopt);
  ASSERT_TRUE(newest.outcome.ok());
  EXPECT_EQ(newest.file, log.db());
  // Before what retention keeps, a restore says so rather than guess.
  EXPECT_EQ(Restore(dest, 199).outcome.status().code(), Code::kFailedPrecondition);
}

TEST(PruneLog, reads_headers_only_up_to_the_first_object_past_the_cutoff) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1, 50);  // 0
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);                                           // 1
  for (int i = 0; i < 40; ++i) log.Segment({{101 + i, 'b'}});  // 2..41
  log.Snapshot(200);                                           // 42
  log.Segment({{300, 'c'}});                                   // 43: past the cutoff
  for (int i = 0; i < 40; ++i) log.Segment({{301 + i, 'd'}});  // 44..83
  const std::uint64_t heads_before = dest.counts().heads;
  auto removed = PruneLog(dest, kDir, 250, 5);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 42);
  EXPECT_LE(dest.counts().heads - heads_before, 44u) << "retention read the whole log's headers";
  auto newest = Restore(dest, std::nullopt);
  ASSERT_TRUE(newest.outcome.ok());
  EXPECT_EQ(newest.file, log.db());
}

TEST(PruneLog, a_commit_at_the_cutoff_after_an_older_snapshot_keeps_that_snapshot) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1, 50);  // 0
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);          // 1
  log.Segment({{250, 'c'}});  // 2: at the cutoff
  log.Snapshot(251);          // 3: just after it
  log.Segment({{260, 'd'}});  // 4
  ASSERT_EQ(*PruneLog(dest, kDir, 250, 5), 1);
  auto r = Restore(dest, 250);
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status().message();
  EXPECT_EQ(r.file, log.StateAt(250));
  EXPECT_EQ(r.outcome->as_of_ms, 250);
}

// Issue 10 item 7: the generations layout dropped an older owner's whole
// generation by its last commit, though the points between that commit and
// the new owner's first snapshot were within retention.
TEST(PruneLog, an_older_epochs_state_stays_restorable_until_a_newer_snapshot_replaces_it) {
  MemoryDestination dest;
  LogBuilder log(dest);
  log.Take(1, 50);  // 0
  log.Recreate(std::string(kPage, 'a'));
  log.Snapshot(100);             // 1
  log.Segment({{200, 'b'}});     // 2: epoch 1's last commit
  log.Take(2, 260);              // 3
  log.Segment({{270, 'c'}}, 1);  // 4
  log.Snapshot(300);             // 5
  constexpr WallMs kCutoff = 250;
  ASSERT_EQ(*PruneLog(dest, kDir, kCutoff, 5), 1);  // the marker before the snapshot only
  for (WallMs at : {kCutoff, WallMs{269}, WallMs{270}, WallMs{299}, WallMs{300}}) {
    auto r = Restore(dest, at);
    ASSERT_TRUE(r.outcome.ok()) << at << ": " << r.outcome.status().message();
    EXPECT_EQ(r.file, log.StateAt(at)) << at;
  }
}

}  // namespace
}  // namespace fleetfs::replica
