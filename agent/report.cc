#include "agent/report.h"

#include <iomanip>
#include <map>
#include <string_view>
#include <sstream>

#include "agent/build_info.h"
#include "lease/lease_ttl.h"

namespace fleetfs::agent {

using Json = nlohmann::json;
using lease::RangeOutcome;

std::string_view OutcomeKindName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kClaimed: return "claimed";
    case Outcome::kRenewed: return "renewed";
    case Outcome::kLost: return "lost";
    case Outcome::kWaiting: return "waiting";
    case Outcome::kFailed: return "failed";
    case Outcome::kCount: break;
  }
  return "unknown";
}

VfsSnapshot SnapshotOf(const vfs::VfsStats& stats, std::size_t open_handles) {
  VfsSnapshot s;
  for (std::size_t i = 0; i < vfs::kOpCount; ++i) {
    s.ops[i] = stats.ops[i].load(std::memory_order_relaxed);
    for (std::size_t j = 0; j < vfs::kErrKindCount; ++j) {
      s.errors[i][j] = stats.errors[i][j].load(std::memory_order_relaxed);
    }
  }
  s.fenced = stats.fenced.load(std::memory_order_relaxed);
  s.fences = stats.fences.load(std::memory_order_relaxed);
  s.handles_fenced = stats.handles_fenced.load(std::memory_order_relaxed);
  s.open_handles = open_handles;
  for (std::size_t i = 0; i < vfs::kOpCount; ++i) s.latency[i] = stats.latency[i].Snapshot();
  return s;
}

std::string RangeState(const lease::RangeStatus& status, std::string_view phase) {
  if (phase == "stopped" || phase == "failed") return "stopped";
  if (status.serving) return "serving";
  switch (status.last) {
    case RangeOutcome::kWaiting: return "waiting";
    case RangeOutcome::kHandedOff: return "handed-off";
    case RangeOutcome::kLost: return "lost";
    case RangeOutcome::kNotYet: return "pending";
    case RangeOutcome::kFailed:
    case RangeOutcome::kTimedOut:
    case RangeOutcome::kStillRunning: return status.epoch ? "lapsed" : "failed";
    case RangeOutcome::kClaimed:
    case RangeOutcome::kRenewed: return status.epoch ? "lapsed" : "pending";
  }
  return "pending";
}

