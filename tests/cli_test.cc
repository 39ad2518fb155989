// The fleetfs command as an operator uses it: the built binary, run with
// arguments, judged by its exit code, its output and what it leaves on disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "lease/test_support.h"

extern char** environ;

namespace fleetfs {
namespace {

using lease::testing::TempDir;
using Json = nlohmann::json;

struct Ran {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs the fleetfs binary with `args`, capturing its output in files. With
// `journal`, its stderr is what JOURNAL_STREAM names, as under systemd.
Ran Fleetfs(const std::vector<std::string>& args, bool journal = false) {
  TempDir io;
  const std::string out_path = io.File("out");
  const std::string err_path = io.File("err");
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).substr(0, 15) != "JOURNAL_STREAM=") env_text.emplace_back(*e);
  }
  if (journal) {
    std::ofstream(err_path, std::ios::binary).flush();
    struct stat st {};
    if (stat(err_path.c_str(), &st) != 0) return {};
    env_text.push_back("JOURNAL_STREAM=" + std::to_string(st.st_dev) + ":" +
                       std::to_string(st.st_ino));
  }
  std::vector<char*> env;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<std::string> all = {FLEETFS_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : all) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT, 0600);
  pid_t pid = 0;
  Ran ran;
  if (posix_spawn(&pid, FLEETFS_BINARY, &actions, nullptr, argv.data(), env.data()) == 0) {
    // A `fleetfs mount` that should have been refused serves until stopped:
    // stop it (SIGTERM unmounts) rather than hang the suite.
    int status = 0;
    for (int waited_ms = 0; waitpid(pid, &status, WNOHANG) == 0; waited_ms += 10) {
      if (waited_ms == 30'000) kill(pid, SIGTERM);
      usleep(10'000);
    }
    ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  ran.out = Slurp(out_path);
  ran.err = Slurp(err_path);
  return ran;
}

int Lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

class LeaseCommand : public ::testing::Test {
 protected:
  std::string Store() const { return "sqlite://" + dir_.File("control.db"); }
  std::string Control() const { return dir_.File("control.db"); }
  Ran Claim(const std::string& owner, const std::string& range,
            std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"lease", "claim", "--store", Store(), "--owner", owner,
                                     "--range", range};
    args.insert(args.end(), more.begin(), more.end());
    return Fleetfs(args);
  }
  Ran Verb(const std::string& verb, const std::string& owner, const std::string& range,
           const std::string& epoch) {
    return Fleetfs({"lease", verb, "--store", Store(), "--owner", owner, "--range", range,
                    "--epoch", epoch});
  }
  Json Ls() {
    const Ran ran = Fleetfs({"lease", "ls", "--store", Store(), "--json"});
    EXPECT_EQ(ran.code, 0) << ran.err;
    return Json::parse(ran.out);
  }
  TempDir dir_;
};

TEST(SlotCommand, prints_slot_bucket_and_both_paths) {
  const Ran ran = Fleetfs({"slot", "123456789", "{user1000}.following", "{user1000}.followers"});
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_NE(ran.out.find("123456789             12739  199     199/slot-12739.db  199/123456789.db"),
            std::string::npos)
      << ran.out;
  EXPECT_NE(ran.out.find("{user1000}.following  3443   053     053/slot-03443.db  (not a tenant "
                         "id: byte 0 is '{')"),
            std::string::npos)
      << ran.out;
}

TEST(SlotCommand, json_lists_key_and_slot_for_every_key) {
  const Ran ran = Fleetfs({"slot", "--json", "foo{}{bar}", "foo{{bar}}zap", "{bar", "acme"});
  ASSERT_EQ(ran.code, 0) << ran.err;
  const Json list = Json::parse(ran.out);
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0]["key"], "foo{}{bar}");
  EXPECT_EQ(list[1]["slot"], list[2]["slot"]) << "foo{{bar}}zap hashes {bar";
  EXPECT_EQ(list[3]["tenant_path"], "176/acme.db");
  EXPECT_EQ(list[3]["slot"], 11304);
  EXPECT_TRUE(list[0]["tenant_path"].is_null());
  EXPECT_NE(list[0]["tenant_error"].get<std::string>().find("1 to 128 bytes"), std::string::npos);
}

