// The capture's bounds (issue 10 item 11): every tenant's captured commits
// share one CaptureBudget, spill to their SpillFile beyond it, and are
// dropped with a gap beyond both. Rollback-journal commits are reported
// through the hooks as the mount reports them; a counting clock makes every
// commit's time its position.
#include "fleet/replica/capture.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

namespace fs = std::filesystem;

// Each reading is one later than the one before.
class CountingWallClock final : public WallClock {
 public:
  WallMs NowMs() const override { return ++now_; }

 private:
  mutable std::atomic<WallMs> now_{0};
};

Txn Commit(WallMs ms, std::size_t bytes) {
  Txn t;
  t.commit_ms = ms;
  t.db_size = 1 << 20;
  t.writes.push_back(PageWrite{4096, std::string(bytes, static_cast<char>('a' + ms % 26))});
  t.writes.push_back(PageWrite{0, "header"});
  return t;
}

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleetfs-capture-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / ".fleetfs" / "spill");
    fs::create_directories(dir_ / ".fleetfs" / "unshipped");
    root_ = UniqueFd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tenant's main file of 8 pages, and its capture.
  std::unique_ptr<Capture> Tenant(const std::string& name, std::shared_ptr<CaptureBudget> budget) {
    const FleetFile main = *ParseFleetPath(FleetMode::kTenant, TenantPath(name));
    fs::create_directories(dir_ / fs::path(main.main_path).parent_path());
    std::ofstream(dir_ / main.main_path, std::ios::binary) << std::string(8 * 4096, 'm');
    return std::make_unique<Capture>(
        CaptureOptions{root_.get(), &wall_, std::move(budget), {}, [this] { ++activations_; }},
        main);
  }

  // One rollback-journal commit of `pages` pages, as the mount reports it.
  static void Commit(Capture& c, int pages) {
    const char magic[8] = {'\xd9', '\xd5', '\x05', '\xf9', '\x20', '\xa1', '\x63', '\xd7'};
    { auto guard = c.BeforeWrite(FileRole::kJournal, 0, magic, sizeof magic); }
    const std::string page(4096, 'p');
    for (int p = 0; p < pages; ++p) {
      auto guard =
          c.BeforeWrite(FileRole::kMain, std::uint64_t(p) * 4096, page.data(), page.size());
    }
    { auto guard = c.BeforeUnlink(FileRole::kJournal); }
  }

  // A snapshot's copy under its hold: what was captured is the snapshot's
  // now. Returns the gap mark its landing clears (ClearGap).
  static std::uint64_t CopyForSnapshot(Capture& c) {
    auto hold = c.HoldForSnapshot(std::chrono::milliseconds(100));
    if (!hold.ok()) {
      ADD_FAILURE() << "no snapshot hold: " << hold.status().message();
      return 0;
    }
    (void)hold->ForgetCaptured();
    return hold->gap_mark();
  }

  // Every transaction Take gives until none is left, in the order given.
  static std::vector<Txn> TakeAll(Capture& c) {
    std::vector<Txn> all;
    for (auto txns = c.Take(); !txns.empty(); txns = c.Take()) {
      for (Txn& t : txns) all.push_back(std::move(t));
    }
    return all;
  }

  fs::path dir_;
  UniqueFd root_;
  CountingWallClock wall_;
  int activations_ = 0;  // on_active calls, of every capture made here
};

