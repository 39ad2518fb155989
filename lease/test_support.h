// Helpers shared by the lease tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "lease/ownership_table.h"

namespace fleetfs::lease::testing {

inline OwnerId Owner(const std::string& id) { return *OwnerId::Make(id); }
inline SlotRange Range(int first, int last) { return *SlotRange::Make(first, last); }

inline Grant AsGrant(const Result<Decision>& decision) {
  EXPECT_TRUE(decision.ok()) << decision.status().message();
  if (!decision.ok()) return Grant{SlotRange::All(), Epoch(), 0, false};
  const auto* grant = std::get_if<Grant>(&*decision);
  EXPECT_NE(grant, nullptr) << DescribeDecision(*decision);
  return grant ? *grant : Grant{SlotRange::All(), Epoch(), 0, false};
}
inline Grant AsGrant(const Decision& decision) { return AsGrant(Result<Decision>(decision)); }

}  // namespace fleetfs::lease::testing

#include <atomic>
#include <filesystem>
#include <random>

#include "fleet/clock.h"

namespace fleetfs::lease::testing {

// A wall clock that moves only when a test moves it.
class FakeWallClock final : public WallClock {
 public:
  explicit FakeWallClock(WallMs start) : now_(start) {}
  WallMs NowMs() const override { return now_.load(); }
  void Advance(Millis by) { now_ += by.count(); }
  void Set(WallMs to) { now_ = to; }

 private:
  std::atomic<WallMs> now_;
};

// A monotonic clock that moves only when a test moves it.
class FakeMonotonicClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return MonoTime(Millis(now_ms_.load())); }
  void Advance(Millis by) { now_ms_ += by.count(); }

 private:
  std::atomic<std::int64_t> now_ms_{1'000'000};
};

// A fresh directory under the test temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() /
            ("fleetfs-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace fleetfs::lease::testing
