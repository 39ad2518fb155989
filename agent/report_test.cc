#include "agent/report.h"

#include <sstream>

#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "agent/build_info.h"

namespace fleetfs::agent {
namespace {

using lease::Epoch;
using lease::RangeOutcome;
using lease::RangeStatus;
using lease::SlotRange;

RangeSnapshot Range(const char* text, RangeOutcome last, bool serving, std::uint64_t epoch = 0) {
  RangeStatus st;
  st.range = *SlotRange::Parse(text);
  st.last = last;
  st.serving = serving;
  if (epoch != 0) st.epoch = Epoch(epoch);
  if (serving) st.lease_left = Millis(15000);
  return RangeSnapshot{st, 2};
}

AgentSnapshot Snapshot(std::vector<RangeSnapshot> ranges) {
  AgentSnapshot s;
  s.owner = "host-a";
  s.store = "sqlite:///c.db";
  s.phase = "serving";
  s.ttl = Millis(30000);
  s.ranges = std::move(ranges);
  return s;
}

TEST(Health, is_ok_while_every_range_is_served_or_waiting) {
  auto waiting = Range("100-199", RangeOutcome::kWaiting, false);
  waiting.status.holder = lease::Held{*SlotRange::Parse("100-199"), "host-b", 1000};
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3), waiting});
  EXPECT_EQ(Health(s).status, 200);
}

TEST(Health, fails_naming_the_range_when_a_store_call_failed_even_while_still_serving) {
  auto failing = Range("0-99", RangeOutcome::kTimedOut, true, 3);
  failing.status.failure = "the store call timed out";
  HttpResponse h = Health(Snapshot({failing}));
  EXPECT_EQ(h.status, 503);
  EXPECT_NE(h.body.find("range 0-99: the store call failed: the store call timed out"),
            std::string::npos);
}

TEST(Health, fails_when_a_held_range_lapsed_or_was_lost_or_the_agent_stops) {
  HttpResponse lapsed = Health(Snapshot({Range("0-99", RangeOutcome::kRenewed, false, 3)}));
  EXPECT_EQ(lapsed.status, 503);
  EXPECT_NE(lapsed.body.find("range 0-99 lapsed at epoch 3"), std::string::npos);
  HttpResponse lost = Health(Snapshot({Range("0-99", RangeOutcome::kLost, false)}));
  EXPECT_NE(lost.body.find("was lost"), std::string::npos);
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.phase = "draining";
  EXPECT_EQ(Health(s).status, 503);
}

TEST(Report, status_and_metrics_name_each_range_with_its_epoch_state_and_lease) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 7),
                     Range("100-199", RangeOutcome::kWaiting, false)});
  s.outcomes[static_cast<std::size_t>(Outcome::kRenewed)] = 4;
  VfsSnapshot v;
  v.fenced = 5;
  v.ops[static_cast<std::size_t>(vfs::Op::kWrite)] = 11;
  v.errors[static_cast<std::size_t>(vfs::Op::kWrite)][static_cast<std::size_t>(vfs::ErrKind::kEstale)] = 5;
  s.vfs = v;
  nlohmann::json doc = StatusJson(s);
  EXPECT_EQ(doc["ranges"][0]["state"], "serving");
  EXPECT_EQ(doc["ranges"][0]["epoch"], 7);
  EXPECT_EQ(doc["ranges"][0]["lease_left_ms"], 15000);
  EXPECT_EQ(doc["ranges"][1]["state"], "waiting");
  EXPECT_TRUE(doc["ranges"][1]["epoch"].is_null());
  std::string metrics = MetricsText(s);
  for (const char* line :
       {"fleetfs_ranges_held 1\n", "fleetfs_range_epoch{range=\"0-99\"} 7\n",
        "fleetfs_range_lease_seconds_left{range=\"0-99\"} 15.000\n",
        "fleetfs_refresh_outcomes_total{outcome=\"renewed\"} 4\n",
        "fleetfs_fenced_operations_total 5\n", "fleetfs_fuse_operations_total{op=\"write\"} 11\n",
        "fleetfs_fuse_errors_total{op=\"write\",errno=\"ESTALE\"} 5\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
  EXPECT_NE(RangesText(s).find("0-99 serving epoch 7"), std::string::npos);
}

// Every HELP and TYPE line of the text, by family name: each must appear once.
std::map<std::string, int> HeaderCounts(const std::string& text, std::string_view kind) {
  std::map<std::string, int> out;
  std::istringstream in(text);
  std::string line;
  const std::string prefix = "# " + std::string(kind) + " ";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) ++out[line.substr(prefix.size(), line.find(' ', prefix.size()) - prefix.size())];
  }
  return out;
}