TEST(SpillFile, records_come_back_in_order_with_their_bytes_and_the_file_goes_once_empty) {
  const fs::path dir = fs::temp_directory_path() / ("fleetfs-spill-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  UniqueFd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  {
    SpillFile spill(root.get(), "t.spill");
    EXPECT_FALSE(fs::exists(dir / "t.spill")) << "made before anything spilled";
    for (WallMs ms = 1; ms <= 40; ++ms) ASSERT_TRUE(spill.Append(Commit(ms, 3000)).ok());
    EXPECT_EQ(fs::status(dir / "t.spill").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_EQ(spill.size(), 40u);
    EXPECT_EQ(spill.front_ms(), 1);
    auto times = spill.CommitTimes();
    ASSERT_TRUE(times.ok());
    EXPECT_EQ(times->size(), 40u);
    EXPECT_EQ(times->back(), 40);
    for (WallMs ms = 1; ms <= 30; ++ms) {
      auto t = spill.Pop();
      ASSERT_TRUE(t.ok()) << t.status().message();
      EXPECT_EQ(t->commit_ms, ms);
      ASSERT_EQ(t->writes.size(), 2u);
      EXPECT_EQ(t->writes[0].offset, 4096u);
      EXPECT_EQ(t->writes[0].data, std::string(3000, static_cast<char>('a' + ms % 26)));
      EXPECT_EQ(t->writes[1].data, "header");
    }
    const std::uint64_t before = spill.disk_bytes();
    const std::uint64_t freed = spill.Trim();
    EXPECT_GT(freed, 0u) << "the taken front was not punched out";
    EXPECT_EQ(spill.disk_bytes(), before - freed);
    EXPECT_EQ(spill.front_ms(), 31);
    while (!spill.empty()) ASSERT_TRUE(spill.Pop().ok());
    spill.Trim();
    EXPECT_EQ(spill.disk_bytes(), 0u);
    EXPECT_FALSE(fs::exists(dir / "t.spill")) << "an empty spill file stayed";
  }
  fs::remove_all(dir);
}

TEST_F(CaptureTest, tenants_sharing_a_budget_hold_no_more_than_it_and_spill_the_rest_in_order) {
  auto budget = std::make_shared<CaptureBudget>(64 << 10, 16 << 20);
  auto a = Tenant("budget-a", budget);
  auto b = Tenant("budget-b", budget);
  // 40 commits of two pages each per tenant: 320 KiB each, 64 KiB for both.
  for (int i = 0; i < 40; ++i) {
    Commit(*a, 2);
    Commit(*b, 2);
    EXPECT_LE(budget->memory_used(), 64u << 10);
  }
  EXPECT_LE(budget->memory_peak(), 64u << 10);
  EXPECT_GT(budget->spill_used(), 500u << 10);
  EXPECT_EQ(budget->drops.load(), 0u);
  EXPECT_TRUE(fs::exists(dir_ / ".fleetfs" / "spill" / MarkerName(a->main())));
  EXPECT_TRUE(fs::exists(dir_ / ".fleetfs" / "spill" / MarkerName(b->main())));

  // Memory first, then the spill: commit order, whatever part was where.
  for (Capture* c : {a.get(), b.get()}) {
    std::vector<Txn> all = TakeAll(*c);
    ASSERT_EQ(all.size(), 40u);
    for (std::size_t i = 1; i < all.size(); ++i) {
      EXPECT_LT(all[i - 1].commit_ms, all[i].commit_ms) << "out of commit order at " << i;
    }
    EXPECT_EQ(all.back().writes.size(), 2u);
    EXPECT_FALSE(fs::exists(dir_ / ".fleetfs" / "spill" / MarkerName(c->main())))
        << "an empty spill file stayed";
  }
  EXPECT_EQ(budget->memory_used(), 0u);
  EXPECT_EQ(budget->spill_used(), 0u);
}

TEST_F(CaptureTest, a_take_hands_over_about_a_quarter_of_the_memory_bound_at_most) {
  auto budget = std::make_shared<CaptureBudget>(256 << 10, 16 << 20);
  auto a = Tenant("take-size", budget);
  for (int i = 0; i < 100; ++i) Commit(*a, 1);
  std::vector<Txn> first = a->Take();
  std::uint64_t bytes = 0;
  for (const Txn& t : first) bytes += t.Bytes();
  EXPECT_GE(bytes, budget->take_bytes());
  EXPECT_LT(bytes, budget->take_bytes() + 4096 + 1);
  EXPECT_EQ(budget->take_bytes(), 64u << 10);
}

TEST_F(CaptureTest,
       with_both_bounds_full_what_is_captured_is_dropped_and_the_snapshot_needed_is_published) {
  auto budget = std::make_shared<CaptureBudget>(64 << 10, 64 << 10);
  auto a = Tenant("both-full", budget);
  for (int i = 0; i < 40; ++i) Commit(*a, 2);
  EXPECT_GE(budget->drops.load(), 1u);
  EXPECT_EQ(a->dropped_bytes(), 8u * 4096) << "not the size of the snapshot it needs";
  EXPECT_LE(budget->memory_peak(), 64u << 10);
  EXPECT_LE(budget->spill_peak(), 64u << 10);
  const CaptureScan scan = a->Scan();
  EXPECT_TRUE(scan.gap) << "dropped commits left no gap";
  EXPECT_FALSE(a->HasShippable()) << "commits after the drop would follow the old tail";
  // The snapshot that fills the gap ships: the need is no longer reported.
  a->ClearGap(CopyForSnapshot(*a));
  EXPECT_EQ(a->dropped_bytes(), 0u);
  EXPECT_EQ(budget->memory_used(), 0u);
  EXPECT_EQ(budget->spill_used(), 0u);
}

// The lag is what a crash would lose: commits taken for an upload that has
// not landed count until it lands (or they come back), whatever is
// committed meanwhile. CI once saw a failover lose a commit older than the
// lag the agent had reported, because a commit during an upload published
// the lag from what was left.
TEST_F(CaptureTest, commits_taken_for_an_upload_count_in_the_lag_until_it_lands) {
  auto budget = std::make_shared<CaptureBudget>(1 << 20, 0);
  auto c = Tenant("in-flight", budget);
  // Past its first snapshot: until then everything is pending since the
  // first write.
  Commit(*c, 1);
  c->ClearGap(CopyForSnapshot(*c));
  ASSERT_EQ(c->oldest_pending_ms(), 0);
  Commit(*c, 1);
  const WallMs first = c->oldest_pending_ms();
  ASSERT_NE(first, 0);
  std::vector<Txn> taken = c->Take();
  ASSERT_EQ(taken.size(), 1u);
  Commit(*c, 1);  // during the upload
  EXPECT_EQ(c->oldest_pending_ms(), first) << "a commit during the upload hid the one in flight";
  c->Shipped();
  const WallMs second = c->oldest_pending_ms();
  EXPECT_GT(second, first) << "the landed upload still counts";
  // Taken and given back (a segment that could not be encoded): still pending.
  std::vector<Txn> again = c->Take();
  ASSERT_EQ(again.size(), 1u);
  Commit(*c, 1);
  EXPECT_EQ(c->oldest_pending_ms(), second);
  c->Return(std::move(again));
  EXPECT_EQ(c->oldest_pending_ms(), second);
}

// A capture past its first snapshot, with `n` commits captured after the
// snapshot's copy and nothing written since it landed: what a crash would
// lose is then exactly those commits.
class CaptureLagTest : public CaptureTest {
 protected:
  std::unique_ptr<Capture> Shipped(
      const std::string& name, int n,
      std::shared_ptr<CaptureBudget> budget = std::make_shared<CaptureBudget>(1 << 20, 0)) {
    auto c = Tenant(name, std::move(budget));
    Commit(*c, 1);
    const std::uint64_t mark = CopyForSnapshot(*c);
    for (int i = 0; i < n; ++i) Commit(*c, 1);
    // Landed after those commits were captured: they stay, for the new
    // generation, and no write follows.
    c->ClearGap(mark);
    EXPECT_FALSE(c->Scan().gap) << "the snapshot's landing left a gap open";
    return c;
  }
};

TEST_F(CaptureLagTest, an_upload_dropped_with_a_gap_counts_from_its_commits_not_from_the_gap) {
  auto c = Shipped("dropped-upload", 1);
  ASSERT_NE(c, nullptr);
  const WallMs made = c->oldest_pending_ms();
  ASSERT_NE(made, 0);
  ASSERT_EQ(c->Take().size(), 1u);
  Commit(*c, 1);  // during the upload: published, so the gap's own publish is what is judged
  c->MarkGap();  // another owner's takeover: the snapshot that fills it ships them
  EXPECT_EQ(c->oldest_pending_ms(), made) << "the lag restarted at the gap";
}

TEST_F(CaptureLagTest, a_gap_publishes_the_lag_it_opens) {
  auto c = Shipped("gap-publishes", 0);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->oldest_pending_ms(), 0);
  c->MarkGap();
  EXPECT_NE(c->oldest_pending_ms(), 0) << "a gap left the lag at 0 until the next change";
}

