#include "agent/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lease/test_support.h"

namespace fleetfs::agent {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backing_ = dir_.path().string() + "/backing";
    mount_ = dir_.path().string() + "/mnt";
    ASSERT_EQ(::mkdir(backing_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(mount_.c_str(), 0755), 0);
  }
  ConfigInput Input() {
    ConfigInput in;
    in.backing = backing_;
    in.mountpoint = mount_;
    in.store = "sqlite://" + dir_.path().string() + "/control.db";
    return in;
  }
  std::string WriteFile(const std::string& text) {
    std::string path = dir_.path().string() + "/agent.toml";
    std::ofstream(path) << text;
    return path;
  }
  std::string Error(const ConfigInput& in) {
    auto config = ResolveConfig(in);
    EXPECT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), Code::kInvalidArgument);
    return config.ok() ? "" : config.status().message();
  }

  lease::testing::TempDir dir_;
  std::string backing_, mount_;
};

TEST_F(ConfigTest, defaults_fill_what_is_not_given) {
  auto config = ResolveConfig(Input());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->mode, FleetMode::kTenant);
  ASSERT_EQ(config->ranges.size(), 1u);
  EXPECT_EQ(config->ranges[0], lease::SlotRange::All());
  EXPECT_EQ(config->ttl, Millis(30000));
  ASSERT_TRUE(config->admin.has_value());
  EXPECT_EQ(config->admin->ToString(), "127.0.0.1:7878");
  EXPECT_TRUE(config->allow_create);
  EXPECT_FALSE(config->owner.str().empty());
}

TEST_F(ConfigTest, the_file_gives_values_and_flags_win_over_it) {
  ConfigInput in = Input();
  in.config_file = WriteFile(
      "mode = \"slot\"\nowner = \"host-a\"\nranges = [\"0-99\", \"200-299\"]\nttl = \"9s\"\n"
      "admin = \"off\"\nno_create = true\n");
  in.ttl = "12s";
  auto config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->mode, FleetMode::kSlot);
  EXPECT_EQ(config->owner.str(), "host-a");
  ASSERT_EQ(config->ranges.size(), 2u);
  EXPECT_EQ(config->ranges[1].ToString(), "200-299");
  EXPECT_EQ(config->ttl, Millis(12000));
  EXPECT_FALSE(config->admin.has_value());
  EXPECT_FALSE(config->allow_create);
}

TEST_F(ConfigTest, an_etcds_store_takes_its_tls_files_from_the_file_or_flags) {
  const std::string ca = dir_.path().string() + "/ca.pem";
  std::ofstream(ca) << "not checked here, only readable";
  ConfigInput in = Input();
  in.store.reset();  // the file's store
  in.config_file = WriteFile("store = \"etcds://10.0.0.1:2379,10.0.0.2:2379/fleet\"\nstore_ca = \"" +
                             ca + "\"\n");
  auto config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->store, "etcds://10.0.0.1:2379,10.0.0.2:2379/fleet");
  EXPECT_EQ(config->store_tls.ca, ca);
  EXPECT_TRUE(config->store_tls.cert.empty());
}

TEST_F(ConfigTest, tls_files_that_do_not_fit_the_store_are_refused_naming_the_key) {
  ConfigInput in = Input();
  in.store_ca = dir_.path().string() + "/ca.pem";  // a sqlite:// store
  EXPECT_NE(Error(in).find("store_ca: TLS files are for an etcds:// store only"), std::string::npos);
  in = Input();
  in.store = "etcds://10.0.0.1:2379/fleet";
  in.store_cert = dir_.path().string() + "/cert.pem";
  EXPECT_NE(Error(in).find("store_key: a client certificate (store_cert) and its key"),
            std::string::npos);
  in = Input();
  in.store = "etcds://10.0.0.1:2379/fleet";
  in.store_ca = dir_.path().string() + "/missing.pem";
  EXPECT_NE(Error(in).find("store_ca: " + dir_.path().string() + "/missing.pem: No such file"),
            std::string::npos);
  in.store_ca = dir_.path().string();  // a directory passes access(R_OK)
  EXPECT_NE(Error(in).find("store_ca: " + dir_.path().string() + " is not a regular file"),
            std::string::npos);
  in = Input();
  in.store_ca = "relative.pem";
  EXPECT_NE(Error(in).find("store_ca: 'relative.pem' must be an absolute path"), std::string::npos);
}