TEST(SlotCommand, tenant_mode_refuses_a_bad_tenant_id_in_one_line) {
  for (const std::string& bad : {std::string(""), std::string(129, 'x'), std::string(".hidden"),
                                std::string("a b"), std::string("x/y")}) {
    const Ran ran = Fleetfs({"slot", "--mode", "tenant", "acme", bad});
    EXPECT_EQ(ran.code, 2) << bad;
    EXPECT_EQ(ran.out, "") << "nothing printed for the good key either";
    EXPECT_EQ(Lines(ran.err), 1) << ran.err;
    EXPECT_EQ(ran.err.rfind("fleetfs: tenant id '", 0), 0u) << ran.err;
    EXPECT_NE(ran.err.find("1 to 128 bytes of A-Z a-z 0-9 - _ ."), std::string::npos);
  }
}

TEST_F(LeaseCommand, claim_ls_renew_release_round_trip) {
  Ran ran = Claim("host-a", "0-8191");
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(ran.out.rfind("claimed 0-8191 for 'host-a' at epoch 1 (new) until ", 0), 0u)
      << ran.out;
  ran = Verb("renew", "host-a", "0-8191", "1");
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(ran.out.rfind("renewed 0-8191 for 'host-a' at epoch 1 until", 0), 0u) << ran.out;

  Json table = Ls();
  ASSERT_EQ(table["rows"].size(), 1u);
  EXPECT_EQ(table["rows"][0]["owner"], "host-a");
  EXPECT_EQ(table["rows"][0]["epoch"], 1);
  EXPECT_EQ(table["rows"][0]["lapsed"], false);
  EXPECT_GT(table["rows"][0]["left_ms"].get<long>(), 25'000);

  ran = Fleetfs({"lease", "ls", "--store", Store()});
  ASSERT_EQ(ran.code, 0);
  EXPECT_NE(ran.out.find("RANGE   OWNER   EPOCH  LEASE EXPIRES"), std::string::npos) << ran.out;
  EXPECT_NE(ran.out.find("0-8191  host-a  1      "), std::string::npos) << ran.out;

  ran = Verb("release", "host-a", "0-8191", "1");
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(Ls()["rows"][0]["lapsed"], true);
  ran = Fleetfs({"lease", "ls", "--store", Store()});
  EXPECT_NE(ran.out.find("lapsed"), std::string::npos) << ran.out;
  // Released, so another owner claims at once, at a new epoch.
  ran = Claim("host-b", "0-8191");
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_NE(ran.out.find("at epoch 2 (new)"), std::string::npos) << ran.out;
}

TEST_F(LeaseCommand, where_names_the_owner_epoch_and_lease_end_of_each_keys_slot) {
  ASSERT_EQ(Claim("host-a", "0-8191").code, 0);
  ASSERT_EQ(Claim("host-b", "8192-16383").code, 0);
  Ran ran = Fleetfs({"where", "--json", "{user1000}.following", "acme", "--store", Store()});
  ASSERT_EQ(ran.code, 0) << ran.err;
  const Json doc = Json::parse(ran.out);
  ASSERT_EQ(doc["keys"].size(), 2u);
  EXPECT_EQ(doc["keys"][0]["slot"], 3443);
  EXPECT_EQ(doc["keys"][0]["range"], "0-8191");
  EXPECT_EQ(doc["keys"][0]["owner"], "host-a");
  EXPECT_EQ(doc["keys"][0]["epoch"], 1);
  EXPECT_EQ(doc["keys"][0]["served"], true);
  EXPECT_GT(doc["keys"][0]["left_ms"].get<std::int64_t>(), 20'000) << "a 30 s lease just taken";
  EXPECT_EQ(doc["keys"][1]["slot"], 11304);
  EXPECT_EQ(doc["keys"][1]["owner"], "host-b");
  EXPECT_EQ(doc["keys"][1]["epoch"], 2);
  ran = Fleetfs({"where", "acme", "--store", Store()});
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_NE(ran.out.find("KEY   SLOT   RANGE       OWNER   EPOCH  LEASE EXPIRES"),
            std::string::npos)
      << ran.out;
  EXPECT_NE(ran.out.find("acme  11304  8192-16383  host-b  2      "), std::string::npos) << ran.out;
}

TEST_F(LeaseCommand, where_exits_6_when_a_keys_slot_is_unclaimed_or_its_lease_lapsed) {
  ASSERT_EQ(Claim("host-a", "0-8191").code, 0);
  Ran ran = Fleetfs({"where", "--json", "{user1000}.following", "acme", "--store", Store()});
  EXPECT_EQ(ran.code, 6) << ran.err;
  Json doc = Json::parse(ran.out);
  EXPECT_EQ(doc["keys"][0]["served"], true);
  EXPECT_EQ(doc["keys"][1]["served"], false);
  EXPECT_TRUE(doc["keys"][1]["owner"].is_null()) << "slot 11304 was never claimed";
  ASSERT_EQ(Verb("release", "host-a", "0-8191", "1").code, 0);
  ran = Fleetfs({"where", "{user1000}.following", "--store", Store()});
  EXPECT_EQ(ran.code, 6) << ran.err;
  EXPECT_NE(ran.out.find("(nobody: host-a's lease lapsed)"), std::string::npos) << ran.out;
}

TEST_F(LeaseCommand, where_refuses_a_bad_store_url_and_a_missing_store) {
  Ran ran = Fleetfs({"where", "acme", "--store", "sqlite://relative.db"});
  EXPECT_EQ(ran.code, 2) << ran.err;
  EXPECT_EQ(ran.out, "");
  ran = Fleetfs({"where", "acme", "--store", Store()});
  EXPECT_EQ(ran.code, 1) << "no control database yet: " << ran.err;
  EXPECT_NE(ran.err.find(Control()), std::string::npos) << ran.err;
}

TEST_F(LeaseCommand, a_held_range_exits_3_naming_the_holder_and_until_when) {
  ASSERT_EQ(Claim("host-a", "0-99").code, 0);
  const Ran ran = Claim("host-b", "50-60");
  EXPECT_EQ(ran.code, 3);
  EXPECT_EQ(ran.out, "");
  EXPECT_EQ(Lines(ran.err), 1);
  EXPECT_EQ(ran.err.rfind("fleetfs: slot range 0-99 is held by 'host-a' until ", 0), 0u)
      << ran.err;
}

TEST_F(LeaseCommand, a_lost_range_exits_4) {
  ASSERT_EQ(Claim("host-a", "0-99").code, 0);
  for (const char* verb : {"renew", "release"}) {
    const Ran ran = Verb(verb, "host-a", "0-99", "7");
    EXPECT_EQ(ran.code, 4) << verb;
    EXPECT_EQ(Lines(ran.err), 1);
    EXPECT_NE(ran.err.find("was lost: it is not held by 'host-a' at epoch 7"), std::string::npos)
        << ran.err;
  }
  EXPECT_EQ(Verb("renew", "host-b", "0-99", "1").code, 4) << "another owner";
  EXPECT_EQ(Verb("renew", "host-a", "0-98", "1").code, 4) << "other bounds";
}

TEST_F(LeaseCommand, a_claim_above_a_floor_skips_to_a_higher_epoch) {
  const Ran ran = Claim("host-a", "0-99", {"--epoch", "41"});
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_NE(ran.out.find("at epoch 42 (new)"), std::string::npos) << ran.out;
  EXPECT_EQ(Ls()["last_epoch"], 42);
}

// The test-only wall offset (FLEETFS_TEST_WALL_OFFSET_FILE) set for the
// commands this test runs; written by rename, as the variable asks.
class WallOffset {
 public:
  explicit WallOffset(const TempDir& dir) : path_(dir.File("wall-offset")) {
    ::setenv("FLEETFS_TEST_WALL_OFFSET_FILE", path_.c_str(), 1);
  }
  ~WallOffset() { ::unsetenv("FLEETFS_TEST_WALL_OFFSET_FILE"); }
  void Set(const std::string& text) {
    std::ofstream(path_ + ".new") << text;
    std::filesystem::rename(path_ + ".new", path_);
  }

 private:
  std::string path_;
};

long RealWallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST_F(LeaseCommand, ls_shows_expiries_as_wall_times_and_a_wall_step_moves_only_the_display) {
  WallOffset offset(dir_);  // missing file: no offset
  const long before = RealWallMs();
  ASSERT_EQ(Claim("host-a", "0-99").code, 0);
  const long after = RealWallMs();
  Json table = Ls();
  const long expires = table["rows"][0]["lease_expires_ms"].get<long>();
  EXPECT_GE(expires, before + 30'000) << "not a wall time";
  EXPECT_LE(expires, RealWallMs() + 30'000);
  EXPECT_GE(table["now_ms"].get<long>(), after);

  for (const long step : {3'600'000L, -3'600'000L}) {
    offset.Set(std::to_string(step) + "\n");
    table = Ls();
    // Displayed an hour off, as the wall clock is; the lease is as live as before.
    EXPECT_NEAR(table["rows"][0]["lease_expires_ms"].get<long>(), expires + step, 2'000);
    EXPECT_NEAR(table["now_ms"].get<long>(), RealWallMs() + step, 2'000);
    EXPECT_EQ(table["rows"][0]["lapsed"], false) << step;
    EXPECT_GT(table["rows"][0]["left_ms"].get<long>(), 20'000) << step;
    const Ran held = Claim("host-b", "0-99");
    EXPECT_EQ(held.code, 3) << "a wall step of " << step << " ms let another owner claim";
  }
}

TEST_F(LeaseCommand, a_malformed_wall_offset_file_is_refused_before_anything_runs) {
  WallOffset offset(dir_);
  offset.Set("one hour");
  const Ran ran = Claim("host-a", "0-99");
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("FLEETFS_TEST_WALL_OFFSET_FILE"), std::string::npos) << ran.err;
  EXPECT_NE(ran.err.find("one signed integer of milliseconds"), std::string::npos) << ran.err;
  EXPECT_FALSE(std::filesystem::exists(Control()));
}

// Every bad value: one line that names it and its rule, exit 2, and the
// control database is neither created nor changed.
TEST_F(LeaseCommand, bad_input_prints_one_line_exits_2_and_changes_nothing) {
  ASSERT_EQ(Claim("host-a", "0-99").code, 0);
  const std::string before = Slurp(Control());
  const std::string fresh = "sqlite://" + dir_.File("fresh.db");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string store = Store();
  auto claim = [&](const std::string& owner, const std::string& range,
                   std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"lease", "claim", "--store", fresh, "--owner", owner,
                                     "--range", range};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  const std::vector<Case> cases = {
      {claim("a", ""), "slot range '': empty"},
      {claim("a", "9-1"), "slot range '9-1': the first slot is above the last"},
      {claim("a", "0-16384"), "slot range '0-16384': a slot is above 16383"},
      {claim("a", "a-b"), "slot range 'a-b': not a slot number"},
      {claim("a", "1-2-3"), "slot range '1-2-3': not a slot number"},
      {claim("", "1"), "owner id '': empty"},
      {claim(std::string(129, 'o'), "1"), "is 129 bytes"},
      {claim("a\x01z", "1"), "owner id 'a\\x01z': has a control character"},
      {claim("host-\xff", "1"), "owner id 'host-\\xff': is not valid UTF-8"},
      {claim("host-a\xc2\xa0", "1"), "has white space at an end"},
      {claim("\xe3\x80\x80host-a", "1"), "has white space at an end"},
      {claim("host\xc2\x85" "a", "1"), "has a control character"},
      {claim("a", "1", {"--ttl", "30"}), "ttl '30': a duration needs its unit"},
      {claim(" host-a", "1"), "owner id ' host-a': has white space at an end"},
      {claim("host-a ", "1"), "owner id 'host-a ': has white space at an end"},
      {claim("a", "1", {"--ttl", "2s"}), "ttl 2s: a lease lasts 3s to 3600s"},
      {claim("a", "1", {"--ttl", "3601s"}), "ttl 3601s: a lease lasts 3s to 3600s"},
      {claim("a", "1", {"--ttl", "soon"}), "ttl 'soon': not a duration"},
      {claim("a", "1", {"--epoch", "x"}), "epoch 'x': an epoch is a whole number"},
      {{"lease", "renew", "--store", fresh, "--owner", "a", "--range", "1"},
       "--epoch is required"},
      {{"lease", "claim", "--store", "sqlite://relative.db", "--owner", "a", "--range", "1"},
       "store URL 'sqlite://relative.db': the control database path must be absolute"},
      {{"lease", "claim", "--store", "etcd://127.0.0.1:2379", "--owner", "a", "--range", "1"},
       "store URL 'etcd://127.0.0.1:2379': no key prefix"},
      {{"lease", "claim", "--store", "zk://127.0.0.1:2181/x", "--owner", "a", "--range", "1"},
       "unknown scheme 'zk'"},
      {{"lease", "ls", "--store", fresh, "--store-ca", "/ca.pem"},
       "store_ca: TLS files are for an etcds:// store only"},
      {{"lease", "claim", "--store", fresh, "--range", "1"}, "--owner is required"},
      {{"lease", "claim", "--store", store, "--owner", "a", "--range", "0-16384"},
       "a slot is above 16383"},
  };
  for (const Case& c : cases) {
    const Ran ran = Fleetfs(c.args);
    EXPECT_EQ(ran.code, 2) << c.says << "\n" << ran.err;
    EXPECT_EQ(ran.out, "") << c.says;
    EXPECT_EQ(Lines(ran.err), 1) << ran.err;
    EXPECT_NE(ran.err.find(c.says), std::string::npos) << ran.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.File("fresh.db")));
  EXPECT_TRUE(Slurp(Control()) == before) << "the control database changed";
}

TEST_F(LeaseCommand, a_store_that_cannot_be_opened_exits_1_naming_it) {
  const std::string missing = dir_.File("no/such/dir/control.db");
  Ran ran = Fleetfs({"lease", "claim", "--store", "sqlite://" + missing, "--owner", "a",
                     "--range", "1"});
  EXPECT_EQ(ran.code, 1);
  EXPECT_EQ(Lines(ran.err), 1) << ran.err;
  EXPECT_NE(ran.err.find("control database " + missing), std::string::npos) << ran.err;
  ran = Fleetfs({"lease", "ls", "--store", Store()});
  EXPECT_EQ(ran.code, 1);
  EXPECT_NE(ran.err.find("No such file or directory"), std::string::npos) << ran.err;
  EXPECT_FALSE(std::filesystem::exists(Control())) << "listing creates nothing";
}

TEST_F(LeaseCommand, a_control_file_that_is_not_a_database_exits_1_and_is_left_alone) {
  const std::string junk = "this is not a database\n" + std::string(2000, '#');
  std::ofstream(Control(), std::ios::binary) << junk;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"lease", "ls", "--store", Store()},
        std::vector<std::string>{"lease", "claim", "--store", Store(), "--owner", "a", "--range",
                                 "1"}}) {
    const Ran ran = Fleetfs(args);
    EXPECT_EQ(ran.code, 1);
    EXPECT_EQ(Lines(ran.err), 1) << ran.err;
    EXPECT_NE(ran.err.find("not a SQLite database"), std::string::npos) << ran.err;
  }
  EXPECT_TRUE(Slurp(Control()) == junk);
}

// `fleetfs mount` with a bad value: exit 2, one line naming the key, and
// nothing touched (no BACKING/.fleetfs, no control database).
class MountCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    backing_ = dir_.File("backing");
    mount_ = dir_.File("mnt");
    std::filesystem::create_directories(backing_);
    std::filesystem::create_directories(mount_);
  }
  Ran Mount(std::vector<std::string> more, const std::string& toml = "", bool journal = false) {
    std::vector<std::string> args = {"mount", "--backing", backing_, "--mount", mount_,
                                     "--admin", "off"};
    if (std::find(more.begin(), more.end(), "--store") == more.end()) {
      args.insert(args.end(), {"--store", "sqlite://" + dir_.File("control.db")});
    }
    if (!toml.empty()) {
      std::ofstream(dir_.File("agent.toml"), std::ios::binary) << toml;
      args.insert(args.end(), {"--config", dir_.File("agent.toml")});
    }
    args.insert(args.end(), more.begin(), more.end());
    return Fleetfs(args, journal);
  }
  void ExpectRefused(const Ran& ran, const std::string& says) {
    EXPECT_EQ(ran.code, 2) << says << "\n" << ran.err;
    EXPECT_EQ(Lines(ran.err), 1) << ran.err;
    EXPECT_NE(ran.err.find(says), std::string::npos) << ran.err;
    EXPECT_FALSE(std::filesystem::exists(backing_ + "/.fleetfs")) << says << ": touched BACKING";
    EXPECT_FALSE(std::filesystem::exists(dir_.File("control.db"))) << says;
  }
  TempDir dir_;
  std::string backing_, mount_;
};

