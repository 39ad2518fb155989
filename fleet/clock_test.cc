#include "fleet/clock.h"

#include <gtest/gtest.h>
#include <time.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace fleetfs {
namespace {

WallMs RealWallMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The only test in this binary that reads the wall clock: the offset file is
// named once per process, before the first reading.
TEST(SystemWallClock, adds_the_test_offset_and_follows_every_change_of_its_file) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fleetfs-clock-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "offset").string();
  ::setenv("FLEETFS_TEST_WALL_OFFSET_FILE", path.c_str(), 1);
  const auto by_rename = [&](const std::string& text) {
    std::ofstream(path + ".new") << text;
    std::filesystem::rename(path + ".new", path);
  };
  SystemWallClock clock;

  EXPECT_TRUE(CheckTestWallOffset().ok()) << "a missing file means no offset";
  EXPECT_NEAR(clock.NowMs(), RealWallMs(), 1'000);
  by_rename("+3600000\n");
  EXPECT_NEAR(clock.NowMs(), RealWallMs() + 3'600'000, 1'000) << "read at the next reading";
  std::ofstream(path, std::ios::trunc) << "-3600000";  // in place: same inode
  EXPECT_NEAR(clock.NowMs(), RealWallMs() - 3'600'000, 1'000);
  by_rename("-3600000 ms");
  EXPECT_NEAR(clock.NowMs(), RealWallMs() - 3'600'000, 1'000) << "a bad file keeps the last offset";
  const Status refused = CheckTestWallOffset();
  EXPECT_EQ(refused.code(), Code::kInvalidArgument);
  EXPECT_NE(refused.message().find(path), std::string::npos) << refused.message();
  std::filesystem::remove(path);
  EXPECT_NEAR(clock.NowMs(), RealWallMs(), 1'000) << "a removed file means no offset";
  std::filesystem::remove_all(dir);
  ::unsetenv("FLEETFS_TEST_WALL_OFFSET_FILE");
}

TEST(SystemBootClock, reads_this_boots_id_and_clock_boottime) {
  auto clock = SystemBootClock::Make();
  ASSERT_TRUE(clock.ok()) << clock.status().message();
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  EXPECT_EQ((*clock)->BootId(), id);
  EXPECT_EQ(id.size(), 36u);
  timespec boot{};
  ::clock_gettime(CLOCK_BOOTTIME, &boot);
  EXPECT_NEAR((*clock)->NowMs(), boot.tv_sec * 1000 + boot.tv_nsec / 1'000'000, 1'000);
}

// Where the machine never slept, CLOCK_BOOTTIME and CLOCK_MONOTONIC agree and
// this cannot tell them apart; where it did (a laptop, a resumed VM), a
// monotonic-based clock falls outside the bracket by the time slept.
TEST(SystemMonotonicClock, counts_the_boot_clock_so_a_suspend_ends_local_leases) {
  SystemMonotonicClock clock;
  auto boot_now = [] {
    timespec t{};
    ::clock_gettime(CLOCK_BOOTTIME, &t);
    return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
  };
  const auto before = boot_now();
  const auto read = clock.Now().time_since_epoch();
  const auto after = boot_now();
  EXPECT_LE(before, read);
  EXPECT_LE(read, after);
}

TEST(SystemBootClock, the_time_namespace_offset_is_read_from_its_boottime_line) {
  EXPECT_EQ(ParseBootTimeOffsetMs("monotonic           0         0\n"
                                  "boottime         -600         0\n")
                .value(),
            -600'000);
  EXPECT_EQ(ParseBootTimeOffsetMs("monotonic 5 0\nboottime 86400 500000000\n").value(), 86'400'500);
  EXPECT_EQ(ParseBootTimeOffsetMs("monotonic 5 0\n").value(), 0) << "no boottime line";
  EXPECT_EQ(ParseBootTimeOffsetMs("").value(), 0);
  for (const char* bad : {"boottime x 0\n", "boottime 5\n", "boottime 5 1000000000\n",
                          "boottime 5 -1\n", "boottime 99999999999999999999 0\n"}) {
    auto parsed = ParseBootTimeOffsetMs(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("/proc/self/timens_offsets"), std::string::npos);
  }
}

// This process runs in the host's time namespace (offset 0) or in one whose
// offset the clock takes back out: either way it reads the host's clock.
TEST(SystemBootClock, reads_the_hosts_boot_clock_whatever_the_time_namespace) {
  auto clock = SystemBootClock::Make();
  ASSERT_TRUE(clock.ok()) << clock.status().message();
  timespec boot{};
  ::clock_gettime(CLOCK_BOOTTIME, &boot);
  const std::int64_t own = boot.tv_sec * 1000 + boot.tv_nsec / 1'000'000;
  EXPECT_NEAR((*clock)->NowMs(), own - (*clock)->time_namespace_offset_ms(), 1'000);
}

}  // namespace
}  // namespace fleetfs
