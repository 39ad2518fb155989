#include "agent/tenant_cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "agent/cli.h"
#include "agent/replica_cli.h"
#include "fleet/db_header.h"
#include "fleet/layout.h"
#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"
#include "fleet/wal_format.h"
#include "lease/lease_ttl.h"
#include "lease/owner_id.h"
#include "lease/ownership_table.h"
#include "lease/slot_range.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j, int indent) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

Json Opt(const auto& v) { return v ? Json(*v) : Json(nullptr); }

// WAL frames inspect reads at most (64 MiB of 4 KiB pages): a log of any
// size costs a bounded read; beyond it the count says "at least".
constexpr std::uint64_t kMaxWalFramesCounted = 16384;

std::string LocalTime(WallMs ms) { return lease::FormatWallTime(ms, /*local=*/true); }

// ── the running agent, as its control files show it ───────────────────────

struct ServedRange {
  lease::SlotRange range = *lease::SlotRange::Make(0, 0);
  bool serving = false;
  std::uint64_t epoch = 0;
  std::int64_t lease_left_ms = 0;
  std::string state;
  std::string held_by;  // owner of the row that holds it, when waiting
};

struct AgentView {
  std::string owner, store, backing;
  FleetMode mode = FleetMode::kTenant;
  std::vector<ServedRange> ranges;
  std::optional<std::string> replica;  // nullopt: replication off
  // An s3:// replica's endpoint, region and path style ("true", "false"),
  // as the agent uses them; "" when unset.
  std::string replica_endpoint, replica_region, replica_path_style;
  WallMs now_ms = 0;

  const ServedRange* RangeOf(Slot slot) const {
    for (const ServedRange& r : ranges) {
      if (r.range.Contains(slot)) return &r;
    }
    return nullptr;
  }
  const ServedRange* ServingRangeOf(Slot slot) const {
    const ServedRange* r = RangeOf(slot);
    return r && r->serving ? r : nullptr;
  }
};

Status NotAMount(const std::string& mount, const std::string& path, int e) {
  if (e == ENOTCONN) {
    return Status(Code::kFailedPrecondition,
                  mount + " is a stale mount: its agent has ended; start 'fleetfs mount' again "
                          "to clean it up");
  }
  return Status(Code::kFailedPrecondition, mount + " is not a running fleetfs mount (" + path +
                                               ": " + std::strerror(e) + ")");
}

Result<AgentView> ReadAgent(const std::string& mount) {
  const std::string path = mount + "/.fleetfs/status.json";
  std::ifstream in(path);
  if (!in) return NotAMount(mount, path, errno);
  std::stringstream text;
  text << in.rdbuf();
  const Json doc = Json::parse(text.str(), nullptr, false);
  const std::string not_status = path + " is not a status document this fleetfs reads";
  if (doc.is_discarded() || !doc.is_object()) return Internal(not_status);
  try {
    AgentView v;
    v.owner = doc.at("owner").get<std::string>();
    v.store = doc.at("store").get<std::string>();
    v.backing = doc.at("backing").get<std::string>();
    FLEETFS_ASSIGN_OR_RETURN(v.mode, ParseMode(doc.at("mode").get<std::string>()));
    v.now_ms = doc.at("now_ms").get<WallMs>();
    for (const Json& r : doc.at("ranges")) {
      ServedRange s;
      FLEETFS_ASSIGN_OR_RETURN(s.range, lease::SlotRange::Parse(r.at("range").get<std::string>()));
      s.serving = r.at("serving").get<bool>();
      s.epoch = r.at("epoch").is_null() ? 0 : r.at("epoch").get<std::uint64_t>();
      s.lease_left_ms = r.at("lease_left_ms").get<std::int64_t>();
      s.state = r.at("state").get<std::string>();
      if (r.contains("held_by")) s.held_by = r["held_by"].at("owner").get<std::string>();
      v.ranges.push_back(std::move(s));
    }
    // An object with the replica when replication is on; else a sentence.
    if (doc.contains("replication") && doc["replication"].is_object()) {
      const Json& rep = doc["replication"];
      v.replica = rep.at("replica").get<std::string>();
      v.replica_endpoint = rep.value("replica_endpoint", std::string());
      v.replica_region = rep.value("replica_region", std::string());
      if (rep.contains("replica_path_style") && rep["replica_path_style"].is_boolean()) {
        v.replica_path_style = rep["replica_path_style"].get<bool>() ? "true" : "false";
      }
    }
    return v;
  } catch (const Json::exception& e) {
    return Internal(not_status + " (" + e.what() + ")");
  }
}

