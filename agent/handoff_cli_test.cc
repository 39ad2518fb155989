// `fleetfs handoff` and `fleetfs drain` (run as root) against a mount point
// that is not the agent's live mount: a plain directory into which another
// user planted .fleetfs/control (a symlink to a file of root's) and a
// .fleetfs/status.json naming a store of their choosing.
#include "agent/handoff_cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "agent/cli.h"
#include "fleet/clock.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

namespace fs = std::filesystem;

constexpr char kPrecious[] = "root:precious:0:0\n";

class PlantedMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device random;
    root_ = fs::temp_directory_path() /
            ("fleetfs-handoff-cli-" + std::to_string(random()) + std::to_string(random()));
    mount_ = root_ / "mnt";
    target_ = root_ / "shadow";
    fs::create_directories(mount_ / ".fleetfs");
    std::ofstream(target_) << kPrecious;
    fs::create_symlink(target_, mount_ / ".fleetfs" / "control");
    // A store that opens, so nothing but the mount check stops the request.
    SystemWallClock clock;
    auto store = lease::OpenStore("sqlite://" + (root_ / "store.db").string(), clock,
                                  lease::SqliteStore::Access::kCreate);
    ASSERT_TRUE(store.ok()) << store.status().message();
    std::ofstream(mount_ / ".fleetfs" / "status.json")
        << R"({"store": "sqlite://)" << (root_ / "store.db").string()
        << R"(", "owner": "host-a", "ranges": [{"range": "0-16383", "epoch": 1, "serving": true}]})";
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  static std::string Contents(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The error is one line that names the mount and the rule.
  void ExpectClearRefusal(const std::string& err) const {
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(
        err.find(mount_.string() + " is not a running fleetfs mount (it is a plain directory)"),
        std::string::npos)
        << err;
    EXPECT_NE(err.find("only through the agent's own FUSE mount (fuse.fleetfs)"), std::string::npos)
        << err;
  }

  fs::path root_;
  fs::path mount_;   // the agent's mount point, while the agent is down
  fs::path target_;  // a file of root's the planted symlink names
};

TEST_F(PlantedMountTest, drain_undo_writes_nothing_through_a_control_symlink_in_a_plain_directory) {
  std::ostringstream out, err;
  EXPECT_EQ(RunDrain("", /*undo=*/true, mount_.string(), Millis(1000), out, err), kExitFailure);
  EXPECT_EQ(Contents(target_), kPrecious);
  EXPECT_EQ(out.str(), "");
  ExpectClearRefusal(err.str());
}

TEST_F(PlantedMountTest, a_handoff_trusts_no_status_and_writes_no_request_in_a_plain_directory) {
  std::ostringstream out, err;
  EXPECT_EQ(RunHandoff("0-16383", "host-b", mount_.string(), Millis(1000), out, err), kExitFailure);
  EXPECT_EQ(Contents(target_), kPrecious);
  ExpectClearRefusal(err.str());
}

TEST_F(PlantedMountTest, a_drain_to_a_target_writes_nothing_in_a_plain_directory) {
  std::ostringstream out, err;
  EXPECT_EQ(RunDrain("host-b", /*undo=*/false, mount_.string(), Millis(1000), out, err),
            kExitFailure);
  EXPECT_EQ(Contents(target_), kPrecious);
  ExpectClearRefusal(err.str());
}

}  // namespace
}  // namespace fleetfs::agent