// The mount tests check that an agent asked for io_uring runs on it: the
// status names the transport in use, and why auto fell back, once mounted.
TEST(Report, status_names_the_transport_once_mounted_and_why_auto_fell_back) {
  auto s = Snapshot({});
  nlohmann::json before = StatusJson(s);
  ASSERT_TRUE(before.contains("transport"));
  EXPECT_TRUE(before["transport"].is_null()) << "unknown before the mount";
  EXPECT_FALSE(before.contains("transport_why"));
  s.vfs = VfsSnapshot{};
  s.transport = "io_uring";
  nlohmann::json uring = StatusJson(s);
  EXPECT_EQ(uring["transport"], "io_uring");
  EXPECT_FALSE(uring.contains("transport_why"));
  s.transport = "/dev/fuse";
  s.transport_why = "the fuse module's enable_uring is off";
  nlohmann::json fell_back = StatusJson(s);
  EXPECT_EQ(fell_back["transport"], "/dev/fuse");
  EXPECT_EQ(fell_back["transport_why"], "the fuse module's enable_uring is off");
}

// `fleetfs handoff` watches an etcds:// store with the agent's own CA and
// client certificate: the status names the files, never their contents.
TEST(Report, status_names_the_store_tls_files_only_when_set) {
  auto s = Snapshot({});
  EXPECT_FALSE(StatusJson(s).contains("store_tls"));
  s.store = "etcds://10.0.0.1:2379/fleet";
  s.store_tls = {"/etc/fleetfs/ca.pem", "/etc/fleetfs/me.pem", "/etc/fleetfs/me.key"};
  const nlohmann::json doc = StatusJson(s);
  EXPECT_EQ(doc["store_tls"],
            (nlohmann::json{{"ca", "/etc/fleetfs/ca.pem"}, {"cert", "/etc/fleetfs/me.pem"},
                            {"key", "/etc/fleetfs/me.key"}}));
}

TEST(Report, metrics_have_latency_histograms_and_the_build_info) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 7)});
  VfsSnapshot v;
  v.latency[static_cast<std::size_t>(vfs::Op::kRead)].buckets[2] = 3;  // le="5e-05"
  v.latency[static_cast<std::size_t>(vfs::Op::kRead)].sum_ns = 120'000;
  s.vfs = v;
  s.store_call_time[static_cast<std::size_t>(lease::StoreCallKind::kRenew)].buckets[9] = 1;  // le="0.01"
  s.replication = replica::ReplicationStats{};
  s.replication->restore_time.buckets[16] = 2;  // le="2.5"
  s.replica_request_time[static_cast<std::size_t>(replica::Request::kCreate)].buckets[kCallBounds.inf()] = 1;
  std::string metrics = MetricsText(s);
  for (std::string line :
       {std::string("fleetfs_build_info{version=\"") + kBuildVersion + "\",commit=\"" +
            kBuildCommit + "\",compiler=\"" + kBuildCompiler + "\"} 1\n",
        std::string("fleetfs_fuse_request_duration_seconds_bucket{op=\"read\",le=\"2.5e-05\"} 0\n"),
        std::string("fleetfs_fuse_request_duration_seconds_bucket{op=\"read\",le=\"5e-05\"} 3\n"),
        std::string("fleetfs_fuse_request_duration_seconds_bucket{op=\"read\",le=\"+Inf\"} 3\n"),
        std::string("fleetfs_fuse_request_duration_seconds_sum{op=\"read\"} 0.00012\n"),
        std::string("fleetfs_fuse_request_duration_seconds_count{op=\"read\"} 3\n"),
        std::string("fleetfs_fuse_request_duration_seconds_count{op=\"write\"} 0\n"),
        std::string("fleetfs_store_call_duration_seconds_bucket{call=\"renew\",le=\"0.01\"} 1\n"),
        std::string("fleetfs_store_call_duration_seconds_count{call=\"claim\"} 0\n"),
        std::string("fleetfs_restore_duration_seconds_bucket{le=\"2.5\"} 2\n"),
        std::string("fleetfs_restore_duration_seconds_count 2\n"),
        std::string("fleetfs_replica_request_duration_seconds_bucket{kind=\"create\",le=\"300\"} 0\n"),
        // Calls and restores go to 5 minutes; FUSE requests stop at 10 s.
        std::string("fleetfs_restore_duration_seconds_bucket{le=\"300\"} 2\n"),
        std::string("fleetfs_store_call_duration_seconds_bucket{call=\"renew\",le=\"60\"} 1\n"),
        std::string("fleetfs_replica_request_duration_seconds_bucket{kind=\"create\",le=\"+Inf\"} 1\n"),
        std::string("# TYPE fleetfs_fuse_request_duration_seconds histogram\n"),
        std::string("# TYPE fleetfs_restore_duration_seconds histogram\n")}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(metrics.find("fleetfs_fuse_request_duration_seconds_bucket{op=\"read\",le=\"30\"}"),
            std::string::npos);
  // HELP and TYPE once per family, histograms included.
  for (std::string_view kind : {"HELP", "TYPE"}) {
    for (const auto& [family, n] : HeaderCounts(metrics, kind)) {
      EXPECT_EQ(n, 1) << kind << " " << family;
    }
  }
  EXPECT_EQ(HeaderCounts(metrics, "TYPE").count("fleetfs_store_call_duration_seconds"), 1u);
}