TEST_F(MountCommand, owner_ids_and_paths_that_are_not_utf8_are_refused_naming_the_key) {
  ExpectRefused(Mount({"--owner", "host-\xff"}), "owner: owner id 'host-\\xff': is not valid UTF-8");
  ExpectRefused(Mount({}, "owner = \"host-a\u00a0\"\n"), "owner: owner id");
  const std::string odd = dir_.File("back\xff");
  std::filesystem::create_directories(odd);
  ExpectRefused(Mount({"--backing", odd}), "backing: ");
  EXPECT_FALSE(std::filesystem::exists(odd + "/.fleetfs"));
  ExpectRefused(Mount({"--store", "sqlite://" + dir_.File("c\xfe.db")}), "store: ");
}

// The unit's `fleetfs mount` refused: journald files the line as an error
// (`journalctl -p err` shows it), and a terminal sees no "<3>".
TEST_F(MountCommand, a_refusal_under_systemd_is_filed_as_an_error) {
  const Ran bad_value = Mount({}, "ttl = \"30\"\n", /*journal=*/true);
  EXPECT_EQ(bad_value.code, 2);
  const std::string says = "<3>fleetfs: config file " + dir_.File("agent.toml") + ": ttl: ";
  EXPECT_EQ(bad_value.err.rfind(says, 0), 0u) << bad_value.err;
  const Ran bad_flag = Mount({"--no-such-flag"}, "", /*journal=*/true);
  EXPECT_EQ(bad_flag.code, 2);
  EXPECT_EQ(bad_flag.err.rfind("<3>fleetfs: ", 0), 0u) << bad_flag.err;
  EXPECT_EQ(Lines(bad_flag.err), 1) << bad_flag.err;
  const Ran on_a_terminal = Mount({}, "ttl = \"30\"\n");
  EXPECT_EQ(on_a_terminal.err.rfind("fleetfs: config file ", 0), 0u) << on_a_terminal.err;
}

