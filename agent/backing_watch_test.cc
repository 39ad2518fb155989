#include "agent/backing_watch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

constexpr Millis kWindow{30000};
constexpr Millis kProbeInterval{5000};

class BackingWatchTest : public ::testing::Test {
 protected:
  BackingWatch watch_{BackingWatchOptions{"/srv/backing", kWindow, kProbeInterval}};
  MonoTime now_{std::chrono::seconds(1000)};
  BackingErrors totals_;

  BackingWatch::Decision Observe() { return watch_.Observe(now_, totals_); }
  void Advance(Millis by) { now_ += by; }
};

TEST_F(BackingWatchTest, enospc_on_writes_reports_the_volume_full_until_the_window_after_the_last_one) {
  EXPECT_EQ(watch_.report().state, BackingState::kOk);
  totals_.enospc_writes = 3;
  BackingWatch::Decision d = Observe();
  EXPECT_FALSE(d.probe) << "a full volume is no failing one: nothing to probe, nothing released";
  EXPECT_EQ(watch_.report().state, BackingState::kFull);
  EXPECT_EQ(watch_.report().reason,
            "the backing volume /srv/backing is full: 3 writes failed with ENOSPC in the last 30s");
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_TRUE(d.log[0].warn);

  Advance(Millis(20000));
  totals_.enospc_writes = 4;  // one more, 20 s later
  EXPECT_TRUE(Observe().log.empty()) << "said once, not at every observation";
  EXPECT_EQ(watch_.report().enospc_recent, 4u);
  Advance(Millis(10000));  // 30 s after the first three: only the last one is recent
  Observe();
  EXPECT_EQ(watch_.report().state, BackingState::kFull);
  EXPECT_EQ(watch_.report().enospc_recent, 1u);
  Advance(Millis(19999));
  Observe();
  EXPECT_EQ(watch_.report().state, BackingState::kFull);
  Advance(Millis(1));
  d = Observe();
  EXPECT_EQ(watch_.report().state, BackingState::kOk);
  EXPECT_TRUE(watch_.report().reason.empty());
  ASSERT_EQ(d.log.size(), 1u);
  EXPECT_NE(d.log[0].text.find("took writes again"), std::string::npos);
}

TEST_F(BackingWatchTest, erofs_asks_for_a_probe_and_only_a_probe_that_fails_makes_the_volume_failed) {
  totals_.erofs = 1;
  BackingWatch::Decision d = Observe();
  EXPECT_TRUE(d.probe);
  EXPECT_EQ(watch_.report().state, BackingState::kOk) << "the mount's errno alone proves nothing";
  ProbeResult probe;
  probe.err = EROFS;
  probe.step = "creating /srv/backing/.fleetfs/write-probe";
  std::optional<std::string> why = watch_.Probed(now_, probe, nullptr);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "the backing volume /srv/backing is read-only: creating "
            "/srv/backing/.fleetfs/write-probe failed: Read-only file system (EROFS); "
            "1 operations through the mount failed with EROFS");
  EXPECT_TRUE(watch_.failed());
  EXPECT_EQ(watch_.report().reason, *why);
  // It stays failed, and is told once.
  totals_.erofs = 5;
  Advance(kProbeInterval);
  EXPECT_FALSE(Observe().probe);
  EXPECT_EQ(watch_.report().state, BackingState::kFailed);
  EXPECT_FALSE(watch_.Probed(now_, probe, nullptr).has_value());
}

TEST_F(BackingWatchTest, a_volume_statvfs_calls_read_only_is_failed) {
  totals_.erofs = 2;
  ASSERT_TRUE(Observe().probe);
  ProbeResult probe;
  probe.read_only = true;
  probe.err = EROFS;
  probe.step = "statvfs of /srv/backing says it is mounted read-only";
  auto why = watch_.Probed(now_, probe, nullptr);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("/srv/backing is read-only: statvfs of /srv/backing says it is mounted "
                      "read-only; 2 operations"),
            std::string::npos)
      << *why;
}

TEST_F(BackingWatchTest, eio_on_writes_that_the_probe_confirms_makes_the_volume_failed) {
  totals_.eio_writes = 1;
  ASSERT_TRUE(Observe().probe);
  ProbeResult probe;
  probe.err = EIO;
  probe.step = "syncing /srv/backing/.fleetfs/write-probe";
  auto why = watch_.Probed(now_, probe, nullptr);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("/srv/backing fails writes: syncing /srv/backing/.fleetfs/write-probe "
                      "failed: Input/output error (EIO); 1 writes through the mount failed with EIO"),
            std::string::npos)
      << *why;
}

