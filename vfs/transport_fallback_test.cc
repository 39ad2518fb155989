// The transport's choice when the kernel does not offer FUSE over io_uring:
// `auto` falls back to /dev/fuse and says why, `io_uring` refuses to mount.
// It switches the kernel's `enable_uring` off, which every mount of the
// machine sees: ctest runs it alone (RUN_SERIAL), and it switches it back on.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "vfs/fleet_fs.h"

namespace fleetfs::vfs {
namespace {

class StillClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return MonoTime(std::chrono::seconds(1000)); }
};

constexpr char kParameter[] = "/sys/module/fuse/parameters/enable_uring";

class TransportFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::geteuid(), 0u) << "a real mount needs root (and /dev/fuse)";
    ASSERT_TRUE(std::filesystem::exists(kParameter)) << "this kernel has no FUSE over io_uring";
    std::random_device random;
    root_ = std::filesystem::temp_directory_path() /
            ("fleetfs-fallback-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(root_ / "backing");
    std::filesystem::create_directories(root_ / "mnt");
    std::ofstream(kParameter) << "N";
  }
  void TearDown() override {
    std::ofstream(kParameter) << "Y";
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  Result<std::unique_ptr<FleetFs>> MountWith(Transport transport) {
    MountOptions options;
    options.backing = (root_ / "backing").string();
    options.mountpoint = (root_ / "mnt").string();
    options.clock = &clock_;
    options.status_json = [] { return std::string("{}\n"); };
    options.transport = transport;
    auto view = ServingView::Make(
        {ServedRange{0, kLastSlot, ServingToken{1, 1}, clock_.Now() + std::chrono::seconds(10)}},
        true);
    return FleetFs::Mount(options, std::make_shared<const ServingView>(*view));
  }

  StillClock clock_;
  std::filesystem::path root_;
};

TEST_F(TransportFallbackTest, auto_serves_on_dev_fuse_and_says_the_kernel_did_not_offer_io_uring) {
  auto fs = MountWith(Transport::kAuto);
  ASSERT_TRUE(fs.ok()) << fs.status().message();
  EXPECT_EQ((*fs)->TransportName(), "/dev/fuse");
  EXPECT_NE((*fs)->TransportWhy().find("enable_uring: N"), std::string::npos)
      << (*fs)->TransportWhy();
  struct stat st;
  EXPECT_EQ(::stat((root_ / "mnt").c_str(), &st), 0) << "the fallback serves";
  (*fs)->Unmount();
}

TEST_F(TransportFallbackTest, io_uring_asked_for_refuses_to_mount_and_says_why) {
  auto fs = MountWith(Transport::kIoUring);
  ASSERT_FALSE(fs.ok());
  EXPECT_NE(fs.status().message().find("transport io_uring"), std::string::npos)
      << fs.status().message();
  EXPECT_NE(fs.status().message().find("enable_uring: N"), std::string::npos)
      << fs.status().message();
  // Nothing is left mounted.
  std::ifstream mounts("/proc/mounts");
  std::string all((std::istreambuf_iterator<char>(mounts)), {});
  EXPECT_EQ(all.find((root_ / "mnt").string()), std::string::npos);
}

}  // namespace
}  // namespace fleetfs::vfs
