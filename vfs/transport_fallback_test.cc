// The transport's choice when the kernel does not offer FUSE over io_uring:
// `auto` falls back to /dev/fuse and says why, `io_uring` refuses to mount.
// It switches the kernel's `enable_uring` off, which every mount of the
// machine sees: ctest runs it alone (RUN_SERIAL), and it switches it back on.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

  // Mounts with `auto`, expects /dev/fuse with `why` in the reason, and a
  // served mount; unmounts.
  void AutoServesOnDevFuseSaying(const std::string& why) {
    auto fs = MountWith(Transport::kAuto);
    ASSERT_TRUE(fs.ok()) << fs.status().message();
    EXPECT_EQ((*fs)->TransportName(), "/dev/fuse");
    EXPECT_NE((*fs)->TransportWhy().find(why), std::string::npos) << (*fs)->TransportWhy();
    struct stat st;
    EXPECT_EQ(::stat((root_ / "mnt").c_str(), &st), 0) << "the fallback serves";
    (*fs)->Unmount();
  }

  StillClock clock_;
  std::filesystem::path root_;
};

TEST_F(TransportFallbackTest, auto_serves_on_dev_fuse_and_says_the_kernel_did_not_offer_io_uring) {
  AutoServesOnDevFuseSaying("enable_uring: N");
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

// Moves this process into a new cgroup whose cpuset is every online CPU
// but CPU 0 (v1's cpuset hierarchy, or v2's), and back to its own cgroup
// when destroyed, leaving the hierarchy as it was.
class WithoutCpu0 {
 public:
  WithoutCpu0() {
    std::string online;
    std::getline(std::ifstream("/sys/devices/system/cpu/online"), online);
    std::string cpus;  // the online list without CPU 0
    for (std::size_t at = 0; at < online.size();) {
      const std::size_t comma = std::min(online.find(',', at), online.size());
      const std::string part = online.substr(at, comma - at);
      const std::size_t dash = part.find('-');
      int lo = std::stoi(part);
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      if (lo == 0) lo = 1;
      if (lo <= hi) cpus += (cpus.empty() ? "" : ",") + std::to_string(lo) + (lo < hi ? "-" + std::to_string(hi) : "");
      at = comma + 1;
    }
    if (online.rfind('0', 0) != 0 || cpus.empty()) {
      error_ = "needs CPU 0 and another online; online: " + online;
      return;
    }
    // Where this process is now: "N:cpuset:/path" (v1) or "0::/path" (v2).
    std::ifstream self("/proc/self/cgroup");
    std::string v1, v2;
    for (std::string line; std::getline(self, line);) {
      if (line.find(":cpuset:") != std::string::npos) v1 = line.substr(line.find(":cpuset:") + 8);
      if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
    }
    const std::string name = "/fleetfs-test-" + std::to_string(::getpid());
    if (!v1.empty() && std::filesystem::exists("/sys/fs/cgroup/cpuset/cgroup.procs")) {
      home_ = "/sys/fs/cgroup/cpuset" + v1;
      dir_ = "/sys/fs/cgroup/cpuset" + name;
    } else if (!v2.empty() && std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")) {
      home_ = "/sys/fs/cgroup" + v2;
      dir_ = "/sys/fs/cgroup" + name;
      std::string enabled;
      std::getline(std::ifstream("/sys/fs/cgroup/cgroup.subtree_control"), enabled);
      if (enabled.find("cpuset") == std::string::npos) {
        std::ofstream("/sys/fs/cgroup/cgroup.subtree_control") << "+cpuset";
        enabled_cpuset_ = true;
      }
    } else {
      error_ = "no cgroup cpuset controller (v1 or v2) here";
      return;
    }
    std::error_code ec;
    std::filesystem::create_directory(dir_, ec);
    if (ec) {
      error_ = "cannot make " + dir_ + ": " + ec.message();
      dir_.clear();
      return;
    }
    if (std::filesystem::exists(dir_ + "/cpuset.mems")) {
      std::string mems;
      std::getline(std::ifstream("/sys/fs/cgroup/cpuset/cpuset.mems"), mems);
      std::ofstream(dir_ + "/cpuset.mems") << mems;
    }
    std::ofstream(dir_ + "/cpuset.cpus") << cpus;
    std::ofstream(dir_ + "/cgroup.procs") << ::getpid() << std::endl;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) == 0) error_ = "the cpuset " + dir_ + " did not take CPU 0 away";
  }
  ~WithoutCpu0() {
    if (dir_.empty()) return;
    std::ofstream(home_ + "/cgroup.procs") << ::getpid() << std::endl;
    ::rmdir(dir_.c_str());
    if (enabled_cpuset_) std::ofstream("/sys/fs/cgroup/cgroup.subtree_control") << "-cpuset";
  }
  const std::string& error() const { return error_; }

 private:
  std::string home_, dir_, error_;
  bool enabled_cpuset_ = false;
};

// Each CPU's queue takes requests queued behind held lookups only with a
// request made on that CPU (a nudge): an agent whose cpuset leaves a CPU out
// cannot, so `auto` serves on /dev/fuse and says why (found by review: a
// confined agent's nudges went to another CPU's queue, and lookups waited
// for a restore), and `io_uring` refuses to mount.
TEST_F(TransportFallbackTest, an_agent_that_may_not_run_on_every_cpu_does_not_serve_on_io_uring) {
  std::ofstream(kParameter) << "Y";
  WithoutCpu0 confined;
  ASSERT_EQ(confined.error(), "");
  AutoServesOnDevFuseSaying("may not run on CPU 0");
  auto strict = MountWith(Transport::kIoUring);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("may not run on CPU 0"), std::string::npos)
      << strict.status().message();
}

}  // namespace
}  // namespace fleetfs::vfs