TEST_F(MountCommand, a_flag_does_not_hide_a_wrong_value_in_the_file) {
  ExpectRefused(Mount({"--ttl", "6s"}, "ttl = true\n"), "ttl: ");
  ExpectRefused(Mount({"--ranges", "0-99"}, "ranges = \"9-1\"\n"), "ranges: ");
  ExpectRefused(Mount({"--owner", "host-a"}, "owner = \" host-a\"\n"), "owner: ");
}

TEST_F(MountCommand, bare_numbers_are_refused_where_a_unit_or_a_range_is_meant) {
  ExpectRefused(Mount({}, "sync_interval = 200\n"), "sync_interval: a duration is a string");
  ExpectRefused(Mount({}, "ttl = 30\n"), "ttl: a duration is a string");
  ExpectRefused(Mount({}, "shutdown_grace = 2.5\n"), "shutdown_grace: a duration is a string");
  ExpectRefused(Mount({}, "ttl = \"30\"\n"), "ttl '30': a duration needs its unit");
  ExpectRefused(Mount({"--sync-interval", "200"}), "a duration needs its unit");
  ExpectRefused(Mount({}, "ranges = 5\n"), "ranges: ranges are a string");
}

TEST_F(MountCommand, a_store_that_cannot_be_used_is_refused_before_anything_is_touched) {
  const std::string text = dir_.File("notes.txt");
  std::ofstream(text) << "these are my notes, not a control database\n";
  ExpectRefused(Mount({"--store", "sqlite://" + text}), "store: " + text +
                                                             " exists and is not a SQLite database");
  EXPECT_EQ(Slurp(text), "these are my notes, not a control database\n");
  ExpectRefused(Mount({"--store", "sqlite://" + dir_.File("missing/control.db")}),
                "store: the directory " + dir_.File("missing") + " of the control database");
}

