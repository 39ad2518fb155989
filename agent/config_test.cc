#include "agent/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fleet/replica/destination.h"
#include "lease/owner_id.h"
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
  EXPECT_EQ(config->transport, vfs::Transport::kAuto);
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
  in.replica = "s3://Bucket";
  EXPECT_NE(Error(in).find("replica 's3://Bucket': the bucket name 'Bucket' may hold only "
                           "lower-case letters"),
            std::string::npos);
  in.replica = "s3://bucket/fleet";
  ASSERT_TRUE(ResolveConfig(in).ok());
  in.replica = "file:///srv/replica";
  in.sync_interval = "5ms";
  EXPECT_NE(Error(in).find("sync_interval: must be between 10ms and 600s"), std::string::npos);
}

// ── The S3 keys: replica_endpoint, replica_region, replica_path_style ──────

TEST(ReplicaEndpoint, an_http_url_of_a_host_and_an_optional_port_is_taken_without_its_slash) {
  for (const auto& [given, kept] : std::vector<std::pair<std::string, std::string>>{
           {"https://s3.eu-west-1.amazonaws.com", "https://s3.eu-west-1.amazonaws.com"},
           {"http://127.0.0.1:9000", "http://127.0.0.1:9000"},
           {"http://127.0.0.1:9000/", "http://127.0.0.1:9000"},
           {"http://minio_1:9000", "http://minio_1:9000"},
           {"https://[::1]:9000", "https://[::1]:9000"},
           {"http://[fd00::1]", "http://[fd00::1]"},
           {"", ""},  // unset: AWS's endpoint
       }) {
    auto endpoint = ParseReplicaEndpoint(given);
    ASSERT_TRUE(endpoint.ok()) << given << ": " << endpoint.status().message();
    EXPECT_EQ(*endpoint, kept);
  }
}