TEST_F(BackingWatchTest, write_errors_of_files_a_user_controls_are_cleared_by_a_probe_that_writes) {
  totals_.eio_writes = 7;  // a symlinked bucket, a failed restore: the files, not the volume
  ASSERT_TRUE(Observe().probe);
  std::vector<BackingWatch::LogLine> log;
  EXPECT_FALSE(watch_.Probed(now_, ProbeResult{}, &log).has_value());
  EXPECT_EQ(watch_.report().state, BackingState::kOk);
  EXPECT_EQ(watch_.report().probes_clear, 1u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].text.find("7 writes through the mount failed with EIO, but a probe of the "
                             "backing volume /srv/backing writes fine"),
            std::string::npos)
      << log[0].text;
  // Nothing new: no new probe.
  Advance(kProbeInterval);
  EXPECT_FALSE(Observe().probe);
}

TEST_F(BackingWatchTest, a_probe_that_finds_the_volume_full_or_its_directory_missing_is_no_failure) {
  for (int err : {ENOSPC, ENOENT, EACCES}) {
    totals_.erofs += 1;
    ASSERT_TRUE(Observe().probe);
    ProbeResult probe;
    probe.err = err;
    probe.step = "writing /srv/backing/.fleetfs/write-probe";
    EXPECT_FALSE(watch_.Probed(now_, probe, nullptr).has_value()) << err;
    EXPECT_FALSE(watch_.failed());
    Advance(kProbeInterval);
  }
}

TEST_F(BackingWatchTest, probes_run_at_most_once_per_interval_however_many_errors_arrive) {
  totals_.eio_writes = 1;
  ASSERT_TRUE(Observe().probe);
  totals_.eio_writes = 2;
  EXPECT_FALSE(Observe().probe) << "one probe at a time";
  watch_.Probed(now_, ProbeResult{}, nullptr);
  int probes = 0;
  for (int i = 0; i < 100; ++i) {
    Advance(Millis(49));
    totals_.eio_writes += 10;
    if (Observe().probe) {
      ++probes;
      watch_.Probed(now_, ProbeResult{}, nullptr);
    }
  }
  // 4.9 s after the first probe: none yet; the errors since are not forgotten.
  EXPECT_EQ(probes, 0);
  Advance(Millis(100));
  EXPECT_TRUE(Observe().probe);
  EXPECT_EQ(watch_.report().probes, 2u);
}

TEST(BackingErrorsOf, counts_erofs_of_any_op_but_eio_and_enospc_only_of_writes) {
  vfs::VfsStats stats;
  stats.CountError(vfs::Op::kLookup, EIO);  // a restore that failed: no backing write
  stats.CountError(vfs::Op::kOpen, EIO);
  stats.CountError(vfs::Op::kRead, EIO);
  stats.CountError(vfs::Op::kLookup, ENOSPC);
  stats.CountError(vfs::Op::kOpen, EROFS);
  stats.CountError(vfs::Op::kCreate, EROFS);
  for (vfs::Op op : {vfs::Op::kWrite, vfs::Op::kFsync, vfs::Op::kSetattr, vfs::Op::kCreate,
                     vfs::Op::kUnlink, vfs::Op::kFallocate}) {
    stats.CountError(op, EIO);
    stats.CountError(op, ENOSPC);
  }
  BackingErrors e = BackingErrorsOf(stats);
  EXPECT_EQ(e.erofs, 2u);
  EXPECT_EQ(e.eio_writes, 6u);
  EXPECT_EQ(e.enospc_writes, 6u);
  EXPECT_EQ(vfs::ErrKindOf(EROFS), vfs::ErrKind::kErofs);
  EXPECT_EQ(vfs::ErrKindName(vfs::ErrKind::kErofs), "EROFS");
}

TEST(ProbeBacking, a_writable_volume_passes_and_the_probe_file_is_gone) {
  char tmpl[] = "/tmp/backing-probe-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ProbeResult missing = ProbeBacking(dir);
  EXPECT_EQ(missing.err, ENOENT) << "no agent directory: nothing is made outside it";
  EXPECT_FALSE(missing.read_only);
  ASSERT_EQ(::mkdir((dir + "/.fleetfs").c_str(), 0700), 0);
  ProbeResult ok = ProbeBacking(dir);
  EXPECT_EQ(ok.err, 0) << ok.step;
  EXPECT_FALSE(std::filesystem::exists(dir + "/.fleetfs/write-probe"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fleetfs::agent