TEST_F(MountCommand, s3_flags_are_checked_and_refused_without_an_s3_replica) {
  ExpectRefused(Mount({"--replica-endpoint", "ftp://minio"}),
                "replica_endpoint: 'ftp://minio' is not an http:// or https:// URL");
  ExpectRefused(Mount({"--replica-region", "EU-WEST-1"}),
                "replica_region: 'EU-WEST-1' is not a region name");
  ExpectRefused(Mount({"--replica-path-style", "yes"}),
                "replica_path_style: 'yes' must be true or false");
  const std::string replica = "file://" + dir_.File("replica");
  ExpectRefused(Mount({"--replica", replica, "--replica-endpoint", "http://127.0.0.1:9000"}),
                "replica_endpoint: applies only to an s3:// replica, and the replica is " +
                    replica);
  ExpectRefused(Mount({"--replica-region", "eu-west-1"}),
                "replica_region: applies only to an s3:// replica, and replication is off");
  ExpectRefused(Mount({"--replica-path-style", "false"}, "replica = \"" + replica + "\"\n"),
                "replica_path_style: applies only to an s3:// replica");
  ExpectRefused(Mount({}, "replica_path_style = \"true\"\n"),
                "replica_path_style: must be true or false (unquoted)");
  EXPECT_FALSE(std::filesystem::exists(dir_.File("replica")));
}