TEST(ReplicaEndpoint, each_bad_url_is_refused_naming_the_key_and_what_is_wrong) {
  for (const auto& [given, says] : std::vector<std::pair<std::string, std::string>>{
           {"ftp://h", "'ftp://h' is not an http:// or https:// URL"},
           {"s3.amazonaws.com", "'s3.amazonaws.com' is not an http:// or https:// URL"},
           {"HTTPS://h", "is not an http:// or https:// URL"},
           {"https://", "'https://' names no host"},
           {"http://:9000", "names no host"},
           {"http://h:0", "'http://h:0' has a port other than 1-65535"},
           {"http://h:65536", "has a port other than 1-65535"},
           {"http://h:", "has a port other than 1-65535"},
           {"http://h:90a", "has a port other than 1-65535"},
           {"http://h/bucket", "has a path: the bucket and prefix go in the replica URL"},
           {"http://h//", "has a path"},
           {"http://h/?a=1", "has a query or fragment"},
           {"http://h?a=1", "has a query or fragment"},
           {"http://h#top", "has a query or fragment"},
           {"http://a host", "has a host with a character other than letters"},
           {"http://[::1", "has an unclosed '['"},
           {"http://[::1]9000", "has text after its ']'"},
           {"http://[zz]:9000", "has a bracketed host that is not an IPv6 address"},
           {"http://h\xff", "is not valid UTF-8"},
       }) {
    auto endpoint = ParseReplicaEndpoint(given);
    ASSERT_FALSE(endpoint.ok()) << given;
    EXPECT_EQ(endpoint.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(endpoint.status().message().rfind("replica_endpoint: ", 0), 0u)
        << endpoint.status().message();
    EXPECT_NE(endpoint.status().message().find(says), std::string::npos)
        << given << ": " << endpoint.status().message();
  }
}

TEST(ReplicaEndpoint, a_url_with_a_user_name_is_refused_without_repeating_it) {
  auto endpoint = ParseReplicaEndpoint("https://AKIAEXAMPLE:s3cr3t@minio:9000");
  ASSERT_FALSE(endpoint.ok());
  const std::string& message = endpoint.status().message();
  EXPECT_NE(message.find("replica_endpoint: the URL holds a user name"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("s3cr3t"), std::string::npos) << message;
  EXPECT_EQ(message.find("AKIAEXAMPLE"), std::string::npos) << message;
}

TEST(ReplicaRegion, lowercase_letters_digits_and_hyphens_up_to_32_are_a_region) {
  for (const char* good : {"eu-west-1", "us-east-1", "auto", "a", "", "abcdefghij-abcdefghij-abcdefghij"}) {
    EXPECT_TRUE(CheckReplicaRegion(good).ok()) << good;
  }
  for (const std::string bad : {"EU-WEST-1", "eu_west_1", "eu west 1", "eu-west-1\n",
                                "abcdefghij-abcdefghij-abcdefghij-"}) {
    Status st = CheckReplicaRegion(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find("replica_region: '" + lease::Printable(bad) +
                                "' is not a region name: 1 to 32 lowercase letters, digits and "
                                "hyphens"),
              std::string::npos)
        << st.message();
  }
}

TEST(ReplicaPathStyle, is_true_false_or_unset) {
  EXPECT_EQ(ParseReplicaPathStyle("true").value(), std::optional<bool>(true));
  EXPECT_EQ(ParseReplicaPathStyle("false").value(), std::optional<bool>(false));
  EXPECT_EQ(ParseReplicaPathStyle("").value(), std::nullopt);
  for (const char* bad : {"yes", "True", "1", "on"}) {
    auto style = ParseReplicaPathStyle(bad);
    ASSERT_FALSE(style.ok()) << bad;
    EXPECT_EQ(style.status().message(),
              "replica_path_style: '" + std::string(bad) + "' must be true or false");
  }
}

TEST_F(ConfigTest, s3_keys_are_unset_by_default) {
  auto config = ResolveConfig(Input());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->replica_s3.endpoint, "");
  EXPECT_EQ(config->replica_s3.region, "");
  EXPECT_FALSE(config->replica_s3.path_style.has_value());
}

TEST_F(ConfigTest, s3_keys_with_a_file_replica_or_replication_off_are_refused_naming_the_key) {
  const std::pair<std::string, std::string> keys[] = {
      {"replica_endpoint", "\"http://127.0.0.1:9000\""},
      {"replica_region", "\"eu-west-1\""},
      {"replica_path_style", "true"},
  };
  for (const auto& [key, toml] : keys) {
    for (const std::string replica : {"file:///srv/replica", "off"}) {
      const std::string says =
          key + ": applies only to an s3:// replica, and " +
          (replica == "off" ? std::string("replication is off") : "the replica is " + replica);
      ConfigInput by_file = Input();
      by_file.config_file = WriteFile("replica = \"" + replica + "\"\n" + key + " = " + toml + "\n");
      EXPECT_EQ(Error(by_file), says);
      ConfigInput by_flag = Input();
      by_flag.replica = replica;
      std::string text = toml;
      if (text.front() == '"') text = text.substr(1, text.size() - 2);
      (key == "replica_endpoint" ? by_flag.replica_endpoint
       : key == "replica_region" ? by_flag.replica_region
                                 : by_flag.replica_path_style) = text;
      EXPECT_EQ(Error(by_flag), says);
    }
  }
  // Unset replica: off, the default.
  ConfigInput in = Input();
  in.replica_region = "eu-west-1";
  EXPECT_EQ(Error(in), "replica_region: applies only to an s3:// replica, and replication is off");
  // A flag's file:// replica over the file's s3:// one: the keys go with it.
  in = Input();
  in.config_file = WriteFile("replica_path_style = false\n");
  in.replica = "file:///srv/replica";
  EXPECT_EQ(Error(in), "replica_path_style: applies only to an s3:// replica, and the replica is "
                       "file:///srv/replica");
  // "" is unset, whatever the replica.
  in = Input();
  in.config_file = WriteFile("replica = \"file:///srv/replica\"\nreplica_endpoint = \"\"\n"
                             "replica_region = \"\"\n");
  EXPECT_TRUE(ResolveConfig(in).ok());
}

TEST_F(ConfigTest, bad_s3_values_are_refused_from_the_file_and_from_flags_alike) {
  // A file:// replica: the values are checked before whether they apply.
  ConfigInput in = Input();
  in.replica = "file:///srv/replica";
  in.replica_endpoint = "http://h/bucket";
  const std::string endpoint_flag = Error(in);
  EXPECT_NE(endpoint_flag.find("replica_endpoint: 'http://h/bucket' has a path"),
            std::string::npos)
      << endpoint_flag;
  in = Input();
  in.config_file = WriteFile("replica = \"file:///srv/replica\"\n"
                             "replica_endpoint = \"http://h/bucket\"\n");
  EXPECT_EQ(Error(in), "config file " + *in.config_file + ": " + endpoint_flag);

  in = Input();
  in.replica_region = "EU";
  const std::string region_flag = Error(in);
  EXPECT_NE(region_flag.find("replica_region: 'EU' is not a region name"), std::string::npos);
  in = Input();
  in.config_file = WriteFile("replica_region = \"EU\"\n");
  EXPECT_EQ(Error(in), "config file " + *in.config_file + ": " + region_flag);

  in = Input();
  in.replica_path_style = "yes";
  EXPECT_EQ(Error(in), "replica_path_style: 'yes' must be true or false");
  // The file's is a TOML boolean: quoted, it is a string, and refused.
  in = Input();
  in.config_file = WriteFile("replica_path_style = \"true\"\n");
  EXPECT_EQ(Error(in), "config file " + *in.config_file +
                           ": replica_path_style: must be true or false (unquoted)");
  // A flag does not hide a bad value in the file.
  in = Input();
  in.config_file = WriteFile("replica_region = \"EU\"\n");
  in.replica_region = "eu-west-1";
  EXPECT_NE(Error(in).find("replica_region: 'EU'"), std::string::npos);
}

TEST_F(ConfigTest, the_unknown_key_message_lists_the_s3_keys) {
  ConfigInput in = Input();
  in.config_file = WriteFile("replica_endpiont = \"http://h\"\n");
  const std::string error = Error(in);
  EXPECT_NE(error.find("unknown key 'replica_endpiont'"), std::string::npos);
  EXPECT_NE(error.find("replica_endpoint, replica_region, replica_path_style"), std::string::npos)
      << error;
}

// ── transport: how FUSE requests reach the agent ─────────────────────────

TEST_F(ConfigTest, the_transport_is_auto_unless_the_file_or_a_flag_says_io_uring_or_dev_fuse) {
  auto config = ResolveConfig(Input());
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->transport, vfs::Transport::kAuto);
  ConfigInput in = Input();
  in.config_file = WriteFile("transport = \"io_uring\"\n");
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->transport, vfs::Transport::kIoUring);
  in.transport = "dev_fuse";  // the flag wins
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->transport, vfs::Transport::kDevFuse);
  in.transport = "auto";
  config = ResolveConfig(in);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->transport, vfs::Transport::kAuto);
}