// The agent's live state of its active tenants and those with open handles,
// or nullopt (and why in `why`) when the file cannot be read: lag and open
// handles are then unknown, never taken as 0. All lines are held at once:
// the agent writes one per active or open tenant (never one per file of the
// volume), so this follows what is busy now, not the fleet.
std::optional<std::unordered_map<std::string, TenantLive>> ReadLive(const std::string& mount,
                                                                    std::string* why) {
  const std::string path = mount + "/.fleetfs/tenants-live.jsonl";
  std::ifstream in(path);
  if (!in.is_open()) {
    *why = path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::unordered_map<std::string, TenantLive> live;
  std::string line;
  while (std::getline(in, line)) {
    if (auto parsed = ParseTenantLive(line)) live.insert(std::move(*parsed));
  }
  if (in.bad()) {
    *why = path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  return live;
}

void WarnLiveUnknown(std::ostream& err, const std::string& why) {
  err << "fleetfs: warning: cannot read the agent's live state (" << why
      << "): lag and open handles are shown as unknown ('?' in text, null in JSON)\n";
}

int Fail(std::ostream& err, const Status& status) {
  err << "fleetfs: " << status.message() << '\n';
  return status.code() == Code::kInvalidArgument ? kExitBadInput : kExitFailure;
}

// ── one tenant's files ─────────────────────────────────────────────────────

// Opens `name` under `dir` to read, never following a symlink and never
// blocking on a FIFO; O_NOATIME where the caller may (owner or root).
UniqueFd OpenToRead(int dir, const std::string& name) {
  const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  int fd = ::openat(dir, name.c_str(), flags | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::openat(dir, name.c_str(), flags);
  return UniqueFd(fd);
}

struct FileFacts {
  std::uint64_t size = 0;
  std::optional<db::Header> header;
  std::optional<std::uint64_t> epoch_stamp;
  std::optional<std::string> key_stamp;
  std::optional<ShippedStamp> shipped_stamp;
};

// A regular file's facts; nullopt for anything else or an unreadable one.
std::optional<FileFacts> ReadMainFile(int dir, const std::string& name) {
  // Looked at before it is opened: opening a device can act on it.
  struct stat first {};
  if (::fstatat(dir, name.c_str(), &first, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(first.st_mode)) {
    return std::nullopt;
  }
  UniqueFd fd = OpenToRead(dir, name);
  if (!fd.valid()) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  FileFacts f;
  f.size = static_cast<std::uint64_t>(st.st_size);
  std::uint8_t bytes[db::kHeaderSize];
  const ssize_t n = ::pread(fd.get(), bytes, sizeof bytes, 0);
  if (n > 0) f.header = db::ParseHeader(bytes, static_cast<std::size_t>(n));
  f.epoch_stamp = ReadEpochStamp(fd.get());
  f.key_stamp = ReadKeyStamp(fd.get());
  f.shipped_stamp = ReadShippedStamp(fd.get());
  return f;
}

// A sidecar's size; nullopt when there is no such regular file.
std::optional<std::uint64_t> SidecarSize(int dir, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(st.st_size);
}

std::optional<double> LagOf(const AgentView& agent, const TenantLive* live, WallMs now) {
  if (!agent.replica) return std::nullopt;
  if (live == nullptr || !live->pending_since_ms) return 0.0;
  return std::max<WallMs>(0, now - *live->pending_since_ms) / 1000.0;
}

// ── text ───────────────────────────────────────────────────────────────────

struct Column {
  const char* title;
  int width;
};
constexpr Column kColumns[] = {{"KEY", 24},     {"SLOT", 5},    {"SIZE", 7},
                               {"JOURNAL", 10}, {"EPOCH", 6},   {"SHIPPED", 23},
                               {"SEQ", 6},      {"LAG", 7},     {"OPEN", 4}};

std::string Row(const std::vector<std::string>& cells) {
  std::string line;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    line += cells[i];
    if (i + 1 < cells.size()) {
      const std::size_t w = static_cast<std::size_t>(kColumns[i].width);
      line += std::string(cells[i].size() < w ? w - cells[i].size() + 2 : 2, ' ');
    }
  }
  return line;
}

std::string Lag(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

}  // namespace

std::optional<std::pair<std::string, TenantLive>> ParseTenantLive(std::string_view line) {
  const Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    TenantLive live;
    live.open_handles = j.value("open_handles", std::size_t{0});
    auto opt = [&](const char* name, auto& to) {
      if (j.contains(name) && !j[name].is_null()) {
        to = j[name].get<typename std::remove_reference_t<decltype(to)>::value_type>();
      }
    };
    opt("shipped_seq", live.shipped_seq);
    opt("shipped_ms", live.shipped_ms);
    opt("pending_since_ms", live.pending_since_ms);
    live.unshippable = j.value("unshippable", false);
    return std::make_pair(j.at("path").get<std::string>(), live);
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

Json TenantLineJson(const TenantLine& t) {
  return {{"key", t.key},
          {"path", t.path},
          {"slot", t.slot},
          {"size", t.size},
          {"wal_size", t.wal_size},
          {"journal_mode", t.journal_mode},
          {"epoch_stamp", Opt(t.epoch_stamp)},
          {"served_epoch", t.served_epoch},
          // Below the served epoch: checked (or restored) at its next open.
          {"stale", !t.epoch_stamp || *t.epoch_stamp < t.served_epoch},
          {"shipped_seq", Opt(t.shipped_seq)},
          {"shipped_ms", Opt(t.shipped_ms)},
          {"lag_s", t.live_unknown ? Json(nullptr) : Opt(t.lag_s)},
          {"open_handles", t.live_unknown ? Json(nullptr) : Json(t.open_handles)},
          {"unshippable", t.unshippable}};
}

std::string HumanBytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes);
  const char* units = "KMGTP";
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.1f%c" : "%.0f%c", v, units[u]);
  return buf;
}

std::string TenantTextHeader() {
  std::vector<std::string> titles;
  for (const Column& c : kColumns) titles.emplace_back(c.title);
  return Row(titles);
}

std::string TenantTextRow(const TenantLine& t) {
  std::string epoch = t.epoch_stamp ? std::to_string(*t.epoch_stamp) : "-";
  if (!t.epoch_stamp || *t.epoch_stamp < t.served_epoch) epoch += "*";
  return Row({lease::Printable(t.key), std::to_string(t.slot), HumanBytes(t.size + t.wal_size),
              t.journal_mode, epoch,
              t.unshippable  ? "not replicated"
              : t.shipped_ms ? LocalTime(*t.shipped_ms)
                             : "-",
              t.shipped_seq ? std::to_string(*t.shipped_seq) : "-",
              t.live_unknown ? "?" : t.lag_s ? Lag(*t.lag_s) : "-",
              t.live_unknown ? "?" : std::to_string(t.open_handles)});
}

// ── fleetfs ls ─────────────────────────────────────────────────────────────

int RunLs(const std::string& mount, bool json, std::ostream& out, std::ostream& err) {
  auto agent = ReadAgent(mount);
  if (!agent.ok()) return Fail(err, agent.status());
  std::string live_why;
  const auto live = ReadLive(mount, &live_why);
  if (!live) WarnLiveUnknown(err, live_why);
  UniqueFd root(::open(agent->backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    const int e = errno;
    err << "fleetfs: cannot read the backing directory " << agent->backing << " ("
        << std::strerror(e) << "): 'fleetfs ls' reads the tenants' files there; run it as root "
        << "or as the agent's user\n";
    return kExitFailure;
  }
  const WallMs now = SystemWallClock().NowMs();
  if (!json) out << TenantTextHeader() << '\n';
  for (int bucket = 0; bucket < kBucketCount; ++bucket) {
    const Slot first = static_cast<Slot>(bucket * kSlotsPerBucket);
    const Slot last = static_cast<Slot>(first + kSlotsPerBucket - 1);
    bool any = false;
    for (const ServedRange& r : agent->ranges) {
      any |= r.serving && r.range.first() <= last && first <= r.range.last();
    }
    if (!any) continue;
    const std::string bucket_name = BucketName(bucket);
    UniqueFd dir(::openat(root.get(), bucket_name.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) continue;  // made with its first file; a symlink is no bucket
    // One bucket's names at a time, sorted, so the listing is stable.
    std::vector<std::string> names;
    {
      DIR* d = ::fdopendir(::dup(dir.get()));
      if (d == nullptr) continue;
      while (const dirent* e = ::readdir(d)) {
        if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
        auto file = ParseFleetName(agent->mode, bucket, e->d_name);
        if (file && file->role == FileRole::kMain && agent->ServingRangeOf(file->slot)) {
          names.emplace_back(e->d_name);
        }
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const FleetFile file = *ParseFleetName(agent->mode, bucket, name);
      const auto facts = ReadMainFile(dir.get(), name);
      if (!facts) continue;  // not a regular file, or gone meanwhile
      const auto wal = SidecarSize(dir.get(), name + "-wal");
      TenantLine t;
      t.key = file.key;
      t.path = file.main_path;
      t.slot = file.slot;
      t.size = facts->size;
      t.wal_size = wal.value_or(0);
      t.journal_mode = std::string(db::JournalMode(facts->header, facts->size, wal.has_value()));
      t.epoch_stamp = facts->epoch_stamp;
      t.served_epoch = agent->ServingRangeOf(file.slot)->epoch;
      const TenantLive* l = nullptr;
      if (live) {
        const auto it = live->find(file.main_path);
        if (it != live->end()) l = &it->second;
      }
      t.live_unknown = !live.has_value();
      t.unshippable = l && l->unshippable;
      if (agent->replica) {
        if (l && l->shipped_seq) {
          t.shipped_seq = l->shipped_seq;
          t.shipped_ms = l->shipped_ms;
        } else if (facts->shipped_stamp) {
          t.shipped_seq = facts->shipped_stamp->seq;  // before this agent started; time unknown
        }
      }
      t.lag_s = LagOf(*agent, l, now);
      t.open_handles = l ? l->open_handles : 0;
      out << (json ? Dump(TenantLineJson(t), -1) : TenantTextRow(t)) << '\n';
    }
  }
  out.flush();
  return out ? kExitOk : kExitFailure;
}

// ── fleetfs inspect ────────────────────────────────────────────────────────

namespace {

// Who holds `slot` on the store the agent uses, for a tenant not served
// here; a sentence either way.
std::string WhoServes(const AgentView& agent, Slot slot) {
  SystemWallClock clock;
  auto store = lease::OpenStore(agent.store, clock, lease::SqliteStore::Access::kExisting);
  if (!store.ok()) return "unknown (the store could not be read: " + store.status().message() + ")";
  auto table = (*store)->ReadSlots({slot});
  if (!table.ok()) return "unknown (the store could not be read: " + table.status().message() + ")";
  const lease::OwnershipRow* row = table->RowFor(slot);
  if (row == nullptr) return "nobody: the slot is not claimed";
  const WallMs now = (*store)->NowMs();
  if (row->lease_expires_ms <= now) {
    return "nobody: " + lease::Printable(row->owner.str()) + "'s lease on " +
           row->range.ToString() + " lapsed";
  }
  return lease::Printable(row->owner.str()) + " (range " + row->range.ToString() + ", epoch " +
         row->epoch.ToString() + ", lease until " +
         LocalTime((*store)->ToWallMs(row->lease_expires_ms)) + ")";
}

// The highest epoch the agent's store ever granted (its counter), as the
// agent's restore judges a replica's epochs by; nullopt when unreadable.
std::optional<std::uint64_t> StoreCeiling(const AgentView& agent) {
  SystemWallClock clock;
  auto store = lease::OpenStore(agent.store, clock, lease::SqliteStore::Access::kExisting);
  if (!store.ok()) return std::nullopt;
  auto table = (*store)->ReadSlots({});
  if (!table.ok()) return std::nullopt;
  return table->last_epoch().value();
}

}  // namespace

int RunInspect(const InspectArgs& args, std::ostream& out, std::ostream& err) {
  auto agent = ReadAgent(args.mount);
  if (!agent.ok()) return Fail(err, agent.status());
  auto path = MainPathForKey(agent->mode, args.tenant);
  if (!path.ok()) return Fail(err, path.status());
  const std::optional<FleetFile> file = ParseFleetPath(agent->mode, *path);
  if (!file) return Fail(err, Internal("the path " + *path + " is not a fleet file"));

  Json doc = {{"key", file->key}, {"path", file->main_path}, {"slot", file->slot},
              {"bucket", BucketName(BucketOf(file->slot))}};
  const ServedRange* range = agent->RangeOf(file->slot);
  if (range == nullptr || !range->serving) {
    std::string why = range == nullptr
                          ? "slot " + std::to_string(file->slot) + " is in none of " +
                                lease::Printable(agent->owner) + "'s ranges"
                          : "its range " + range->range.ToString() + " is " + range->state +
                                (range->held_by.empty()
                                     ? ""
                                     : " (held by " + lease::Printable(range->held_by) + ")");
    const std::string who = WhoServes(*agent, file->slot);
    doc["served_here"] = false;
    doc["why"] = why;
    doc["served_by"] = who;
    if (args.json) {
      out << Dump(doc, 2) << '\n';
    } else {
      err << "fleetfs: " << lease::Printable(file->key) << " (slot " << file->slot
          << ") is not served here: " << why << "; served by " << who << '\n';
    }
    return kExitUnserved;
  }
  doc["served_here"] = true;
  doc["serving"] = {{"owner", agent->owner},
                    {"range", range->range.ToString()},
                    {"epoch", range->epoch},
                    {"state", range->state},
                    {"lease_left_ms", range->lease_left_ms}};

  // The local files.
  UniqueFd root(::open(agent->backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    const int e = errno;
    err << "fleetfs: cannot read the backing directory " << agent->backing << " ("
        << std::strerror(e) << "); run 'fleetfs inspect' as root or as the agent's user\n";
    return kExitFailure;
  }
  const std::string bucket = BucketName(BucketOf(file->slot));
  UniqueFd dir(::openat(root.get(), bucket.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  const std::string name = file->main_path.substr(bucket.size() + 1);
  std::optional<FileFacts> facts = dir.valid() ? ReadMainFile(dir.get(), name) : std::nullopt;
  Json local = {{"file", agent->backing + "/" + file->main_path}, {"exists", facts.has_value()}};
  Json sidecars = Json::object();
  std::optional<std::uint64_t> wal_size;
  for (std::string_view suffix : kSidecarSuffixes) {
    const auto size =
        dir.valid() ? SidecarSize(dir.get(), name + std::string(suffix)) : std::nullopt;
    sidecars[std::string(suffix.substr(1))] = Opt(size);
    if (suffix == "-wal") wal_size = size;
  }
  local["sidecars"] = sidecars;
  if (facts) {
    local["size"] = facts->size;
    local["journal_mode"] = db::JournalMode(facts->header, facts->size, wal_size.has_value());
    local["page_size"] = facts->header ? Json(facts->header->page_size) : Json(nullptr);
    local["page_count"] =
        facts->header ? Json(db::PageCount(*facts->header, facts->size)) : Json(nullptr);
    local["epoch_stamp"] = Opt(facts->epoch_stamp);
    local["key_stamp"] = Opt(facts->key_stamp);
    local["stale"] = !facts->epoch_stamp || *facts->epoch_stamp < range->epoch;
    local["shipped_stamp_seq"] =
        facts->shipped_stamp ? Json(facts->shipped_stamp->seq) : Json(nullptr);
  }
  // The WAL as SQLite's recovery reads it: only frames of the current header
  // count (a log reused after a checkpoint keeps old frames past its tail),
  // at most kMaxWalFramesCounted of them.
  Json wal = nullptr;
  if (wal_size && dir.valid()) {
    wal = {{"size", *wal_size}};
    UniqueFd fd = OpenToRead(dir.get(), name + "-wal");
    const auto counted = fd.valid() ? wal::CountFrames(fd.get(), kMaxWalFramesCounted)
                                    : Result<wal::FrameCount>(wal::FrameCount{});
    const wal::FrameCount c = counted.ok() ? *counted : wal::FrameCount{};
    wal["header_valid"] = c.header_valid;
    wal["frames"] = c.valid;
    wal["committed_frames"] = c.committed;
    wal["frames_capped"] = c.capped;
    if (c.header_valid) {
      wal["page_size"] = c.page_size;
      wal["checkpoint_seq"] = c.checkpoint_seq;
    }
  }
  local["wal"] = wal;
  doc["local"] = local;

  // What the agent holds for it now.
  std::string live_why;
  const auto live = ReadLive(args.mount, &live_why);
  if (!live) WarnLiveUnknown(err, live_why);
  const TenantLive* l = nullptr;
  if (live) {
    const auto it = live->find(file->main_path);
    if (it != live->end()) l = &it->second;
  }
  const WallMs now = SystemWallClock().NowMs();
  doc["open_handles"] = live ? Json(l ? l->open_handles : 0) : Json(nullptr);
  doc["lag_s"] = live ? Opt(LagOf(*agent, l, now)) : Json(nullptr);
  doc["unshippable"] = l != nullptr && l->unshippable;
  doc["shipped_seq"] = l ? Opt(l->shipped_seq) : Json(nullptr);
  doc["shipped_ms"] = l ? Opt(l->shipped_ms) : Json(nullptr);

  // The replica log's end and restore points.
  Json replica = nullptr;
  std::string replica_error;
  if (agent->replica) {
    ReplicaArgs r;
    r.tenant = args.tenant;
    r.replica = *agent->replica;
    r.mode = std::string(ModeName(agent->mode));
    // The agent's settings unless the command line gives others.
    r.endpoint = args.endpoint.empty() ? agent->replica_endpoint : args.endpoint;
    r.region = args.region.empty() ? agent->replica_region : args.region;
    r.path_style = args.path_style.empty() ? agent->replica_path_style : args.path_style;
    const std::optional<std::uint64_t> ceiling = StoreCeiling(*agent);
    auto tail = ReadReplicaTail(r, args.tail,
                                ceiling.value_or(std::numeric_limits<std::uint64_t>::max()));
    if (tail.ok()) {
      Json objects = Json::array();
      for (const ReplicaObjectInfo& o : tail->tail) {
        objects.push_back({{"seq", o.seq},
                           {"kind", o.kind},
                           {"epoch", o.epoch},
                           {"first_ms", o.first_ms},
                           {"last_ms", o.last_ms},
                           {"bytes", o.bytes},
                           {"refused", o.refused}});
      }
      replica = {{"url", *agent->replica},
                 {"log", tail->log_dir},
                 {"objects", tail->objects},
                 {"tail", objects},
                 {"newest_epoch", Opt(tail->newest_epoch)},
                 {"store_epoch_ceiling", Opt(ceiling)},
                 {"deleted", tail->deleted},
                 {"restorable_from_ms", Opt(tail->restorable_from_ms)},
                 {"restorable_to_ms", Opt(tail->restorable_to_ms)}};
    } else {
      replica_error = tail.status().message();
      replica = {{"url", *agent->replica}, {"error", replica_error}};
    }
  }
  doc["replica"] = replica;

  if (args.json) {
    out << Dump(doc, 2) << '\n';
    return kExitOk;
  }
  auto line = [&](std::string_view label, const std::string& value) {
    out << std::left << std::setw(16) << label << value << '\n';
  };
  auto size_or = [](const Json& j) {
    return j.is_null() ? std::string("-") : std::to_string(j.get<std::uint64_t>()) + " bytes";
  };
  line("tenant", lease::Printable(file->key) + "   slot " + std::to_string(file->slot) +
                     "   bucket " + bucket);
  line("served by", lease::Printable(agent->owner) + " (this agent)   range " +
                        range->range.ToString() + "   epoch " + std::to_string(range->epoch) +
                        "   lease left " + lease::FormatDuration(Millis(range->lease_left_ms)));
  line("file", local["file"].get<std::string>() +
                   (facts ? "" : "   (absent: restored from the replica at its first open, "
                                 "if the replica holds it)"));
  if (facts) {
    line("size", std::to_string(facts->size) + " bytes");
    line("journal mode", local["journal_mode"].get<std::string>());
    if (facts->header) {
      line("pages", std::to_string(local["page_count"].get<std::uint64_t>()) + " of " +
                        std::to_string(facts->header->page_size) + " bytes");
    } else {
      line("pages", "- (no SQLite header)");
    }
    line("epoch stamp",
         (facts->epoch_stamp ? std::to_string(*facts->epoch_stamp) : std::string("none")) +
             (local["stale"].get<bool>()
                  ? "   (below the served epoch: checked against the replica at its next open)"
                  : "") +
             "   key stamp " + (facts->key_stamp ? lease::Printable(*facts->key_stamp) : "none"));
  }
  line("sidecars", "wal " + size_or(sidecars.value("wal", Json())) + ", shm " +
                       size_or(sidecars.value("shm", Json())) + ", journal " +
                       size_or(sidecars.value("journal", Json())));
  if (!wal.is_null()) {
    line("wal frames", wal["header_valid"].get<bool>()
                           ? std::string(wal["frames_capped"].get<bool>() ? "at least " : "") +
                                 std::to_string(wal["frames"].get<std::uint64_t>()) + ", " +
                                 std::to_string(wal["committed_frames"].get<std::uint64_t>()) +
                                 " committed (checkpoint " +
                                 std::to_string(wal["checkpoint_seq"].get<std::uint32_t>()) + ")"
                           : "0 (no valid WAL header: the log is empty or restarting)");
  }
  line("open handles", doc["open_handles"].is_null()
                           ? std::string("unknown (the agent's live state cannot be read)")
                           : std::to_string(doc["open_handles"].get<std::size_t>()));
  if (!agent->replica) {
    line("replication", "off");
    return kExitOk;
  }
  line("shipped", l && l->shipped_seq
                      ? "sequence " + std::to_string(*l->shipped_seq) +
                            (l->shipped_ms ? " at " + LocalTime(*l->shipped_ms) : "")
                      : "nothing since the agent started");
  if (doc["unshippable"].get<bool>()) {
    line("replicated", "no: not replicated (journal_mode OFF or MEMORY; nothing ships)");
  }
  line("lag", doc["lag_s"].is_null() ? std::string("unknown (the agent's live state cannot be read)")
                                     : Lag(doc["lag_s"].get<double>()));
  line("replica", *agent->replica);
  if (!replica_error.empty()) {
    line("replica log", "could not be read: " + replica_error);
    return kExitOk;
  }
  line("replica log", replica["log"].get<std::string>() + "   " +
                          std::to_string(replica["objects"].get<std::size_t>()) + " objects" +
                          (replica["deleted"].get<bool>() ? "   (ends in a tombstone: deleted)"
                                                          : ""));
  for (const Json& o : replica["tail"]) {
    out << "  " << std::left << std::setw(8) << o["seq"].get<std::uint64_t>() << std::setw(10)
        << o["kind"].get<std::string>() << "epoch " << std::setw(6)
        << o["epoch"].get<std::uint64_t>() << RestoreTimeText(o["last_ms"].get<WallMs>())
        << (o["refused"].get<bool>() ? "   REFUSED: its epoch is above the store's counter"
                                     : "")
        << '\n';
  }
  if (replica["restorable_from_ms"].is_null()) {
    line("restorable", "nothing (no snapshot among the log's first objects)");
  } else {
    line("restorable", "from " + RestoreTimeText(replica["restorable_from_ms"].get<WallMs>()) +
                           " to " + RestoreTimeText(replica["restorable_to_ms"].get<WallMs>()) +
                           " (local time, as 'fleetfs restore --at' takes it)");
  }
  return kExitOk;
}

}  // namespace fleetfs::agent