TEST(Help, describes_commands_and_exit_status) {
  Ran ran = Fleetfs({"--help"});
  EXPECT_EQ(ran.code, 0);
  for (const char* part : {"slot", "lease", "EXIT STATUS", "3  the range is held"}) {
    EXPECT_NE(ran.out.find(part), std::string::npos) << part;
  }
  ran = Fleetfs({"lease", "claim", "--help"});
  EXPECT_EQ(ran.code, 0);
  for (const char* part : {"--store", "--owner", "--range", "--ttl", "--epoch", "EXAMPLES"}) {
    EXPECT_NE(ran.out.find(part), std::string::npos) << part;
  }
  ran = Fleetfs({"--version"});
  EXPECT_EQ(ran.code, 0);
  EXPECT_EQ(ran.out, "fleetfs 0.1.0\n");
  ran = Fleetfs({"frobnicate"});
  EXPECT_EQ(ran.code, 2);
  EXPECT_EQ(ran.err, "fleetfs: unknown command 'frobnicate'; run 'fleetfs --help'\n");
}

TEST(ReplicaCommands, bad_input_is_named_and_no_output_file_is_left) {
  TempDir dir;
  const std::string replica = "file://" + dir.File("replica");
  std::filesystem::create_directories(dir.File("replica"));
  const std::string out = dir.File("out.db");
  Ran ran = Fleetfs({"restore", "acme", "--replica", "gs://bucket", "-o", out});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("file:///ABSOLUTE/DIR or s3://BUCKET"), std::string::npos) << ran.err;
  ran = Fleetfs({"restore", "acme", "--replica", replica, "--at", "yesterday", "-o", out});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("--at 'yesterday'"), std::string::npos) << ran.err;
  ran = Fleetfs({"restore", "bad id!", "--replica", replica, "-o", out});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("tenant id"), std::string::npos) << ran.err;
  ran = Fleetfs({"restore", "acme", "--replica", "file://" + dir.File("absent"), "-o", out});
  EXPECT_EQ(ran.code, 1);
  EXPECT_NE(ran.err.find("is not a directory"), std::string::npos) << ran.err;
  EXPECT_FALSE(std::filesystem::exists(dir.File("absent")));  // reading makes nothing
  ran = Fleetfs({"restore", "acme", "--replica", replica, "-o", out});
  EXPECT_EQ(ran.code, 1);
  EXPECT_NE(ran.err.find("holds nothing for 176/acme.db"), std::string::npos) << ran.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  ran = Fleetfs({"replica", "ls", "acme", "--replica", replica});
  EXPECT_EQ(ran.code, 1);
  std::ofstream(out) << "keep me";
  ran = Fleetfs({"restore", "acme", "--replica", replica, "-o", out});
  EXPECT_EQ(ran.code, 1);
  EXPECT_NE(ran.err.find("restore never overwrites"), std::string::npos) << ran.err;
  EXPECT_EQ(Slurp(out), "keep me");
}