TEST_F(ConfigTest, a_bad_transport_is_refused_naming_the_key_and_the_values_from_a_flag_or_the_file) {
  const std::string values =
      "the values are auto (io_uring when the kernel allows it, else /dev/fuse), io_uring and "
      "dev_fuse";
  for (const char* bad : {"uring", "IO_URING", "/dev/fuse", "dev-fuse", ""}) {
    ConfigInput in = Input();
    in.transport = bad;
    EXPECT_EQ(Error(in), std::string("transport: '") + bad + "' is not a transport; " + values);
  }
  ConfigInput in = Input();
  in.config_file = WriteFile("transport = \"fuse\"\n");
  in.transport = "dev_fuse";  // a good flag does not hide the file's bad value
  EXPECT_EQ(Error(in), "config file " + *in.config_file +
                           ": transport: 'fuse' is not a transport; " + values);
  in.config_file = WriteFile("transport = 1\n");
  EXPECT_EQ(Error(in), "config file " + *in.config_file + ": transport: the value must be a string");
}

TEST_F(ConfigTest, the_unknown_key_message_lists_transport) {
  ConfigInput in = Input();
  in.config_file = WriteFile("transprot = \"auto\"\n");
  const std::string error = Error(in);
  EXPECT_NE(error.find("unknown key 'transprot'"), std::string::npos);
  EXPECT_NE(error.find("replica_path_style, transport"), std::string::npos) << error;
}

TEST(Transport, each_value_reads_back_as_itself) {
  for (vfs::Transport t :
       {vfs::Transport::kAuto, vfs::Transport::kIoUring, vfs::Transport::kDevFuse}) {
    auto parsed = ParseTransport(TransportValue(t));
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(*parsed, t);
  }
}

TEST_F(ConfigTest, s3_keys_from_flags_equal_the_same_keys_in_the_file) {
  ConfigInput by_flag = Input();
  by_flag.replica = "s3://bucket/prefix";
  by_flag.replica_endpoint = "http://127.0.0.1:9000/";
  by_flag.replica_region = "eu-west-1";
  by_flag.replica_path_style = "false";
  ConfigInput by_file = Input();
  by_file.config_file = WriteFile(
      "replica = \"s3://bucket/prefix\"\nreplica_endpoint = \"http://127.0.0.1:9000/\"\n"
      "replica_region = \"eu-west-1\"\nreplica_path_style = false\n");
  for (const ConfigInput& in : {by_flag, by_file}) {
    auto config = ResolveConfig(in);
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->replica, "s3://bucket/prefix");
    EXPECT_EQ(config->replica_s3.endpoint, "http://127.0.0.1:9000");
    EXPECT_EQ(config->replica_s3.region, "eu-west-1");
    EXPECT_EQ(config->replica_s3.path_style, std::optional<bool>(false));
  }
  // Flags win over the file.
  by_file.replica_region = "us-east-2";
  by_file.replica_path_style = "true";
  auto config = ResolveConfig(by_file);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->replica_s3.region, "us-east-2");
  EXPECT_EQ(config->replica_s3.path_style, std::optional<bool>(true));
  // None given: all unset, the destination's defaults.
  ConfigInput bare = Input();
  bare.replica = "s3://bucket/prefix";
  config = ResolveConfig(bare);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->replica_s3.endpoint, "");
  EXPECT_EQ(config->replica_s3.region, "");
  EXPECT_FALSE(config->replica_s3.path_style.has_value());
}

}  // namespace
}  // namespace fleetfs::agent