// Review: a snapshot hold that cannot read the spill file drops what is
// spilled; the snapshot ships those commits, so they count until it lands.
class SpillLostTest : public CaptureLagTest {
 protected:
  // Past its first snapshot, with three commits spilled beyond what
  // `memory` holds (by default none) and the spill file then cut to nothing.
  std::unique_ptr<Capture> SpilledAndLost(const std::string& name, WallMs* first,
                                          std::uint64_t memory = 1) {
    auto c = Tenant(name, std::make_shared<CaptureBudget>(memory, 16 << 20));
    Commit(*c, 1);
    c->ClearGap(CopyForSnapshot(*c));
    for (int i = 0; i < 3; ++i) Commit(*c, 1);
    *first = c->oldest_pending_ms();
    const fs::path spill = dir_ / ".fleetfs" / "spill" / MarkerName(c->main());
    if (*first == 0 || !fs::exists(spill)) {
      ADD_FAILURE() << "nothing spilled";
      return nullptr;
    }
    fs::resize_file(spill, 0);
    return c;
  }
};

TEST_F(SpillLostTest, commits_a_periodic_snapshot_could_not_read_count_until_it_lands) {
  WallMs first = 0;
  auto c = SpilledAndLost("take-lost", &first);
  ASSERT_NE(c, nullptr);
  {
    auto hold = c->HoldForSnapshot(std::chrono::milliseconds(100));
    ASSERT_TRUE(hold.ok()) << hold.status().message();
    (void)hold->TakeCaptured();
  }
  EXPECT_EQ(c->oldest_pending_ms(), first) << "spilled commits the copy covers were forgotten";
}