TEST(ReplicaCommands, s3_flags_are_checked_and_refused_without_an_s3_replica) {
  TempDir dir;
  const std::string replica = "file://" + dir.File("replica");
  std::filesystem::create_directories(dir.File("replica"));
  const std::string out = dir.File("out.db");
  // Values are checked before the URL, so these hold whether or not s3://
  // destinations are built: nothing is reached.
  Ran ran = Fleetfs({"restore", "acme", "--replica", "s3://bucket/prefix", "--replica-region",
                     "EU", "-o", out});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_region: 'EU' is not a region name"), std::string::npos)
      << ran.err;
  ran = Fleetfs({"replica", "ls", "acme", "--replica", "s3://bucket/prefix",
                 "--replica-endpoint", "http://minio:9000/bucket"});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_endpoint: 'http://minio:9000/bucket' has a path"),
            std::string::npos)
      << ran.err;
  ran = Fleetfs({"replica", "verify", "acme", "--replica", "s3://bucket/prefix",
                 "--replica-path-style", "on"});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_path_style: 'on' must be true or false"), std::string::npos)
      << ran.err;
  ran = Fleetfs({"restore", "acme", "--replica", replica, "--replica-endpoint",
                 "https://s3.eu-west-1.amazonaws.com", "-o", out});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_endpoint: applies only to an s3:// replica, and the replica "
                         "is " + replica),
            std::string::npos)
      << ran.err;
  ran = Fleetfs({"replica", "ls", "acme", "--replica", replica, "--replica-region", "eu-west-1"});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_region: applies only to an s3:// replica"), std::string::npos)
      << ran.err;
  ran = Fleetfs({"replica", "verify", "acme", "--replica", replica, "--replica-path-style",
                 "true"});
  EXPECT_EQ(ran.code, 2);
  EXPECT_NE(ran.err.find("replica_path_style: applies only to an s3:// replica"),
            std::string::npos)
      << ran.err;
  // Unset values ("") go with any replica: the file:// log is read as before.
  ran = Fleetfs({"restore", "acme", "--replica", replica, "--replica-region", "", "-o", out});
  EXPECT_EQ(ran.code, 1);
  EXPECT_NE(ran.err.find("holds nothing for 176/acme.db"), std::string::npos) << ran.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(ReplicaCommands, help_describes_the_s3_flags_and_where_credentials_come_from) {
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"mount", "--help"}, {"restore", "--help"},
        {"replica", "ls", "--help"}, {"replica", "verify", "--help"}}) {
    Ran ran = Fleetfs(command);
    EXPECT_EQ(ran.code, 0);
    for (const char* part : {"--replica-endpoint", "--replica-region", "--replica-path-style",
                             "s3://BUCKET/PREFIX"}) {
      EXPECT_NE(ran.out.find(part), std::string::npos) << command[0] << ": " << part;
    }
  }
  for (const char* command : {"mount", "restore", "replica"}) {
    Ran ran = Fleetfs({command, "--help"});
    for (const char* part :
         {"S3 REPLICAS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
          "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials", "never logged"}) {
      EXPECT_NE(ran.out.find(part), std::string::npos) << command << ": " << part;
    }
    // Before the examples, not after them.
    EXPECT_LT(ran.out.find("S3 REPLICAS"), ran.out.find("EXAMPLES")) << command;
  }
}

TEST(ReplicaCommands, help_describes_point_in_time_and_verify) {
  Ran ran = Fleetfs({"restore", "--help"});
  EXPECT_EQ(ran.code, 0);
  for (const char* part : {"--at", "-o", "never overwrites", "EXAMPLES", "@MILLISECONDS"}) {
    EXPECT_NE(ran.out.find(part), std::string::npos) << part;
  }
  ran = Fleetfs({"replica", "--help"});
  EXPECT_EQ(ran.code, 0);
  for (const char* part : {"ls", "verify", "integrity_check"}) {
    EXPECT_NE(ran.out.find(part), std::string::npos) << part;
  }
  ran = Fleetfs({"mount", "--help"});
  for (const char* part : {"--replica", "--sync-interval", "REPLICATION", "retention"}) {
    EXPECT_NE(ran.out.find(part), std::string::npos) << part;
  }
}

}  // namespace
}  // namespace fleetfs
