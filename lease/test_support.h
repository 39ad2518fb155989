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
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// A boot clock that moves only when a test moves it. A reboot is a new one
// with another id (and a store opened on it, as a new process would).
class FakeBootClock final : public BootClock {
 public:
  FakeBootClock(BootMs start, std::string boot_id) : now_(start), boot_id_(std::move(boot_id)) {}
  BootMs NowMs() const override { return now_.load(); }
  std::string BootId() const override { return boot_id_; }
  void Advance(Millis by) { now_ += by.count(); }

 private:
  std::atomic<BootMs> now_;
  const std::string boot_id_;
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

// Runs `sequence(seed)` for consecutive seeds and fails at the first one that
// returns a description of what broke. FLEETFS_PROPERTY_SEED fixes the first
// seed (default: random); FLEETFS_PROPERTY_SEQUENCES the count.
inline void RunPropertySequences(std::uint64_t default_count, const char* what,
                                 const std::function<std::string(std::uint64_t)>& sequence) {
  auto env_or = [](const char* name, std::uint64_t fallback) {
    const char* value = std::getenv(name);
    return value != nullptr ? std::strtoull(value, nullptr, 10) : fallback;
  };
  const std::uint64_t base = env_or("FLEETFS_PROPERTY_SEED", std::random_device{}());
  const std::uint64_t count = env_or("FLEETFS_PROPERTY_SEQUENCES", default_count);
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string failure = sequence(base + i);
    ASSERT_EQ(failure, "") << "seed " << base << ", sequence " << i
                           << "; replay with FLEETFS_PROPERTY_SEED=" << base + i
                           << " FLEETFS_PROPERTY_SEQUENCES=1";
  }
  std::printf("property: %llu %s from seed %llu held\n", static_cast<unsigned long long>(count),
              what, static_cast<unsigned long long>(base));
}

}  // namespace fleetfs::lease::testing