TEST_F(ConfigTest, each_bad_value_is_refused_with_its_key_named) {
  ConfigInput in = Input();
  in.ranges = "9-1";
  EXPECT_NE(Error(in).find("ranges: "), std::string::npos);
  in = Input();
  in.ranges = "0-100,50-200";
  EXPECT_NE(Error(in).find("overlap"), std::string::npos);
  in = Input();
  in.ttl = "1s";
  EXPECT_NE(Error(in).find("ttl: "), std::string::npos);
  in = Input();
  in.owner = " host";
  EXPECT_NE(Error(in).find("owner: "), std::string::npos);
  in = Input();
  in.mode = "tenants";
  EXPECT_NE(Error(in).find("mode: "), std::string::npos);
  in = Input();
  in.store = "etcd://x";
  EXPECT_NE(Error(in).find("store: "), std::string::npos);
  in = Input();
  in.admin = "0.0.0.0:7878";
  EXPECT_NE(Error(in).find("admin: "), std::string::npos);
  in = Input();
  in.admin = "127.0.0.1:70000";
  EXPECT_NE(Error(in).find("admin: port '70000'"), std::string::npos);
  in = Input();
  in.backing = "relative/dir";
  EXPECT_NE(Error(in).find("backing: 'relative/dir' must be an absolute path"), std::string::npos);
  in = Input();
  in.mountpoint = dir_.path().string() + "/missing";
  EXPECT_NE(Error(in).find("mount: "), std::string::npos);
  in = Input();
  in.mountpoint = backing_;
  EXPECT_NE(Error(in).find("must not contain each other"), std::string::npos);
}

TEST_F(ConfigTest, an_unknown_key_or_a_wrong_type_in_the_file_is_refused) {
  ConfigInput in = Input();
  in.config_file = WriteFile("backing = \"/x\"\nrange = \"0-1\"\n");
  EXPECT_NE(Error(in).find("unknown key 'range'"), std::string::npos);
  in.config_file = WriteFile("no_create = \"yes\"\n");
  EXPECT_NE(Error(in).find("no_create: "), std::string::npos);
  in.config_file = WriteFile("ranges = [1, 2]\n");
  EXPECT_NE(Error(in).find("ranges: "), std::string::npos);
  in.config_file = WriteFile("ttl = \n");
  EXPECT_NE(Error(in).find("line 1"), std::string::npos);
}

TEST_F(ConfigTest, every_value_in_the_file_is_checked_even_when_a_flag_overrides_it) {
  ConfigInput in = Input();
  in.ttl = "6s";
  in.config_file = WriteFile("ttl = true\n");
  EXPECT_NE(Error(in).find("ttl: the value must be a string"), std::string::npos);
  in.config_file = WriteFile("ttl = \"1s\"\n");
  EXPECT_NE(Error(in).find("ttl: ttl 1s: a lease lasts 3s to 3600s"), std::string::npos);
  in = Input();
  in.admin = "off";
  in.config_file = WriteFile("admin = \"0.0.0.0:80\"\n");
  EXPECT_NE(Error(in).find("admin: "), std::string::npos);
  in = Input();
  in.backing = backing_;
  in.config_file = WriteFile("backing = \"relative\"\n");
  EXPECT_NE(Error(in).find("backing: 'relative' must be an absolute path"), std::string::npos);
  // A file value a flag overrides names the file.
  EXPECT_NE(Error(in).find("config file "), std::string::npos);
}

TEST_F(ConfigTest, durations_need_their_unit_and_ranges_are_strings) {
  ConfigInput in = Input();
  for (const char* text : {"sync_interval = 200\n", "ttl = 30\n", "retention = 3.5\n",
                           "shutdown_grace = 0\n", "snapshot_interval = 3600\n"}) {
    in.config_file = WriteFile(text);
    EXPECT_NE(Error(in).find("a duration is a string with its unit"), std::string::npos) << text;
  }
  in.config_file = WriteFile("sync_interval = \"200\"\n");
  EXPECT_NE(Error(in).find("sync_interval '200': a duration needs its unit"), std::string::npos);
  in = Input();
  in.ttl = "30";
  EXPECT_NE(Error(in).find("ttl '30': a duration needs its unit"), std::string::npos);
  in = Input();
  in.config_file = WriteFile("ranges = 5\n");
  EXPECT_NE(Error(in).find("ranges: ranges are a string"), std::string::npos);
  in.config_file = WriteFile("ranges = \"5\"\n");  // slot 5, written as text: meant
  EXPECT_TRUE(ResolveConfig(in).ok());
}