TEST_F(SpillLostTest, commits_a_snapshot_covers_but_could_not_read_count_until_it_lands) {
  WallMs first = 0;
  auto c = SpilledAndLost("forget-lost", &first);
  ASSERT_NE(c, nullptr);
  {
    auto hold = c->HoldForSnapshot(std::chrono::milliseconds(100));
    ASSERT_TRUE(hold.ok()) << hold.status().message();
    (void)hold->ForgetCaptured();
  }
  EXPECT_EQ(c->oldest_pending_ms(), first) << "spilled commits the copy covers were forgotten";
}

// Review: a periodic snapshot's hold takes the commits in memory for the
// segment ahead of it and cannot read the spilled rest back: only the
// snapshot holds those. The segment landing (and the snapshot's upload
// failing) must not make them read as shipped.
TEST_F(SpillLostTest, commits_only_the_pending_snapshot_holds_count_after_the_segment_ahead_lands) {
  WallMs made = 0;
  auto c = SpilledAndLost("lost-suffix", &made, 6000);  // the first in memory, two spilled
  ASSERT_NE(c, nullptr);
  {
    auto hold = c->HoldForSnapshot(std::chrono::milliseconds(100));
    ASSERT_TRUE(hold.ok()) << hold.status().message();
    ASSERT_EQ(hold->TakeCaptured().size(), 1u) << "the segment ahead holds what memory held";
  }
  const WallMs first = c->oldest_pending_ms();
  ASSERT_NE(first, 0);
  c->Shipped();  // the segment ahead landed; the snapshot's upload failed
  EXPECT_NE(c->oldest_pending_ms(), 0)
      << "commits only the pending snapshot holds read as shipped";
  EXPECT_GT(c->oldest_pending_ms(), first) << "the landed segment's commit still counts";
}

// Review: Take (no snapshot hold) meets a spill file it cannot read, with
// the commits spilled before the last snapshot landed (which ended the
// lag's first-write time). The snapshot that fills the gap ships them: the
// lag counts from them, not from the failure, and says so at once.
TEST_F(SpillLostTest, a_take_that_cannot_read_the_spill_keeps_the_spilled_commits_time) {
  auto c = Tenant("take-lost", std::make_shared<CaptureBudget>(1, 16 << 20));
  Commit(*c, 1);
  const std::uint64_t mark = CopyForSnapshot(*c);
  for (int i = 0; i < 3; ++i) Commit(*c, 1);  // during the upload: spilled
  c->ClearGap(mark);                          // landed after them
  const WallMs first = c->oldest_pending_ms();
  ASSERT_NE(first, 0);
  const fs::path spill = dir_ / ".fleetfs" / "spill" / MarkerName(c->main());
  ASSERT_TRUE(fs::exists(spill)) << "nothing spilled";
  fs::resize_file(spill, 0);
  EXPECT_TRUE(c->Take().empty());
  EXPECT_EQ(c->oldest_pending_ms(), first) << "the lag after the spill error is not theirs";
  Commit(*c, 1);
  EXPECT_EQ(c->oldest_pending_ms(), first) << "the lag restarted at the spill error";
}