namespace {

bool CallFailed(const lease::RangeStatus& s) {
  return s.last == RangeOutcome::kFailed || s.last == RangeOutcome::kTimedOut ||
         s.last == RangeOutcome::kStillRunning;
}

// The replication counters, each named once for status.json and /metrics.
struct ReplicationCounter {
  std::string_view json;    // key in the status document's "replication"
  std::string_view metric;  // Prometheus counter
  std::string_view help;
  std::uint64_t replica::ReplicationStats::*value;
};
using RS = replica::ReplicationStats;
constexpr ReplicationCounter kReplicationCounters[] = {
    {"transactions_shipped", "fleetfs_replication_transactions_shipped_total",
     "Transactions shipped in segments.", &RS::txns_shipped},
    {"bytes_shipped", "fleetfs_replication_bytes_shipped_total", "Bytes put at the destination.",
     &RS::bytes_shipped},
    {"snapshots", "fleetfs_replication_snapshots_total", "Snapshots put.", &RS::snapshots},
    {"segments", "fleetfs_replication_segments_total", "Segments put.", &RS::segments},
    {"upload_failures", "fleetfs_replication_upload_failures_total",
     "Destination calls that failed.", &RS::upload_failures},
    {"restores", "fleetfs_replication_restores_total", "Tenants restored from the replica.",
     &RS::restores},
    {"restore_failures", "fleetfs_replication_restore_failures_total", "Restores that failed.",
     &RS::restore_failures},
    {"stale_replaced", "fleetfs_replication_stale_replaced_total",
     "Files replaced because another owner wrote a newer epoch.", &RS::stale_replaced},
    {"tombstones", "fleetfs_replication_tombstones_total", "Tombstones put for deleted tenants.",
     &RS::tombstones},
    {"newer_epochs_seen", "fleetfs_replication_newer_epochs_total",
     "Tenants whose replica held a newer epoch than ours (their range was dropped).",
     &RS::newer_epochs},
    {"warm_restores_queued", "fleetfs_replication_warm_queued_total",
     "Tenants queued for a background restore after a claim.", &RS::warm_queued},
    {"capture_failures", "fleetfs_replication_capture_failures_total",
     "Captures that could not read a tenant's files; each forces a snapshot.",
     &RS::capture_failures},
    {"absent_listed", "fleetfs_replication_absent_listed_total",
     "Lookups of keys missing here that listed the replica.", &RS::absent_listed},
    {"prepares_refused", "fleetfs_replication_prepares_refused_total",
     "Lookups answered EAGAIN because too many restores were already waiting.",
     &RS::prepares_refused},
    {"capture_spilled", "fleetfs_replication_capture_spilled_total",
     "Captured transactions written to spill files because the capture memory was full.",
     &RS::capture_spilled},
    {"tenant_visits", "fleetfs_replication_tenant_visits_total",
     "Tenants the shipper looked at, over all rounds (only those written or with something "
     "left to ship are).",
     &RS::tenant_visits},
    {"oversized_transactions", "fleetfs_replication_oversized_transactions_total",
     "Transactions larger than one capture holds, shipped in snapshots read from the file.",
     &RS::oversized_transactions},
    {"dropped_to_snapshot", "fleetfs_replication_dropped_to_snapshot_total",
     "Times a tenant's captured commits were dropped (capture memory and spill full); each "
     "makes it need a full snapshot.",
     &RS::dropped_to_snapshot},
};

// The errnos that tell of a failing backing volume, counted over every op.
constexpr vfs::ErrKind kBackingErrKinds[] = {vfs::ErrKind::kErofs, vfs::ErrKind::kEnospc,
                                             vfs::ErrKind::kEio};

std::uint64_t ErrorsOfKind(const std::optional<VfsSnapshot>& v, vfs::ErrKind kind) {
  if (!v) return 0;
  std::uint64_t n = 0;
  for (const auto& row : v->errors) n += row[static_cast<std::size_t>(kind)];
  return n;
}

std::string Seconds(Millis ms) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << static_cast<double>(ms.count()) / 1000.0;
  return out.str();
}

}  // namespace

std::string TenantsLiveJsonl(const std::vector<std::pair<std::string, std::size_t>>& open_handles,
                             const std::vector<replica::TenantReplication>& replication,
                             const std::function<bool(std::string_view)>& served) {
  struct Live {
    std::size_t open = 0;
    const replica::TenantReplication* rep = nullptr;
  };
  std::map<std::string_view, Live> by_path;
  for (const auto& [path, n] : open_handles) by_path[path].open = n;
  for (const auto& r : replication) by_path[r.main_path].rep = &r;
  std::string text;
  for (const auto& [path, live] : by_path) {
    if (served && !served(path)) continue;
    auto nonzero = [](auto v) { return v != 0 ? Json(v) : Json(nullptr); };
    const replica::TenantReplication* r = live.rep;
    Json line = {{"path", path},
                 {"open_handles", live.open},
                 {"shipped_seq", r ? nonzero(r->shipped_seq) : Json(nullptr)},
                 {"shipped_ms", r ? nonzero(r->shipped_ms) : Json(nullptr)},
                 {"pending_since_ms", r ? nonzero(r->pending_since_ms) : Json(nullptr)},
                 {"unshippable", r != nullptr && r->unshippable}};
    text += line.dump(-1, ' ', false, Json::error_handler_t::replace);
    text += '\n';
  }
  return text;
}