TEST(Report, the_build_info_names_a_version_a_commit_and_a_compiler) {
  EXPECT_STRNE(kBuildVersion, "");
  EXPECT_STRNE(kBuildCommit, "");  // "unknown" outside a git checkout
  EXPECT_STRNE(kBuildCompiler, "");
}

TEST(Health, a_full_backing_volume_fails_naming_it_while_the_ranges_stay_served) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.backing = "/srv/backing";
  s.backing_volume.state = BackingState::kFull;
  s.backing_volume.enospc_recent = 4;
  s.backing_volume.reason =
      "the backing volume /srv/backing is full: 4 writes failed with ENOSPC in the last 30s";
  HttpResponse h = Health(s);
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body,
            "the backing volume /srv/backing is full: 4 writes failed with ENOSPC in the last 30s; "
            "still serving what fits\n");
  nlohmann::json doc = StatusJson(s);
  EXPECT_EQ(doc["backing_volume"]["state"], "full");
  EXPECT_EQ(doc["backing_volume"]["path"], "/srv/backing");
  EXPECT_EQ(doc["backing_volume"]["enospc_recent"], 4);
  EXPECT_EQ(doc["ranges"][0]["state"], "serving");
  EXPECT_FALSE(doc["health"]["ok"]);
  EXPECT_NE(MetricsText(s).find("fleetfs_backing_full 1\n"), std::string::npos);
}

TEST(Health, a_failed_backing_volume_is_named_while_stopping_and_after_standing_down) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.backing = "/srv/backing";
  s.backing_volume.state = BackingState::kFailed;
  s.backing_volume.reason = "the backing volume /srv/backing is read-only: creating "
                            "/srv/backing/.fleetfs/write-probe failed: Read-only file system (EROFS)";
  s.phase = "stopping";
  HttpResponse stopping = Health(s);
  EXPECT_EQ(stopping.status, 503);
  EXPECT_NE(stopping.body.find("/srv/backing is read-only"), std::string::npos) << stopping.body;
  EXPECT_NE(stopping.body.find("releasing the ranges"), std::string::npos) << stopping.body;

  s.phase = "failed";
  s.failure = s.backing_volume.reason;
  s.ranges = {Range("0-99", RangeOutcome::kRenewed, false)};
  HttpResponse failed = Health(s);
  EXPECT_EQ(failed.status, 503);
  EXPECT_NE(failed.body.find("/srv/backing is read-only"), std::string::npos) << failed.body;
  EXPECT_NE(failed.body.find("serving nothing and claiming nothing"), std::string::npos);
  nlohmann::json doc = StatusJson(s);
  EXPECT_EQ(doc["phase"], "failed");
  EXPECT_EQ(doc["failure"], s.failure);
  EXPECT_EQ(doc["backing_volume"]["state"], "failed");
  EXPECT_EQ(doc["ranges"][0]["state"], "stopped");
  EXPECT_NE(MetricsText(s).find("fleetfs_backing_failed 1\n"), std::string::npos);
}