TEST_F(CaptureLagTest, commits_a_periodic_snapshot_takes_count_until_they_land) {
  auto c = Shipped("periodic", 1);
  ASSERT_NE(c, nullptr);
  const WallMs made = c->oldest_pending_ms();
  ASSERT_NE(made, 0);
  {
    auto hold = c->HoldForSnapshot(std::chrono::milliseconds(100));
    ASSERT_TRUE(hold.ok()) << hold.status().message();
    ASSERT_EQ(hold->TakeCaptured().size(), 1u);  // the segment ahead of the snapshot
  }
  EXPECT_EQ(c->oldest_pending_ms(), made) << "taken for the segment ahead of a snapshot, lost";
  c->Shipped();  // the segment landed
  EXPECT_EQ(c->oldest_pending_ms(), 0);
}

TEST_F(CaptureLagTest, commits_a_snapshot_covers_count_until_it_lands) {
  auto c = Shipped("covered", 2);
  ASSERT_NE(c, nullptr);
  const WallMs made = c->oldest_pending_ms();
  ASSERT_NE(made, 0);
  std::uint64_t mark = 0;
  {
    auto hold = c->HoldForSnapshot(std::chrono::milliseconds(100));
    ASSERT_TRUE(hold.ok()) << hold.status().message();
    mark = hold->gap_mark();
    ASSERT_EQ(hold->ForgetCaptured().size(), 2u);
  }
  EXPECT_EQ(c->oldest_pending_ms(), made) << "covered by a snapshot not yet landed, and lost";
  c->ClearGap(mark);  // it landed
  EXPECT_EQ(c->oldest_pending_ms(), 0);
}

TEST_F(CaptureLagTest, an_upload_in_flight_when_the_budget_drops_the_rest_still_counts) {
  // Memory for about one commit, no spill: the next commits are dropped.
  auto c = Shipped("budget-drop", 1, std::make_shared<CaptureBudget>(6 << 10, 0));
  const WallMs made = c->oldest_pending_ms();
  ASSERT_NE(made, 0);
  ASSERT_EQ(c->Take().size(), 1u);  // its upload fails and waits
  for (int i = 0; i < 4; ++i) Commit(*c, 1);
  ASSERT_NE(c->dropped_bytes(), 0u) << "the budget dropped nothing";
  EXPECT_EQ(c->oldest_pending_ms(), made) << "the upload in flight left the lag at the drop";
}

TEST_F(CaptureTest, a_capture_that_ends_gives_its_bytes_back_to_the_budget) {
  auto budget = std::make_shared<CaptureBudget>(64 << 10, 16 << 20);
  {
    auto a = Tenant("ends", budget);
    for (int i = 0; i < 20; ++i) Commit(*a, 2);
    ASSERT_GT(budget->spill_used(), 0u);
  }
  EXPECT_EQ(budget->memory_used(), 0u);
  EXPECT_EQ(budget->spill_used(), 0u);
  EXPECT_TRUE(fs::is_empty(dir_ / ".fleetfs" / "spill"));
}

TEST_F(CaptureTest, the_shipper_is_told_once_per_visit_that_a_tenant_changed) {
  auto budget = std::make_shared<CaptureBudget>(1 << 20, 0);
  auto c = Tenant("acme", budget);
  EXPECT_EQ(activations_, 0) << "a capture that saw nothing asked for a visit";
  Commit(*c, 2);
  Commit(*c, 2);
  EXPECT_EQ(activations_, 1) << "every write asked again, though no visit came between";
  c->ClearActive();
  (void)c->Scan();
  EXPECT_EQ(activations_, 1) << "a scan is not a change";
  Commit(*c, 1);
  EXPECT_EQ(activations_, 2) << "a write after the visit began went unseen";
  c->ClearActive();
  c->MarkGap();
  EXPECT_EQ(activations_, 3) << "a gap (the next shipment is a snapshot) went unseen";
  c->ClearActive();
  c->MarkUnshipped();
  EXPECT_EQ(activations_, 4) << "commits left by an earlier run went unseen";
  c->ClearActive();
  {
    const std::string frame(24, 'f');
    auto guard = c->BeforeWrite(FileRole::kWal, 32, frame.data(), frame.size());
    EXPECT_EQ(activations_, 5);
    c->ClearActive();  // a visit begins (and scans) while the write is in flight
  }
  EXPECT_EQ(activations_, 6) << "a write that landed after the visit's scan went unseen";
  c->ClearActive();
  c->Drop();
  Commit(*c, 1);
  EXPECT_EQ(activations_, 6) << "a deleted tenant's late writes asked for a visit";
}

}  // namespace
}  // namespace fleetfs::replica