Json StatusJson(const AgentSnapshot& s) {
  Json ranges = Json::array();
  for (const RangeSnapshot& r : s.ranges) {
    const lease::RangeStatus& st = r.status;
    Json range = {
        {"range", st.range.ToString()},
        {"epoch", st.epoch ? Json(st.epoch->value()) : Json(nullptr)},
        {"state", RangeState(st, s.phase)},
        {"serving", st.serving},
        {"lease_left_ms", st.lease_left.count()},
        {"last_refresh", lease::OutcomeName(st.last)},
        {"call_running", st.call_running},
        {"fence_floor", st.fence_floor},
        {"open_files", r.open_files},
    };
    if (s.replication) range["replication_lag_s"] = r.replication_lag_s;
    if (st.serving) {
      // On the agent's monotonic clock, CLOCK_BOOTTIME (fleet/clock.h says
      // why), which every process of the host can read.
      range["local_lease_end_monotonic_s"] =
          s.monotonic_now_s +
          std::chrono::duration<double>(st.valid_until - s.mono_now).count();
    }
    if (st.holder) {
      range["held_by"] = {{"owner", st.holder->owner},
                          {"range", st.holder->range.ToString()},
                          {"until_ms", r.holder_until_wall_ms},
                          {"until", lease::FormatWallTime(r.holder_until_wall_ms)}};
    }
    if (!st.failure.empty()) range["failure"] = st.failure;
    ranges.push_back(std::move(range));
  }
  Json handoffs = Json::array();
  for (const HandoffStatus& h : s.handoffs) {
    handoffs.push_back({{"range", h.range.ToString()},
                        {"to", h.to.empty() ? Json(nullptr) : Json(h.to)},
                        {"state", h.state},
                        {"note", h.note}});
  }
  Json outcomes = Json::object();
  for (std::size_t i = 0; i < s.outcomes.size(); ++i) {
    outcomes[std::string(OutcomeKindName(static_cast<Outcome>(i)))] = s.outcomes[i];
  }
  Json doc = {
      {"owner", s.owner},
      {"store", s.store},
      {"ttl_ms", s.ttl.count()},
      {"ttl", lease::FormatDuration(s.ttl)},
      {"mode", s.mode},
      {"backing", s.backing},
      {"mount", s.mountpoint},
      {"admin", s.admin},
      {"pid", s.pid},
      {"phase", s.phase},
      {"now_ms", s.now_ms},
      {"monotonic_now_s", s.monotonic_now_s},
      {"refreshes", s.refreshes},
      {"refresh_outcomes", outcomes},
      {"ranges", ranges},
      {"handoffs", handoffs},
      {"open_files", s.vfs ? s.vfs->open_handles : 0},
      {"fenced_operations", s.vfs ? s.vfs->fenced : 0},
  };
  // null until the mount is up: only then is the transport known.
  doc["transport"] = s.transport.empty() ? Json(nullptr) : Json(s.transport);
  if (!s.transport_why.empty()) doc["transport_why"] = s.transport_why;
  if (!s.store_tls.empty()) {
    doc["store_tls"] = {
        {"ca", s.store_tls.ca}, {"cert", s.store_tls.cert}, {"key", s.store_tls.key}};
  }
  if (s.replication) {
    const replica::ReplicationStats& r = *s.replication;
    Json rep = {{"replica", s.replica},
                {"replica_endpoint", s.replica_s3.endpoint},
                {"replica_region", s.replica_s3.region},
                {"replica_path_style", s.replica_s3.path_style ? Json(*s.replica_s3.path_style)
                                                               : Json(nullptr)}};
    for (const ReplicationCounter& c : kReplicationCounters) rep[std::string(c.json)] = r.*c.value;
    rep["tenants"] = r.tenants;
    rep["tenants_active"] = r.active_tenants;
    rep["tenants_unshipped"] = r.unshipped_tenants;
    rep["tenants_unshippable"] = r.unshippable_tenants;
    rep["unshippable_example"] = r.unshippable_example;
    rep["lag_p50_s"] = r.lag_p50_s;
    rep["lag_p99_s"] = r.lag_p99_s;
    rep["failing"] = r.failing;
    rep["staging_blocked"] = r.staging_blocked;
    rep["capture_memory_bytes"] = r.capture_memory_bytes;
    rep["capture_memory_limit"] = r.capture_memory_limit;
    rep["capture_spill_bytes"] = r.capture_spill_bytes;
    rep["capture_spill_limit"] = r.capture_spill_limit;
    rep["snapshot_needed_tenants"] = r.snapshot_needed_tenants;
    rep["snapshot_needed_largest"] = r.snapshot_needed_largest;
    rep["snapshot_needed_bytes"] = r.snapshot_needed_bytes;
    rep["snapshot_needed"] = SnapshotNeededText(r);
    Json requests = Json::object();
    for (std::size_t k = 0; k < replica::kRequestKinds; ++k) {
      const auto kind = static_cast<replica::Request>(k);
      requests[std::string(replica::RequestName(kind))] = s.replica_requests.of(kind);
    }
    rep["requests"] = std::move(requests);
    rep["request_failures"] = s.replica_requests.failures;
    doc["replication"] = std::move(rep);
  } else {
    doc["replication"] = "off: no --replica is configured; commits are not shipped";
  }
  const BackingReport& b = s.backing_volume;
  Json errors = Json::object();
  for (vfs::ErrKind kind : kBackingErrKinds) {
    errors[std::string(vfs::ErrKindName(kind))] = ErrorsOfKind(s.vfs, kind);
  }
  doc["backing_volume"] = {
      {"path", s.backing},
      {"state", BackingStateName(b.state)},
      {"reason", b.reason},
      {"enospc_recent", b.enospc_recent},
      {"probes", b.probes},
      {"probes_clear", b.probes_clear},
      {"errors", errors},
  };
  if (!s.failure.empty()) doc["failure"] = s.failure;
  HttpResponse health = Health(s);
  doc["health"] = {{"ok", health.status == 200}, {"reason", health.body}};
  return doc;
}