TEST(Report, erofs_enospc_and_eio_are_counted_by_name_over_every_op_even_at_zero) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  std::string zero = MetricsText(s);
  for (const char* line : {"fleetfs_fuse_errno_total{errno=\"EROFS\"} 0\n",
                           "fleetfs_fuse_errno_total{errno=\"ENOSPC\"} 0\n",
                           "fleetfs_fuse_errno_total{errno=\"EIO\"} 0\n"}) {
    EXPECT_NE(zero.find(line), std::string::npos) << line;
  }
  VfsSnapshot v;
  auto at = [&](vfs::Op op, vfs::ErrKind kind) -> std::uint64_t& {
    return v.errors[static_cast<std::size_t>(op)][static_cast<std::size_t>(kind)];
  };
  at(vfs::Op::kOpen, vfs::ErrKind::kErofs) = 2;
  at(vfs::Op::kCreate, vfs::ErrKind::kErofs) = 1;
  at(vfs::Op::kWrite, vfs::ErrKind::kEnospc) = 4;
  at(vfs::Op::kLookup, vfs::ErrKind::kEio) = 5;
  s.vfs = v;
  std::string metrics = MetricsText(s);
  for (const char* line : {"fleetfs_fuse_errno_total{errno=\"EROFS\"} 3\n",
                           "fleetfs_fuse_errno_total{errno=\"ENOSPC\"} 4\n",
                           "fleetfs_fuse_errno_total{errno=\"EIO\"} 5\n",
                           "fleetfs_fuse_errors_total{op=\"open\",errno=\"EROFS\"} 2\n",
                           "fleetfs_fuse_errors_total{op=\"write\",errno=\"ENOSPC\"} 4\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
  nlohmann::json errors = StatusJson(s)["backing_volume"]["errors"];
  EXPECT_EQ(errors["EROFS"], 3);
  EXPECT_EQ(errors["ENOSPC"], 4);
  EXPECT_EQ(errors["EIO"], 5);
}

TEST(Report, capture_failures_and_absent_listed_appear_in_status_and_metrics) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replica = "file:///r";
  s.replication = replica::ReplicationStats{};
  s.replication->capture_failures = 3;
  s.replication->absent_listed = 17;
  s.replication->prepares_refused = 5;
  s.replication->segments = 9;
  nlohmann::json rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["capture_failures"], 3);
  EXPECT_EQ(rep["absent_listed"], 17);
  EXPECT_EQ(rep["prepares_refused"], 5);
  EXPECT_EQ(rep["segments"], 9);
  std::string metrics = MetricsText(s);
  for (const char* line : {"fleetfs_replication_capture_failures_total 3\n",
                           "fleetfs_replication_prepares_refused_total 5\n",
                           "fleetfs_replication_absent_listed_total 17\n",
                           "fleetfs_replication_segments_total 9\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
}

TEST(Report, the_replicas_endpoint_region_and_path_style_are_in_status_for_inspect) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replica = "s3://bucket/prefix";
  s.replica_s3 = replica::S3Settings{"http://minio.local:9000", "eu-west-1", true};
  s.replication = replica::ReplicationStats{};
  nlohmann::json rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["replica_endpoint"], "http://minio.local:9000");
  EXPECT_EQ(rep["replica_region"], "eu-west-1");
  EXPECT_EQ(rep["replica_path_style"], true);
  s.replica_s3 = replica::S3Settings{};
  rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["replica_endpoint"], "");
  EXPECT_TRUE(rep["replica_path_style"].is_null());
}