TEST_F(ConfigTest, capture_bounds_are_sizes_with_their_unit_and_default_to_256mib_and_4gib) {
  auto config = ResolveConfig(Input());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->capture_memory, 256ull << 20);
  EXPECT_EQ(config->capture_spill, 4ull << 30);
  ConfigInput in = Input();
  in.config_file = WriteFile("capture_memory = \"64MiB\"\ncapture_spill = \"0B\"\n");
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->capture_memory, 64ull << 20);
  EXPECT_EQ(config->capture_spill, 0u);
  in.capture_memory = "1GiB";  // the flag wins
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->capture_memory, 1ull << 30);
  in = Input();
  in.config_file = WriteFile("capture_memory = 268435456\n");
  EXPECT_NE(Error(in).find("capture_memory: a size is a string with its unit"), std::string::npos);
  for (const char* bad : {"256", "256MB", "MiB", "-1MiB", "1.5GiB", "99999999999TiB"}) {
    in = Input();
    in.capture_memory = bad;
    EXPECT_NE(Error(in).find("capture_memory: '"), std::string::npos) << bad;
  }
  in = Input();
  in.capture_memory = "512KiB";
  EXPECT_NE(Error(in).find("capture_memory: must be between 1MiB and 1TiB"), std::string::npos);
}

TEST_F(ConfigTest, owner_ids_with_unicode_white_space_or_bad_bytes_are_refused) {
  ConfigInput in = Input();
  for (const char* owner : {"host-a\u00a0", "\u2003host-a", "host-a\u3000", "host-a\u200b",
                            "host\u0085a", "host-\xff", "host-\xc0\xaf"}) {
    in.owner = owner;
    EXPECT_NE(Error(in).find("owner: owner id"), std::string::npos) << owner;
  }
  in.owner = "h\u00f6st b";  // UTF-8, white space inside: fine
  EXPECT_TRUE(ResolveConfig(in).ok());
}

TEST_F(ConfigTest, the_store_is_checked_before_anything_is_touched) {
  ConfigInput in = Input();
  const std::string text = dir_.path().string() + "/notes.txt";
  std::ofstream(text) << "not a database\n";
  in.store = "sqlite://" + text;
  EXPECT_NE(Error(in).find("store: " + text + " exists and is not a SQLite database"),
            std::string::npos);
  in.store = "sqlite://" + dir_.path().string() + "/missing/control.db";
  EXPECT_NE(Error(in).find("store: the directory "), std::string::npos);
  in.store = "sqlite://" + dir_.path().string() + "/empty.db";
  std::ofstream(dir_.path().string() + "/empty.db");  // an empty file is a database to SQLite
  EXPECT_TRUE(ResolveConfig(in).ok());
  EXPECT_FALSE(std::filesystem::exists(backing_ + "/.fleetfs"));
}

TEST_F(ConfigTest, the_example_configuration_in_packaging_is_valid) {
  ConfigInput in = Input();  // its directories are replaced by this test's
  in.config_file = std::string(FLEETFS_SOURCE_DIR) + "/packaging/agent.toml";
  in.store = "sqlite://" + dir_.path().string() + "/control.db";
  auto config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->ttl, Millis(30000));
  EXPECT_EQ(config->shutdown_grace, Millis(5000));
  EXPECT_EQ(config->replica, "file:///var/lib/fleetfs/replica");
  EXPECT_EQ(config->sync_interval, Millis(1000));
}

TEST_F(ConfigTest, replication_is_off_unless_a_replica_is_given_and_its_values_are_checked) {
  auto config = ResolveConfig(Input());
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->replica.empty());
  ConfigInput in = Input();
  in.replica = "file:///srv/replica";
  in.sync_interval = "100ms";
  in.retention = "7d";
  EXPECT_NE(Error(in).find("retention"), std::string::npos);
  in.retention = "168h";
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->sync_interval, Millis(100));
  EXPECT_EQ(config->retention, Millis(168LL * 3600 * 1000));
  in.replica = "s3://bucket";
  EXPECT_NE(Error(in).find("replica 's3://bucket'"), std::string::npos);
  in.replica = "file:///srv/replica";
  in.sync_interval = "5ms";
  EXPECT_NE(Error(in).find("sync_interval: must be between 10ms and 600s"), std::string::npos);
}

}  // namespace
}  // namespace fleetfs::agent