std::string DumpJson(const Json& doc) {
  return doc.dump(2, ' ', false, Json::error_handler_t::replace);
}

std::string RangesText(const AgentSnapshot& s) {
  std::ostringstream out;
  for (const RangeSnapshot& r : s.ranges) {
    const lease::RangeStatus& st = r.status;
    out << st.range.ToString() << ' ' << RangeState(st, s.phase) << " epoch "
        << (st.epoch ? st.epoch->ToString() : "-") << " lease_left " << Seconds(st.lease_left)
        << "s open_files " << r.open_files;
    if (st.holder) {
      out << " held_by " << st.holder->owner << " until "
          << lease::FormatWallTime(r.holder_until_wall_ms);
    }
    if (s.replication) out << " replication_lag " << r.replication_lag_s << "s";
    out << '\n';
  }
  return out.str();
}

HttpResponse Health(const AgentSnapshot& s) {
  auto unhealthy = [](std::string reason) {
    return HttpResponse{503, "text/plain; charset=utf-8", reason + "\n"};
  };
  const BackingReport& backing = s.backing_volume;
  if (s.phase == "failed" || backing.state == BackingState::kFailed) {
    const std::string why = !backing.reason.empty() ? backing.reason : s.failure;
    return unhealthy(why + (s.phase == "failed"
                                ? "; serving nothing and claiming nothing: fix the volume, then "
                                  "restart the agent"
                                : "; stopping serving and releasing the ranges"));
  }
  if (s.phase == "starting") return unhealthy("starting: the first claim has not answered");
  if (s.phase == "draining" || s.phase == "stopping" || s.phase == "stopped") {
    return unhealthy("stopping: the agent is shutting down");
  }
  for (const RangeSnapshot& r : s.ranges) {
    const lease::RangeStatus& st = r.status;
    const std::string name = "range " + st.range.ToString();
    if (CallFailed(st)) {
      return unhealthy(name + ": the store call failed: " + st.failure +
                       (st.serving ? " (still serving on the local lease)" : ""));
    }
    if (st.serving || st.last == RangeOutcome::kWaiting || st.last == RangeOutcome::kHandedOff) {
      continue;
    }
    if (st.last == RangeOutcome::kLost) return unhealthy(name + " was lost to a newer epoch");
    if (st.epoch) return unhealthy(name + " lapsed at epoch " + st.epoch->ToString());
    return unhealthy(name + " is not claimed yet");
  }
  if (backing.state == BackingState::kFull) {
    return unhealthy(backing.reason + "; still serving what fits");
  }
  // A tenant that needs a full snapshot after a drop: the likeliest reason a
  // destination or the spool refuses, so said beside either.
  const std::string needed = s.replication ? SnapshotNeededText(*s.replication) : "";
  const std::string also = needed.empty() ? "" : "; " + needed;
  if (s.replication && !s.replication->failing.empty()) {
    return unhealthy("the replicator cannot write to " + s.replica + ": " +
                     s.replication->failing + also);
  }
  if (s.replication && !s.replication->staging_blocked.empty()) {
    // The backing volume's fault, not the destination's: say which.
    return unhealthy("the replicator cannot stage snapshots: " + s.replication->staging_blocked +
                     also);
  }
  std::string warnings;
  // Healthy still while uploads work: the snapshot ships next round.
  if (!needed.empty()) warnings += "warning: " + needed + "\n";
  if (s.replication && s.replication->unshippable_tenants > 0) {
    // Healthy still: one tenant's journal mode is its application's setting,
    // and a failing health check would move every tenant of the host.
    warnings += "warning: " + UnshippableText(*s.replication) + "\n";
  }
  return HttpResponse{200, "text/plain; charset=utf-8", "ok\n" + warnings};
}