TEST(Report, requests_to_the_destination_are_counted_by_kind_in_status_and_metrics) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replica = "file:///r";
  s.replication = replica::ReplicationStats{};
  s.replica_requests.creates = 3600;
  s.replica_requests.lists = 2;
  s.replica_requests.heads = 1;
  s.replica_requests.clean_temps = 1;
  s.replica_requests.failures = 4;
  nlohmann::json rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["requests"]["create"], 3600);
  EXPECT_EQ(rep["requests"]["list"], 2);
  EXPECT_EQ(rep["requests"]["head"], 1);
  EXPECT_EQ(rep["requests"]["clean_temps"], 1);
  EXPECT_EQ(rep["requests"]["put"], 0);  // every kind is named, even at zero
  EXPECT_EQ(rep["requests"].size(), replica::kRequestKinds);
  EXPECT_EQ(rep["request_failures"], 4);
  std::string metrics = MetricsText(s);
  for (const char* line : {"# TYPE fleetfs_replica_requests_total counter\n",
                           "fleetfs_replica_requests_total{kind=\"create\"} 3600\n",
                           "fleetfs_replica_requests_total{kind=\"list\"} 2\n",
                           "fleetfs_replica_requests_total{kind=\"put\"} 0\n",
                           "fleetfs_replica_requests_total{kind=\"get\"} 0\n",
                           "fleetfs_replica_requests_total{kind=\"head\"} 1\n",
                           "fleetfs_replica_requests_total{kind=\"size\"} 0\n",
                           "fleetfs_replica_requests_total{kind=\"remove\"} 0\n",
                           "fleetfs_replica_requests_total{kind=\"probe\"} 0\n",
                           "fleetfs_replica_requests_total{kind=\"clean_temps\"} 1\n",
                           "fleetfs_replica_request_failures_total 4\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
}

TEST(Report, without_a_replica_no_request_counts_are_reported) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  EXPECT_TRUE(StatusJson(s)["replication"].is_string());
  EXPECT_EQ(MetricsText(s).find("fleetfs_replica_requests_total"), std::string::npos);
}

TEST(Report, a_snapshot_waiting_for_room_on_the_backing_volume_is_named_in_health_status_and_metrics) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replication = replica::ReplicationStats{};
  s.replica = "file:///r";
  s.replication->staging_blocked = "staging a snapshot of 042/acme.db needs 9 bytes";
  HttpResponse health = Health(s);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("cannot stage snapshots: staging a snapshot of 042/acme.db"),
            std::string::npos) << health.body;
  EXPECT_EQ(health.body.find("cannot write to"), std::string::npos) << "the destination was blamed";
  EXPECT_EQ(StatusJson(s)["replication"]["staging_blocked"],
            "staging a snapshot of 042/acme.db needs 9 bytes");
  EXPECT_NE(MetricsText(s).find("fleetfs_replication_staging_blocked 1\n"), std::string::npos);
}

TEST(Report, a_tenant_that_needs_a_full_snapshot_after_a_drop_is_named_with_its_size) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replica = "file:///r";
  s.replication = replica::ReplicationStats{};
  s.replication->dropped_to_snapshot = 3;
  s.replication->snapshot_needed_tenants = 2;
  s.replication->snapshot_needed_largest = "042/acme.db";
  s.replication->snapshot_needed_bytes = 7340032;
  s.replication->capture_memory_bytes = 1024;
  s.replication->capture_spill_bytes = 4096;
  const std::string words = "042/acme.db, needs one of 7340032 bytes and cannot be replicated "
                            "until the destination takes an object that large";
  // Uploads work: healthy, with the warning (the snapshot ships next round).
  HttpResponse health = Health(s);
  EXPECT_EQ(health.status, 200);
  EXPECT_NE(health.body.find(words), std::string::npos) << health.body;
  // The destination refuses: the reason says what it must take.
  s.replication->failing = "No space left on device";
  health = Health(s);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("No space left on device; 2 tenant(s) had captured commits dropped"),
            std::string::npos) << health.body;
  EXPECT_NE(health.body.find(words), std::string::npos) << health.body;
  const auto rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["dropped_to_snapshot"], 3);
  EXPECT_EQ(rep["snapshot_needed_tenants"], 2);
  EXPECT_EQ(rep["snapshot_needed_largest"], "042/acme.db");
  EXPECT_EQ(rep["snapshot_needed_bytes"], 7340032);
  EXPECT_NE(rep["snapshot_needed"].get<std::string>().find(words), std::string::npos);
  const std::string metrics = MetricsText(s);
  for (const char* line : {"fleetfs_replication_dropped_to_snapshot_total 3\n",
                           "fleetfs_replication_snapshot_needed_tenants 2\n",
                           "fleetfs_replication_snapshot_needed_bytes 7340032\n",
                           "fleetfs_replication_capture_memory_bytes 1024\n",
                           "fleetfs_replication_capture_spill_bytes 4096\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line;
  }
  // None: nothing said.
  s.replication = replica::ReplicationStats{};
  EXPECT_EQ(StatusJson(s)["replication"]["snapshot_needed"], "");
  EXPECT_EQ(Health(s).body, "ok\n");
}

TEST(Report, unshippable_tenants_are_counted_and_named_in_status_metrics_and_health) {
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3)});
  s.replica = "file:///r";
  s.replication = replica::ReplicationStats{};
  EXPECT_EQ(Health(s).body, "ok\n");
  s.replication->unshippable_tenants = 2;
  s.replication->unshippable_example = "042/acme.db";
  nlohmann::json rep = StatusJson(s)["replication"];
  EXPECT_EQ(rep["tenants_unshippable"], 2);
  EXPECT_EQ(rep["unshippable_example"], "042/acme.db");
  EXPECT_NE(MetricsText(s).find("fleetfs_replication_unshippable_tenants 2\n"), std::string::npos);
  HttpResponse health = Health(s);
  EXPECT_EQ(health.status, 200);  // one application's setting does not fail the host
  EXPECT_EQ(health.body.rfind("ok\nwarning: 2 tenant(s) not replicated (042/acme.db", 0), 0u)
      << health.body;
  EXPECT_NE(health.body.find("journal_mode OFF or MEMORY"), std::string::npos);
}

TEST(StatusJson, bytes_that_are_not_utf8_anywhere_never_make_a_serializer_throw) {
  auto waiting = Range("100-199", RangeOutcome::kWaiting, false);
  waiting.status.holder = lease::Held{*SlotRange::Parse("100-199"), "host-\xff", 1000};
  auto failed = Range("200-299", RangeOutcome::kFailed, false);
  failed.status.failure = "cannot open /srv/\xc3(: Permission denied";
  auto s = Snapshot({Range("0-99", RangeOutcome::kRenewed, true, 3), waiting, failed});
  s.owner = "host-\xff";
  s.backing = "/var/\xfe\xfflib";
  s.mountpoint = "/mnt/\xc0\xaf";
  s.store = "sqlite:///tmp/\xed\xa0\x80.db";
  s.replica = "file:///r/\x80";
  s.replication = replica::ReplicationStats{};
  s.replication->failing = "put /r/\x80/x: EROFS";
  s.vfs = VfsSnapshot{};
  std::string text;
  EXPECT_NO_THROW(text = DumpJson(StatusJson(s)));
  EXPECT_NE(text.find("host-\xef\xbf\xbd"), std::string::npos) << "replaced by U+FFFD";
  EXPECT_FALSE(nlohmann::json::parse(text, nullptr, false).is_discarded());
  EXPECT_NO_THROW(MetricsText(s));
  EXPECT_NO_THROW(RangesText(s));
  EXPECT_NO_THROW(Health(s));
}

TEST(TenantsLive, joins_open_handles_and_replication_one_line_per_tenant_sorted) {
  replica::TenantReplication shipped;
  shipped.main_path = "017/acme.db";
  shipped.shipped_seq = 9;
  shipped.shipped_ms = 1000;
  replica::TenantReplication pending;
  pending.main_path = "001/beta.db";
  pending.pending_since_ms = 500;
  const std::string text =
      TenantsLiveJsonl({{"017/acme.db", 2}, {"200/zed.db", 1}}, {shipped, pending});
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["path"], "001/beta.db");
  EXPECT_EQ(lines[0]["open_handles"], 0);
  EXPECT_EQ(lines[0]["pending_since_ms"], 500);
  EXPECT_TRUE(lines[0]["shipped_seq"].is_null());
  EXPECT_EQ(lines[1]["path"], "017/acme.db");
  EXPECT_EQ(lines[1]["open_handles"], 2);
  EXPECT_EQ(lines[1]["shipped_seq"], 9);
  EXPECT_EQ(lines[1]["shipped_ms"], 1000);
  EXPECT_TRUE(lines[1]["pending_since_ms"].is_null());
  EXPECT_EQ(lines[2]["path"], "200/zed.db");
  EXPECT_TRUE(lines[2]["shipped_seq"].is_null());
}

TEST(TenantsLive, is_empty_with_no_active_tenant) { EXPECT_EQ(TenantsLiveJsonl({}, {}), ""); }

TEST(TenantsLive, names_no_tenant_of_a_range_no_longer_served) {
  replica::TenantReplication pending;
  pending.main_path = "001/beta.db";
  pending.pending_since_ms = 500;
  const std::string text = TenantsLiveJsonl({{"017/acme.db", 2}}, {pending},
                                            [](std::string_view path) { return path == "017/acme.db"; });
  EXPECT_EQ(text.find("beta"), std::string::npos) << text;
  EXPECT_NE(text.find("acme"), std::string::npos) << text;
}

}  // namespace
}  // namespace fleetfs::agent