std::string UnshippableText(const replica::ReplicationStats& r) {
  return std::to_string(r.unshippable_tenants) + " tenant(s) not replicated (" +
         r.unshippable_example + (r.unshippable_tenants > 1 ? " and others" : "") +
         "): written with journal_mode OFF or MEMORY, which leaves no transaction's end on "
         "disk, so a copy could be torn; each ships again, from a fresh snapshot, once it "
         "commits with a journal or WAL";
}

std::string SnapshotNeededText(const replica::ReplicationStats& r) {
  if (r.snapshot_needed_tenants == 0) return "";
  return std::to_string(r.snapshot_needed_tenants) +
         " tenant(s) had captured commits dropped (the agent's capture memory and spill were "
         "full) and now need a full snapshot; the largest, " + r.snapshot_needed_largest +
         ", needs one of " + std::to_string(r.snapshot_needed_bytes) +
         " bytes and cannot be replicated until the destination takes an object that large";
}

namespace {

// A label value as the text format wants it: backslash, quote and newline
// escaped.
std::string LabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string MetricsText(const AgentSnapshot& s) {
  std::ostringstream out;
  auto help = [&](std::string_view name, std::string_view type, std::string_view text) {
    out << "# HELP " << name << ' ' << text << "\n# TYPE " << name << ' ' << type << '\n';
  };
  // One histogram family: its HELP and TYPE once, then one histogram per
  // label value.
  auto histograms = [&](std::string_view name, std::string_view help_text,
                        const HistogramBounds& bounds, std::string_view label, std::size_t n,
                        auto value_of, auto snapshot_of) {
    WriteHistogramHeader(out, name, help_text);
    for (std::size_t i = 0; i < n; ++i) {
      WriteHistogram(out, name, std::string(label) + "=\"" + LabelValue(value_of(i)) + "\"",
                     snapshot_of(i), bounds);
    }
  };
  help("fleetfs_build_info", "gauge", "The build: version, commit and compiler; always 1.");
  out << "fleetfs_build_info{version=\"" << LabelValue(kBuildVersion) << "\",commit=\""
      << LabelValue(kBuildCommit) << "\",compiler=\"" << LabelValue(kBuildCompiler) << "\"} 1\n";
  help("fleetfs_ranges_configured", "gauge", "Slot ranges this agent is configured to own.");
  out << "fleetfs_ranges_configured " << s.ranges.size() << '\n';
  std::size_t held = 0;
  for (const auto& r : s.ranges) held += r.status.serving ? 1 : 0;
  help("fleetfs_ranges_held", "gauge", "Slot ranges served now (a valid local lease).");
  out << "fleetfs_ranges_held " << held << '\n';
  help("fleetfs_range_epoch", "gauge", "Epoch held per range; 0 when none.");
  for (const auto& r : s.ranges) {
    out << "fleetfs_range_epoch{range=\"" << r.status.range.ToString() << "\"} "
        << (r.status.epoch ? r.status.epoch->value() : 0) << '\n';
  }
  help("fleetfs_range_serving", "gauge", "1 while the range is served.");
  for (const auto& r : s.ranges) {
    out << "fleetfs_range_serving{range=\"" << r.status.range.ToString() << "\"} "
        << (r.status.serving ? 1 : 0) << '\n';
  }
  help("fleetfs_range_lease_seconds_left", "gauge", "Local lease time left per range.");
  for (const auto& r : s.ranges) {
    out << "fleetfs_range_lease_seconds_left{range=\"" << r.status.range.ToString() << "\"} "
        << Seconds(r.status.lease_left) << '\n';
  }
  help("fleetfs_range_open_files", "gauge", "Open file handles per range.");
  for (const auto& r : s.ranges) {
    out << "fleetfs_range_open_files{range=\"" << r.status.range.ToString() << "\"} "
        << r.open_files << '\n';
  }
  help("fleetfs_refreshes_total", "counter", "Lease refreshes ended.");
  out << "fleetfs_refreshes_total " << s.refreshes << '\n';
  help("fleetfs_refresh_outcomes_total", "counter", "Range outcomes of refreshes, by kind.");
  for (std::size_t i = 0; i < s.outcomes.size(); ++i) {
    out << "fleetfs_refresh_outcomes_total{outcome=\"" << OutcomeKindName(static_cast<Outcome>(i))
        << "\"} " << s.outcomes[i] << '\n';
  }
  VfsSnapshot v = s.vfs.value_or(VfsSnapshot{});
  help("fleetfs_open_handles", "gauge", "Open file handles on the mount.");
  out << "fleetfs_open_handles " << v.open_handles << '\n';
  help("fleetfs_fenced_operations_total", "counter",
       "Operations refused with ESTALE because their range is no longer served.");
  out << "fleetfs_fenced_operations_total " << v.fenced << '\n';
  help("fleetfs_fences_total", "counter", "Ranges fenced (lapse, loss, shutdown).");
  out << "fleetfs_fences_total " << v.fences << '\n';
  help("fleetfs_fuse_operations_total", "counter", "FUSE operations by kind.");
  for (std::size_t i = 0; i < vfs::kOpCount; ++i) {
    out << "fleetfs_fuse_operations_total{op=\"" << vfs::OpName(static_cast<vfs::Op>(i)) << "\"} "
        << v.ops[i] << '\n';
  }
  histograms(
      "fleetfs_fuse_request_duration_seconds",
      "FUSE requests by op, from the handler's start to its reply (a lookup or open that waits "
      "for a restore until its answer); time queued in /dev/fuse before a worker takes the "
      "request is not included.",
      kRequestBounds, "op", vfs::kOpCount, [](std::size_t i) { return vfs::OpName(static_cast<vfs::Op>(i)); },
      [&](std::size_t i) { return v.latency[i]; });
  histograms(
      "fleetfs_store_call_duration_seconds",
      "Calls to the ownership store by kind, failed or not (a renewal slower than ttl/3 lapses "
      "its range); observed when a call returns, so a hung call shows only at its time limit "
      "(etcd call timeout, SQLite busy timeout), as a failure.",
      kCallBounds, "call", lease::kStoreCallKinds,
      [](std::size_t i) { return lease::StoreCallName(static_cast<lease::StoreCallKind>(i)); },
      [&](std::size_t i) { return s.store_call_time[i]; });
  help("fleetfs_fuse_errors_total", "counter", "FUSE operations answered with an error, by kind.");
  for (std::size_t i = 0; i < vfs::kOpCount; ++i) {
    for (std::size_t j = 0; j < vfs::kErrKindCount; ++j) {
      if (v.errors[i][j] == 0) continue;
      out << "fleetfs_fuse_errors_total{op=\"" << vfs::OpName(static_cast<vfs::Op>(i))
          << "\",errno=\"" << vfs::ErrKindName(static_cast<vfs::ErrKind>(j)) << "\"} "
          << v.errors[i][j] << '\n';
    }
  }
  help("fleetfs_fuse_errno_total", "counter",
       "FUSE operations answered with EROFS, ENOSPC or EIO, over every op (EIO also counts "
       "restores that failed).");
  for (vfs::ErrKind kind : kBackingErrKinds) {
    out << "fleetfs_fuse_errno_total{errno=\"" << vfs::ErrKindName(kind) << "\"} "
        << ErrorsOfKind(s.vfs, kind) << '\n';
  }
  const BackingReport& b = s.backing_volume;
  help("fleetfs_backing_full", "gauge",
       "1 while writes to the backing volume failed with ENOSPC within the last window.");
  out << "fleetfs_backing_full " << (b.state == BackingState::kFull ? 1 : 0) << '\n';
  help("fleetfs_backing_failed", "gauge",
       "1 once a probe found the backing volume read-only or failing writes (the agent stands "
       "down).");
  out << "fleetfs_backing_failed " << (b.state == BackingState::kFailed ? 1 : 0) << '\n';
  help("fleetfs_backing_probes_total", "counter",
       "Probes of the backing volume after EROFS or write EIO through the mount.");
  out << "fleetfs_backing_probes_total " << b.probes << '\n';
  if (s.replication) {
    const replica::ReplicationStats& r = *s.replication;
    help("fleetfs_range_replication_lag_seconds", "gauge",
         "Seconds since the oldest commit of the range not yet shipped; 0 when all are.");
    for (const auto& rs : s.ranges) {
      out << "fleetfs_range_replication_lag_seconds{range=\"" << rs.status.range.ToString()
          << "\"} " << rs.replication_lag_s << '\n';
    }
    for (const ReplicationCounter& c : kReplicationCounters) {
      help(c.metric, "counter", c.help);
      out << c.metric << ' ' << r.*c.value << '\n';
    }
    // Each request is one to S3 (what it bills): a steady tenant should cost
    // one create per sync interval with something to ship, and no list.
    help("fleetfs_replica_requests_total", "counter",
         "Requests to the replica destination by kind, counted when made, failed or not "
         "(put and create include their from-file forms; list includes listings from a name).");
    for (std::size_t k = 0; k < replica::kRequestKinds; ++k) {
      const auto kind = static_cast<replica::Request>(k);
      out << "fleetfs_replica_requests_total{kind=\"" << replica::RequestName(kind) << "\"} "
          << s.replica_requests.of(kind) << '\n';
    }
    histograms(
        "fleetfs_replica_request_duration_seconds",
        "Requests to the replica destination by kind, failed or not; observed when a request "
        "returns.",
        kCallBounds, "kind",
        replica::kRequestKinds,
        [](std::size_t i) { return replica::RequestName(static_cast<replica::Request>(i)); },
        [&](std::size_t i) { return s.replica_request_time[i]; });
    WriteHistogramHeader(out, "fleetfs_restore_duration_seconds",
                         "Restores from the replica published here, from the start to the "
                         "publication (download, replay, publish).");
    WriteHistogram(out, "fleetfs_restore_duration_seconds", "", r.restore_time, kCallBounds);
    help("fleetfs_replica_request_failures_total", "counter",
         "Requests to the replica destination that returned an error, of any kind.");
    out << "fleetfs_replica_request_failures_total " << s.replica_requests.failures << '\n';
    help("fleetfs_replication_lag_seconds", "gauge",
         "Commit-to-shipped time over the last shipped commits.");
    out << "fleetfs_replication_lag_seconds{quantile=\"0.5\"} " << r.lag_p50_s << '\n';
    out << "fleetfs_replication_lag_seconds{quantile=\"0.99\"} " << r.lag_p99_s << '\n';
    help("fleetfs_replication_active_tenants", "gauge",
         "Tenants the shipper visits each round: written, or with something left to ship.");
    out << "fleetfs_replication_active_tenants " << r.active_tenants << '\n';
    help("fleetfs_replication_unshippable_tenants", "gauge",
         "Tenants not replicated because they are written with journal_mode OFF or MEMORY.");
    out << "fleetfs_replication_unshippable_tenants " << r.unshippable_tenants << '\n';
    help("fleetfs_replication_failing", "gauge", "1 while uploads to the destination fail.");
    out << "fleetfs_replication_failing " << (r.failing.empty() ? 0 : 1) << '\n';
    help("fleetfs_replication_staging_blocked", "gauge",
         "1 while a snapshot waits for room on the backing volume (the applications' reserve).");
    out << "fleetfs_replication_staging_blocked " << (r.staging_blocked.empty() ? 0 : 1) << '\n';
    help("fleetfs_replication_capture_memory_bytes", "gauge",
         "Captured commits not yet shipped held in memory, all tenants together.");
    out << "fleetfs_replication_capture_memory_bytes " << r.capture_memory_bytes << '\n';
    help("fleetfs_replication_capture_spill_bytes", "gauge",
         "Captured commits (and segments waiting for a retry) spilled to the backing volume.");
    out << "fleetfs_replication_capture_spill_bytes " << r.capture_spill_bytes << '\n';
    help("fleetfs_replication_snapshot_needed_tenants", "gauge",
         "Tenants that need a full snapshot because their captured commits were dropped.");
    out << "fleetfs_replication_snapshot_needed_tenants " << r.snapshot_needed_tenants << '\n';
    help("fleetfs_replication_snapshot_needed_bytes", "gauge",
         "The largest snapshot such a tenant needs: the destination must take an object this "
         "large before it is replicated again.");
    out << "fleetfs_replication_snapshot_needed_bytes " << r.snapshot_needed_bytes << '\n';
  }
  return out.str();
}

}  // namespace fleetfs::agent
