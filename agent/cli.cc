#include "agent/cli.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <charconv>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/config.h"
#include "agent/handoff_cli.h"
#include "agent/journal_log.h"
#include "agent/replica_cli.h"
#include "agent/tenant_cli.h"
#include "fleet/layout.h"
#include "fleet/slot.h"
#include "lease/lease_ttl.h"
#include "lease/owner_id.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

using lease::Decision;
using lease::Epoch;
using lease::Grant;
using lease::Held;
using lease::Lost;
using lease::OwnerId;
using lease::SlotRange;
using Json = nlohmann::json;

constexpr const char* kVersion = "fleetfs 0.1.0";

std::string Dump(const Json& json) {
  // Keys are any bytes; invalid UTF-8 is replaced rather than refused.
  return json.dump(2, ' ', false, Json::error_handler_t::replace);
}

using lease::Printable;  // a key as a terminal shows it: other bytes as \xNN

// Left-aligned columns separated by two spaces.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << '\n';
  }
}

// One error line. Under systemd (the unit's `fleetfs mount` with a bad
// config) journald needs the "<3>" to file it where `journalctl -p err`
// looks; on a terminal or in a script the line is unchanged.
void ErrorLine(std::ostream& err, std::string_view text) {
  err << StderrLine(DetectLogTarget(), spdlog::level::err, text);
}

// A Status's code decides the exit code: bad input is 2, anything else 1.
int Fail(std::ostream& err, const Status& status) {
  ErrorLine(err, "fleetfs: " + status.message());
  return status.code() == Code::kInvalidArgument ? kExitBadInput : kExitFailure;
}

Result<Epoch> ParseEpoch(const std::string& text) {
  std::uint64_t value = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size() || value == 0 ||
      value > Epoch::kMax) {
    return InvalidArgument("epoch '" + text + "': an epoch is a whole number from 1 to " +
                           std::to_string(Epoch::kMax));
  }
  return Epoch(value);
}

// ── fleetfs slot ───────────────────────────────────────────────────────────

int RunSlot(const std::vector<std::string>& keys, const std::string& mode_text, bool json,
            std::ostream& out, std::ostream& err) {
  std::optional<FleetMode> mode;
  if (!mode_text.empty()) {
    auto parsed = ParseMode(mode_text);
    if (!parsed.ok()) return Fail(err, parsed.status());
    mode = *parsed;
  }
  // In tenant mode every key names a tenant file: check them all first.
  if (mode == FleetMode::kTenant) {
    for (const std::string& key : keys) {
      const Status valid = ValidateTenantId(key);
      if (!valid.ok()) return Fail(err, valid);
    }
  }
  Json list = Json::array();
  bool any_not_tenant = false;
  std::vector<std::vector<std::string>> rows;
  if (mode) {
    rows.push_back({"KEY", "SLOT", "BUCKET", *mode == FleetMode::kTenant
                                                 ? "TENANT-MODE PATH"
                                                 : "SLOT-MODE PATH"});
  } else {
    rows.push_back({"KEY", "SLOT", "BUCKET", "SLOT-MODE PATH", "TENANT-MODE PATH"});
  }
  for (const std::string& key : keys) {
    const Slot slot = KeySlot(key);
    const std::string bucket = BucketName(BucketOf(slot));
    const auto problem = TenantIdProblem(key);
    any_not_tenant |= problem.has_value();
    Json entry = {{"key", key},
                  {"slot", slot},
                  {"bucket", bucket},
                  {"hash_tag", std::string(HashTag(key))},
                  {"slot_path", SlotPath(slot)}};
    if (problem) {
      entry["tenant_path"] = nullptr;
      entry["tenant_error"] = ValidateTenantId(key).message();
    } else {
      entry["tenant_path"] = TenantPath(key);
    }
    if (mode) {
      // Tenant-mode keys were all checked above, so the path exists.
      const std::string path = *MainPathForKey(*mode, key);
      entry["path"] = path;
      rows.push_back({Printable(key), std::to_string(slot), bucket, path});
    } else {
      rows.push_back({Printable(key), std::to_string(slot), bucket, SlotPath(slot),
                      problem ? "(not a tenant id: " + *problem + ")" : TenantPath(key)});
    }
    list.push_back(std::move(entry));
  }
  if (json) {
    out << Dump(list) << '\n';
  } else {
    PrintTable(out, rows);
    if (any_not_tenant && !mode) out << "(" << kTenantIdRule << ")\n";
  }
  return kExitOk;
}

// ── fleetfs lease ──────────────────────────────────────────────────────────

struct LeaseArgs {
  std::string store;
  lease::StoreTls tls;  // etcds:// only
  std::string owner;
  std::string range;
  std::string ttl = "30s";
  std::string epoch;
  bool json = false;
};

// Checked before the store is opened, so bad input changes nothing.
struct CheckedLease {
  std::string url;
  lease::StoreTls tls;
  std::optional<OwnerId> owner;
  std::optional<SlotRange> range;
  Millis ttl{};
  std::optional<Epoch> epoch;
};

Result<CheckedLease> Check(const LeaseArgs& args, bool needs_owner, bool needs_epoch) {
  CheckedLease checked;
  FLEETFS_ASSIGN_OR_RETURN(const lease::StoreUrl url, lease::ParseStoreUrl(args.store));
  FLEETFS_RETURN_IF_ERROR(lease::CheckStoreTls(url, args.tls));
  checked.url = args.store;
  checked.tls = args.tls;
  if (!needs_owner) return checked;
  FLEETFS_ASSIGN_OR_RETURN(OwnerId owner, OwnerId::Make(args.owner));
  checked.owner = owner;
  FLEETFS_ASSIGN_OR_RETURN(SlotRange range, SlotRange::Parse(args.range));
  checked.range = range;
  FLEETFS_ASSIGN_OR_RETURN(checked.ttl, lease::ParseTtl(args.ttl));
  if (!args.epoch.empty()) {
    FLEETFS_ASSIGN_OR_RETURN(Epoch epoch, ParseEpoch(args.epoch));
    checked.epoch = epoch;
  } else if (needs_epoch) {
    return InvalidArgument("--epoch is required: a renewal or release names the epoch it holds "
                           "(see 'fleetfs lease ls')");
  }
  return checked;
}

std::string LocalTime(WallMs ms) { return lease::FormatWallTime(ms, /*local=*/true); }

std::string TimeLeft(WallMs expires, WallMs now) {
  if (expires <= now) return "lapsed";
  return lease::FormatDuration(Millis(expires - now));
}

// The store a reading command names, opened without creating it; null after
// printing why (the exit code in `code`).
std::unique_ptr<lease::OwnershipStore> OpenToRead(const LeaseArgs& args, const WallClock& clock,
                                                  std::ostream& err, int& code) {
  auto checked = Check(args, false, false);
  if (!checked.ok()) {
    code = Fail(err, checked.status());
    return nullptr;
  }
  auto store =
      lease::OpenStore(checked->url, clock, lease::SqliteStore::Access::kExisting, checked->tls);
  if (!store.ok()) {
    code = Fail(err, store.status());
    return nullptr;
  }
  return std::move(store).value();
}

// A released row offered to one owner who alone may claim it for now.
bool OfferStands(const lease::OwnershipRow& row, std::int64_t now) {
  return row.offered_to && row.offer_expires_ms > now && row.lease_expires_ms <= now;
}

int RunLeaseLs(const LeaseArgs& args, std::ostream& out, std::ostream& err) {
  SystemWallClock clock;
  int code = kExitOk;
  auto store = OpenToRead(args, clock, err, code);
  if (store == nullptr) return code;
  auto table = store->Read();
  if (!table.ok()) return Fail(err, table.status());
  // Lapses and time left are decided in the store's frame; the wall times
  // shown are ToWallMs's, for display only.
  const lease::OwnershipStore& frame = *store;
  const std::int64_t now = frame.NowMs();
  if (args.json) {
    Json rows = Json::array();
    for (const auto& row : table->rows()) {
      const WallMs expires = frame.ToWallMs(row.lease_expires_ms);
      rows.push_back({{"range", row.range.ToString()},
                      {"first", row.range.first()},
                      {"last", row.range.last()},
                      {"owner", row.owner.str()},
                      {"epoch", row.epoch.value()},
                      {"lease_expires_ms", expires},
                      {"lease_expires", lease::FormatWallTime(expires)},
                      {"left_ms", std::max<std::int64_t>(0, row.lease_expires_ms - now)},
                      {"lapsed", row.lease_expires_ms <= now}});
      if (OfferStands(row, now)) {
        rows.back()["offered_to"] = row.offered_to->str();
        rows.back()["offer_left_ms"] = row.offer_expires_ms - now;
      }
    }
    out << Dump({{"store", store->url()},
                 {"now_ms", frame.ToWallMs(now)},
                 {"last_epoch", table->last_epoch().value()},
                 {"rows", rows}})
        << '\n';
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"RANGE", "OWNER", "EPOCH", "LEASE EXPIRES", "LEFT"}};
  for (const auto& row : table->rows()) {
    rows.push_back({row.range.ToString(),
                    OfferStands(row, now) ? Printable(row.owner.str()) + " (offered to " +
                                                Printable(row.offered_to->str()) + ")"
                                          : Printable(row.owner.str()),
                    row.epoch.ToString(), LocalTime(frame.ToWallMs(row.lease_expires_ms)),
                    TimeLeft(row.lease_expires_ms, now)});
  }
  out << "store " << store->url() << ", highest epoch granted " << table->last_epoch().value()
      << '\n';
  if (table->rows().empty()) {
    out << "no range is claimed\n";
  } else {
    PrintTable(out, rows);
  }
  return kExitOk;
}

enum class LeaseVerb { kClaim, kRenew, kRelease };

int RunLeaseChange(LeaseVerb verb, const LeaseArgs& args, std::ostream& out,
                   std::ostream& err) {
  auto checked = Check(args, true, verb != LeaseVerb::kClaim);
  if (!checked.ok()) return Fail(err, checked.status());
  SystemWallClock clock;
  auto store =
      lease::OpenStore(checked->url, clock, lease::SqliteStore::Access::kCreate, checked->tls);
  if (!store.ok()) return Fail(err, store.status());
  const OwnerId& owner = *checked->owner;
  const SlotRange range = *checked->range;
  if (verb == LeaseVerb::kRelease) {
    auto released = (*store)->Release(range, owner, *checked->epoch);
    if (!released.ok()) return Fail(err, released.status());
    if (!*released) {
      err << "fleetfs: slot range " << range.ToString() << " was lost: it is not held by '"
          << Printable(owner.str()) << "' at epoch " << checked->epoch->value()
          << "; nothing was released\n";
      return kExitLost;
    }
    out << "released " << range.ToString() << " (epoch " << checked->epoch->value()
        << "): another owner may claim it now\n";
    return kExitOk;
  }
  const Result<Decision> decision =
      verb == LeaseVerb::kClaim
          ? (*store)->Claim(range, owner, checked->ttl,
                            checked->epoch ? checked->epoch->value() : 0)
          : (*store)->Renew(range, owner, *checked->epoch, checked->ttl);
  if (!decision.ok()) return Fail(err, decision.status());
  if (const auto* held = std::get_if<Held>(&*decision)) {
    err << "fleetfs: slot range " << held->range.ToString()
        << (held->offered ? " is offered to '" : " is held by '") << Printable(held->owner)
        << "' until "
        << LocalTime((*store)->ToWallMs(held->lease_expires_ms)) << "; claim again after that\n";
    return kExitHeld;
  }
  if (std::holds_alternative<Lost>(*decision)) {
    err << "fleetfs: slot range " << range.ToString() << " was lost: it is not held by '"
        << Printable(owner.str()) << "' at epoch " << checked->epoch->value()
        << "; claim it again for a new epoch\n";
    return kExitLost;
  }
  const Grant& grant = std::get<Grant>(*decision);
  out << (verb == LeaseVerb::kClaim ? "claimed " : "renewed ") << range.ToString() << " for '"
      << Printable(owner.str()) << "' at epoch " << grant.epoch.value()
      << (grant.fresh ? " (new)" : "") << " until "
      << LocalTime((*store)->ToWallMs(grant.lease_expires_ms)) << '\n';
  return kExitOk;
}

// ── fleetfs where ──────────────────────────────────────────────────────────

// Who serves each key's slot now, as a router asks it: the row that holds the
// slot, and whether its lease is live. A lapsed row serves nobody: its owner
// stopped serving at least ttl/3 before the store lease ended.
int RunWhere(const std::vector<std::string>& keys, const LeaseArgs& args, std::ostream& out,
             std::ostream& err) {
  SystemWallClock clock;
  int code = kExitOk;
  auto store = OpenToRead(args, clock, err, code);
  if (store == nullptr) return code;
  std::vector<Slot> slots;
  for (const std::string& key : keys) slots.push_back(KeySlot(key));
  // Only the rows that hold these slots: on etcd each row's expiry is a call.
  auto table = store->ReadSlots(slots);
  if (!table.ok()) return Fail(err, table.status());
  const WallMs now = store->NowMs();
  bool all_served = true;
  Json list = Json::array();
  std::vector<std::vector<std::string>> rows = {
      {"KEY", "SLOT", "RANGE", "OWNER", "EPOCH", "LEASE EXPIRES", "LEFT"}};
  for (const std::string& key : keys) {
    const Slot slot = KeySlot(key);
    const lease::OwnershipRow* row = table->RowFor(slot);
    const bool served = row != nullptr && row->lease_expires_ms > now;
    all_served = all_served && served;
    Json entry = {{"key", key}, {"slot", slot}, {"served", served}};
    if (row == nullptr) {
      entry["range"] = nullptr;
      entry["owner"] = nullptr;
      rows.push_back(
          {Printable(key), std::to_string(slot), "-", "(nobody: not claimed)", "-", "-", "-"});
    } else {
      entry["range"] = row->range.ToString();
      entry["owner"] = row->owner.str();
      entry["epoch"] = row->epoch.value();
      // The row's times are the store's own clock; the wall time is for
      // people and routers' logs, never for deciding.
      const WallMs expires = store->ToWallMs(row->lease_expires_ms);
      entry["lease_expires_ms"] = expires;
      entry["lease_expires"] = lease::FormatWallTime(expires);
      entry["left_ms"] = std::max<WallMs>(0, row->lease_expires_ms - now);
      const bool offered = OfferStands(*row, now);
      if (offered) entry["offered_to"] = row->offered_to->str();
      rows.push_back({Printable(key), std::to_string(slot), row->range.ToString(),
                      served    ? Printable(row->owner.str())
                      : offered ? "(nobody: offered to " + Printable(row->offered_to->str()) + ")"
                                : "(nobody: " + Printable(row->owner.str()) + "'s lease lapsed)",
                      row->epoch.ToString(), LocalTime(store->ToWallMs(row->lease_expires_ms)),
                      TimeLeft(row->lease_expires_ms, now)});
    }
    list.push_back(std::move(entry));
  }
  if (args.json) {
    out << Dump({{"store", store->url()}, {"now_ms", store->ToWallMs(now)}, {"keys", list}})
        << '\n';
  } else {
    PrintTable(out, rows);
  }
  return all_served ? kExitOk : kExitUnserved;
}

// The S3 flags of `mount`, `replica` and `restore` (the same keys in the
// configuration file).
constexpr const char* kReplicaEndpointHelp =
    "s3://: the store's URL, http(s)://HOST[:PORT] (default: AWS's endpoint for the region)";
constexpr const char* kReplicaRegionHelp =
    "s3://: the region requests are signed for (default: AWS_REGION, AWS_DEFAULT_REGION, "
    "else us-east-1)";
constexpr const char* kReplicaPathStyleHelp =
    "s3://: 'true' puts the bucket in the path (ENDPOINT/BUCKET/KEY), 'false' in the host name "
    "(default: true with --replica-endpoint, false on AWS)";

// What every command that takes --replica says of s3:// replicas.
constexpr const char* kS3Footer = R"(
S3 REPLICAS (--replica s3://BUCKET/PREFIX)
Without --replica-endpoint the replica is on AWS, at the region's endpoint;
with it, on any S3-compatible store (MinIO, Ceph, ...) at that URL, which
holds no path: the bucket and prefix are in --replica. --replica-region is
the region requests are signed for (default: AWS_REGION, AWS_DEFAULT_REGION,
else us-east-1). --replica-path-style true puts the bucket in the path, as
most stores other than AWS want (the default with --replica-endpoint); false
puts it in the host name (the default on AWS). These flags (the keys
replica_endpoint, replica_region, replica_path_style) are refused with any
other replica.

Credentials are found the way AWS tools find them: AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) from the environment, else the
profile AWS_PROFILE (default "default") of the file
AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials). They are read,
never logged.
)";

// `footer` with the S3 section just before its EXAMPLES.
std::string WithS3Footer(const char* footer) {
  std::string text = footer;
  const std::size_t examples = text.find("\nEXAMPLES\n");
  text.insert(examples == std::string::npos ? text.size() : examples, kS3Footer);
  return text;
}

constexpr const char* kMainFooter = R"(
fleetfs keeps a fleet of SQLite databases, one file per tenant or per routing
slot, on the hosts that own their slots. A host owns slot ranges by claiming
them on a shared ownership table, which grants an epoch (a fencing token), and
renews a lease on them. 'fleetfs mount' runs the agent: a FUSE mount in which
only the files of the slots this host serves now are visible, and whose open
files are fenced the moment a range's lease lapses. With --replica, every
commit ships to a replica, and a missing or stale tenant file is restored
from it before it is exposed; 'fleetfs replica' and 'fleetfs restore' read it.
'fleetfs handoff' and 'fleetfs drain' hand ranges to another agent for
maintenance, shipping every commit first.

EXIT STATUS
  0  success (mount: stopped cleanly by SIGTERM or SIGINT)
  1  a failure at run time: the store cannot be reached or is corrupt, the
     backing directory is in use by another agent, the mount was refused
  2  bad input: the message names the value and the rule
  3  the range is held by another owner (the message says who, until when)
  4  the range was lost: it is not this owner's at this epoch
  5  mount: stopped, but held ranges lapse instead of being released (commits
     not all shipped, or the store did not confirm in time): another host
     waits up to a ttl before it can claim them; the message says why
  6  where: a key's slot is served by nobody now (not claimed, or the lease
     lapsed); inspect: the tenant's slot is not served by this agent now
  7  handoff, drain: the target did not claim within --timeout

EXAMPLES
  fleetfs mount --backing /var/lib/fleetfs/volume --mount /mnt/fleet --ranges 0-8191
  fleetfs status /mnt/fleet
  fleetfs ls /mnt/fleet
  fleetfs inspect acme /mnt/fleet
  fleetfs slot acme
  fleetfs where acme --store sqlite:///var/lib/fleetfs/control.db
  fleetfs restore acme --replica file:///var/lib/fleetfs/replica -o /tmp/acme.db
  fleetfs handoff 0-8191 --to host-b --mount /mnt/fleet

Run 'fleetfs COMMAND --help' for each command.
)";

constexpr const char* kSlotFooter = R"(
The slot of a key is Redis Cluster's HASH_SLOT: CRC16 (XMODEM) of the key mod
16384, hashing only the text inside the first non-empty {...} (so
{user1000}.a and {user1000}.b share a slot). The bucket is slot / 64. Tenant
ids are 1 to 128 bytes of A-Z a-z 0-9 - _ . and do not start with '.'.

Put -- before keys that start with '-'.

EXAMPLES
  fleetfs slot acme '{user1000}.following'
  fleetfs slot --json acme
  fleetfs slot --mode tenant -- -acme-staging
)";

constexpr const char* kWhereFooter = R"(
A router asks this before it sends a key's traffic. A key is served when the
row that holds its slot has a live lease; a lapsed row serves nobody (its
owner stopped serving at least ttl/3 before the lease ended), and another
host may claim it. The answer is the store's now: by the time it is used, a
lease may have lapsed, so a router still needs the owner's own refusal (a
fenced or hidden file) to be safe.

EXIT STATUS
  0  every key is served
  1  the store cannot be read
  2  bad input
  6  some key is served by nobody now

EXAMPLES
  fleetfs where acme '{user1000}.following' --store sqlite:///var/lib/fleetfs/control.db
  fleetfs where --json acme --store sqlite:///var/lib/fleetfs/control.db
  fleetfs where acme --store etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/fleetfs/prod
)";

constexpr const char* kLeaseFooter = R"(
STORE URLS
  sqlite:///absolute/path/control.db   the embedded SQLite control database
  etcd://HOST:PORT[,HOST:PORT...]/PREFIX
                                       an etcd 3.4+ cluster; keys under PREFIX/
  etcds://HOST:PORT[,HOST:PORT...]/PREFIX
                                       the same over TLS (--store-ca, --store-cert,
                                       --store-key)

The ownership table never overlaps two ranges, never reuses an epoch, and
never lets a claim take a range whose lease is live. A claim of the same range
by its own owner keeps the epoch (a restart is not a new owner).

EXAMPLES
  fleetfs lease claim   --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191
  fleetfs lease ls      --store sqlite:///var/lib/fleetfs/control.db
  fleetfs lease renew   --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191 --epoch 1
  fleetfs lease release --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191 --epoch 1
)";

int PrintStatus(Json doc, std::ostream& out);

std::string StateNote(Json range) {
  std::string note;
  if (range.contains("held_by")) {
    note = "held by " + range["held_by"]["owner"].get<std::string>() + " until " +
           LocalTime(range["held_by"]["until_ms"].get<WallMs>());
  }
  if (range.contains("failure")) {
    note += (note.empty() ? "" : "; ") + range["failure"].get<std::string>();
  }
  return note.empty() ? "-" : note;
}

int RunStatus(const std::string& mount, bool json, std::ostream& out, std::ostream& err) {
  const std::string path = mount + "/.fleetfs/status.json";
  std::ifstream in(path);
  if (!in) {
    int e = errno;
    if (e == ENOTCONN) {
      err << "fleetfs: " << mount
          << " is a stale mount: its agent has ended; start 'fleetfs mount' again to clean it up\n";
    } else {
      err << "fleetfs: " << mount << " is not a running fleetfs mount (" << path << ": "
          << std::strerror(e) << ")\n";
    }
    return kExitFailure;
  }
  std::stringstream text;
  text << in.rdbuf();
  if (json) {
    out << text.str();
    return kExitOk;
  }
  Json doc = Json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    err << "fleetfs: " << path << " is not a status document\n";
    return kExitFailure;
  }
  try {
    return PrintStatus(doc, out);
  } catch (const Json::exception& e) {
    // An agent of another version: say so rather than abort.
    err << "fleetfs: " << path << " is not a status document this fleetfs reads (" << e.what()
        << ")\n";
    return kExitFailure;
  }
}

int PrintStatus(Json doc, std::ostream& out) {
  out << "owner " << doc["owner"].get<std::string>() << "   store " << doc["store"].get<std::string>()
      << "   ttl " << doc["ttl"].get<std::string>() << "   mode " << doc["mode"].get<std::string>()
      << '\n';
  out << "agent pid " << doc["pid"].get<int>() << " " << doc["phase"].get<std::string>()
      << "   backing " << doc["backing"].get<std::string>() << "   admin "
      << doc["admin"].get<std::string>() << "   open files " << doc["open_files"].get<int>();
  // Which FUSE transport serves, and why not io_uring when auto fell back
  // (an older agent has no such key).
  if (!doc.value("transport", std::string()).empty()) {
    out << "   transport " << Printable(doc["transport"].get<std::string>());
    if (!doc.value("transport_why", std::string()).empty()) {
      out << " (" << Printable(doc["transport_why"].get<std::string>()) << ")";
    }
  }
  out
      << "   health " << (doc["health"]["ok"].get<bool>() ? "ok" : "FAILING: ")
      << (doc["health"]["ok"].get<bool>() ? "" : Printable(doc["health"]["reason"].get<std::string>().substr(0, doc["health"]["reason"].get<std::string>().size() - 1)))
      << "\n";
  // A full or failed backing volume, named with why (an older agent has no such key).
  if (doc.contains("backing_volume") && doc["backing_volume"]["state"].get<std::string>() != "ok") {
    const Json& b = doc["backing_volume"];
    out << "BACKING VOLUME " << b["state"].get<std::string>() << ": "
        << Printable(b["reason"].get<std::string>()) << '\n';
  }
  out << '\n';
  std::vector<std::vector<std::string>> rows = {
      {"RANGE", "EPOCH", "STATE", "LEASE LEFT", "OPEN FILES", "REPL LAG", "NOTE"}};
  for (Json r : doc["ranges"]) {
    std::ostringstream left;
    if (r["serving"].get<bool>()) {
      left << std::fixed << std::setprecision(1) << r["lease_left_ms"].get<double>() / 1000.0 << "s";
    } else {
      left << "-";
    }
    std::ostringstream lag;
    if (r.contains("replication_lag_s")) {
      lag << std::fixed << std::setprecision(1) << r["replication_lag_s"].get<double>() << "s";
    } else {
      lag << "-";
    }
    rows.push_back({r["range"].get<std::string>(),
                    r["epoch"].is_null() ? "-" : std::to_string(r["epoch"].get<std::uint64_t>()),
                    r["state"].get<std::string>(), left.str(),
                    std::to_string(r["open_files"].get<std::uint64_t>()), lag.str(),
                    StateNote(r)});
  }
  PrintTable(out, rows);
  if (doc["replication"].is_object()) {
    Json r = doc["replication"];
    out << "\nreplica " << r["replica"].get<std::string>() << "   shipped "
        << r["transactions_shipped"].get<std::uint64_t>() << " transactions, "
        << r["bytes_shipped"].get<std::uint64_t>() << " bytes, " << r["snapshots"].get<std::uint64_t>()
        << " snapshots   restored " << r["restores"].get<std::uint64_t>() << "   tenants unshipped "
        << r["tenants_unshipped"].get<std::uint64_t>() << "   tenants unshippable "
        << r.value("tenants_unshippable", std::uint64_t{0});
    if (r.value("tenants_unshippable", std::uint64_t{0}) > 0) {
      out << "\nNOT REPLICATED: " << Printable(r.value("unshippable_example", std::string()))
          << (r["tenants_unshippable"].get<std::uint64_t>() > 1 ? " and others" : "")
          << " written with journal_mode OFF or MEMORY (no transaction's end on disk); each "
             "ships again, from a fresh snapshot, once it commits with a journal or WAL";
    }
    if (!r["failing"].get<std::string>().empty()) {
      out << "\nFAILING: " << Printable(r["failing"].get<std::string>());
    }
    if (!r.value("staging_blocked", std::string()).empty()) {
      out << "\nWAITING FOR ROOM: " << Printable(r["staging_blocked"].get<std::string>());
    }
    if (!r.value("snapshot_needed", std::string()).empty()) {
      out << "\nSNAPSHOT NEEDED: " << Printable(r["snapshot_needed"].get<std::string>());
    }
    out << '\n';
  } else {
    out << "\nreplication off\n";
  }
  return kExitOk;
}

constexpr const char* kMountFooter = R"(
Mounts the fleet root at --mount over --backing and serves it until SIGTERM
or SIGINT. Only files whose slot this host owns at the current epoch are
visible; a range whose local lease lapses is hidden at once and its open
handles fail with ESTALE.

  MOUNT/BBB/<tenant>.db       tenant mode (BBB = slot / 64, see 'fleetfs slot')
  MOUNT/BBB/slot-SSSSS.db     slot mode
  MOUNT/.fleetfs/status.json  this agent's state; also MOUNT/.fleetfs/ranges

Errors applications see: ENOENT for names not served here, EREMOTE when
creating a file in a slot another host owns, EPERM for names that are no fleet
files, for mkdir, rmdir, symlinks and renames, ESTALE on a handle whose range
is no longer served.

While the agent runs, nothing else may touch the backing directory: open the
databases through the mount only (mixing the two corrupts databases).

Start-up: takes the volume lock (BACKING/.fleetfs/agent.lock; a second agent
is refused, naming the holder's pid), cleans up a stale mount a crashed agent
left, checks the store, makes its first claim, then mounts. SIGTERM: no new
opens; open handles get --shutdown-grace to close; then every handle is
fenced, the ranges are released when no store call can still land, and the
mount is removed. A second SIGTERM skips the grace.

Under systemd (NOTIFY_SOCKET set; the package's fleetfs.service is
Type=notify): READY=1 once the mount is up and the first claims answered,
STATUS= with the serving summary, STOPPING=1 at SIGTERM, and WATCHDOG=1 every
WatchdogSec/2 while the loop runs and its refresh rounds keep ending. With
stderr in the journal (JOURNAL_STREAM), log lines carry their level as the
priority ("<4>...") and no time stamp.

CONFIGURATION FILE (TOML; every key is also a flag, flags win, and every
value in the file is checked even when a flag overrides it; durations are
strings with their unit, ranges are strings; nothing is touched before every
value, the directories and the store file have passed)
  backing = "/var/lib/fleetfs/volume"
  mount = "/mnt/fleet"
  mode = "tenant"                 # or "slot"
  owner = "host-a"                # default: the host name
  ranges = ["0-8191"]             # or "0-8191,9000-9999"
  store = "sqlite:///var/lib/fleetfs/control.db"   # or "etcd://h1:2379,h2:2379/fleetfs"
  # store_ca, store_cert, store_key = "/etc/fleetfs/etcd-ca.pem" ...  (etcds:// only)
  ttl = "30s"                     # 3s to 3600s; refresh every ttl/3
  admin = "127.0.0.1:7878"        # or "off"; loopback only
  no_create = false
  shutdown_grace = "5s"
  replica = "file:///var/lib/fleetfs/replica"   # or "off" (the default)
  # replica = "s3://BUCKET/PREFIX"                # see S3 REPLICAS
  # replica_endpoint = "http://127.0.0.1:9000"    # s3:// only; default: AWS's endpoint
  # replica_region = "eu-west-1"                  # s3:// only
  # replica_path_style = true                     # s3:// only; a boolean
  sync_interval = "1s"            # how often commits ship; 10ms to 600s
  snapshot_interval = "1h"        # a new snapshot in each tenant's log this often
  retention = "72h"               # any commit this recent can be restored
  capture_memory = "256MiB"       # commits not yet shipped, in memory (all tenants)
  capture_spill = "4GiB"          # beyond it, on the backing volume; "0B": none
  transport = "auto"              # or "io_uring", "dev_fuse"; see TRANSPORT

TRANSPORT (--transport)
How FUSE requests travel between the kernel and the agent:
  auto      io_uring when the kernel allows it, else /dev/fuse (the default).
            One line of the log says which transport runs and, on /dev/fuse,
            why io_uring was not used.
  io_uring  FUSE over io_uring: requests and replies pass through shared
            rings, with fewer system calls and context switches a request.
            When the kernel refuses it, the agent does not start (exit 1,
            saying why) rather than run on /dev/fuse.
  dev_fuse  read and write /dev/fuse, as libfuse does, even where io_uring
            would work.
io_uring needs a kernel built with FUSE over io_uring (CONFIG_FUSE_IO_URING,
Linux 6.14 and later) and the fuse module's parameter enable_uring on, which
is off by default; as root:
  echo Y > /sys/module/fuse/parameters/enable_uring
(or fuse.enable_uring=1 on the kernel command line), and an agent allowed to
run on every online CPU (its cpuset): each CPU's requests are served by
threads on that CPU. Fencing, visibility and
every error applications see are the same on both. The status document and
/status name the transport in use ("transport": "io_uring" or "/dev/fuse")
and, when auto fell back, why ("transport_why").

REPLICATION (with --replica)
Every commit of a served database ships to the replica: WAL frames once
their checksum chain reaches a commit frame, rollback-journal commits when the
journal is finished. A WAL restart, truncation or delete waits until the old
log's commits are captured; a commit never waits for the destination. Each
tenant has one create-only log at the replica, REPLICA/BBB/<file>/, of
objects named by their sequence: snapshots, segments of commits (zstd),
tombstones, and the marker a new owner writes when it takes the key at its
epoch. Each object carries the key, its epoch, its sequence, its commit times
and the checksum (XXH64) of the object before it, and is created, never
replaced: an old owner whose next object finds its sequence taken by a newer
epoch stops shipping and drops the range. A missing main file is restored
from the log before its lookup answers; a file older than another owner's
newer epoch at the replica is replaced first. Deleting a tenant through the
mount writes a tombstone; a later snapshot revives it. A planned stop ships
everything before releasing; a crash loses at most the commits of the last
sync interval. Retention: the objects before the newest snapshot older than
the retention go, never the log's newest; any commit within the retention
stays restorable. A replica directory written by an older fleetfs
(generations as directories) is refused with what to do, never read as empty.
While the destination takes nothing, captured commits wait in memory up to
--capture-memory for all tenants together, then in per-tenant spill files
under BACKING/.fleetfs/spill/ up to --capture-spill (never eating into the
reserve the snapshot spool keeps for the applications); they ship in commit
order once it heals. Beyond both, a tenant's captured commits are dropped and
it needs a full snapshot: logged, and in /health, the status and /metrics
(snapshot_needed), since a destination without room for an object that large
cannot replicate it again. A transaction larger than 64 MiB is never held in
memory: it ships in a snapshot read from the file. Each round visits only the
tenants written since their last shipment, and those whose periodic snapshot
is due.

BACKING VOLUME FAULTS
Writes failing with ENOSPC make /health 503 ("the backing volume ... is
full") until 30s after the last one; the ranges stay served. EROFS from any
operation, or EIO from a write, makes the agent probe the volume itself
(statvfs, then a file written and synced under BACKING/.fleetfs): when the
probe fails with EROFS or EIO, the agent stops serving, releases its ranges
so a healthy host can claim them, and stands by in phase "failed" saying why
until SIGTERM, then exits 1. Errors of single files (a probe that writes
fine) release nothing.

ADMIN ENDPOINT
  /health   200 while every range is served or waiting; 503 with the reason
            (a store call failed, a lease lapsed, the backing volume is full or
            failed, the replica takes no uploads)
  /status   the status document (JSON)
  /metrics  Prometheus text; fleetfs_replica_requests_total{kind} counts the
            requests to the replica destination (list, put, create, get, ...)

EXAMPLES
  fleetfs mount --backing /var/lib/fleetfs/volume --mount /mnt/fleet
  fleetfs mount --config /etc/fleetfs/agent.toml --ranges 0-8191 --ttl 15s
  fleetfs mount --replica file:///srv/fleet-replica --sync-interval 200ms
)";

constexpr const char* kReplicaFooter = R"(
TENANT is a tenant id (tenant mode) or any routing key (with --mode slot).
--replica is the destination an agent ships to (file:///ABSOLUTE/DIR or
s3://BUCKET/PREFIX, with the same --replica-endpoint, --replica-region and
--replica-path-style as the agent's; see S3 REPLICAS). These
commands only read it; they need no agent and no ownership store.

A tenant's replica is one log, REPLICA/BBB/<file>/, of objects numbered from 0
(retention removes the oldest): snapshot (the whole database as of a commit),
segment (commits, in order), tombstone (deleted through the mount), marker (a
new owner took the key at its epoch). Each object names the checksum of the
one before it, so a changed, missing or reordered object is found. Epochs
never decrease along the log; its newest object carries the newest epoch.

  ls      one line per object: sequence, kind, epoch, first and last time
          (local time, in the form --at takes), database size, commits and
          the object's bytes; then the objects, the newest epoch, the times a
          restore can reach (from the oldest snapshot to the newest object)
          and whether the log ends in a deletion. --json prints the same, with
          times in ms since the Unix epoch and null where there is none.
          A log that holds nothing exits 1 (with --json: 0, and no objects).
  verify  reads every object of the log, checks each one and the chain, then
          restores the newest state to a temporary file and runs PRAGMA
          integrity_check; exit 0 only when all of it holds

A corrupt or missing object fails with a message naming it (exit 1). A
replica directory in the layout of an older fleetfs (generations as
directories) is refused with what to do (exit 1).

EXAMPLES
  fleetfs replica ls acme --replica file:///var/lib/fleetfs/replica
  fleetfs replica ls acme --replica file:///var/lib/fleetfs/replica --json
  fleetfs replica verify acme --replica file:///var/lib/fleetfs/replica
  fleetfs replica ls acme --replica s3://fleet-replica/prod --replica-region eu-west-1
)";

constexpr const char* kRestoreFooter = R"(
Rebuilds TENANT's database from its replica log into FILE, which must not
exist (restore never overwrites; a failed restore leaves no file). Without
--at, the newest state: the newest snapshot and every commit after it. With
--at TIME, exactly the commits made up to TIME, from the newest snapshot at or
before it: write YYYY-MM-DDTHH:MM:SS[.mmm] (local time), the same ending in Z
(UTC), or @MILLISECONDS since the Unix epoch ('fleetfs replica ls' prints
times in the first form). Every object read is checked, and so is the chain
of checksums between them. FILE gets the mode the tenant file had when the
snapshot was taken and, when root restores, its owner too. Shows progress on
a terminal.

Exit 1, leaving no file, when the log holds no snapshot (at or before TIME),
when the tenant was deleted by then (the message says when), when TIME is
older than retention kept (the message names the oldest time that can be
restored), or when an object is corrupt or missing (the message names it).

EXAMPLES
  fleetfs restore acme --replica file:///var/lib/fleetfs/replica -o /tmp/acme.db
  fleetfs restore acme --replica file:///var/lib/fleetfs/replica \
      --at 2026-11-29T16:30:00 -o /tmp/acme-1630.db
  fleetfs restore acme --replica s3://fleet-replica/prod \
      --replica-endpoint http://127.0.0.1:9000 -o /tmp/acme.db
)";

constexpr const char* kHandoffFooter = R"(
A planned handover of one range to another agent, with no commit lost. The
agent serving RANGE stops new opens in it; open handles get the shutdown
grace to close, then the rest are fenced; every commit of the range is
shipped to the replica; then the range is released and offered to OWNER:
for one ttl only OWNER may claim it. The target agent, which looks for
offers to itself every 150 ms while it does not hold one of its ranges,
claims it at once at a new epoch and serves it, restoring from the replica
what it lacks. This command waits until OWNER holds the range in the store
and prints how long the range was not served (from the request to the
target's claim).

RANGE must be exactly one of the agent's configured ranges, served now.
Only root or the agent's own user may send the request (it goes through
MOUNT/.fleetfs/control); the admin HTTP port does not take it. The agent
that handed a range off does not claim it again unless it is offered back to
it (a handoff back), 'fleetfs drain --undo' is run, or it restarts. A
handoff whose commits cannot all be shipped in time is abandoned: the agent
serves the range again, and this command exits 1. Needs a store that keeps
offers and a replica: without replication a handoff would move no data, so
it is refused. An offer OWNER does not take within one ttl ends, and the
agent that offered the range claims it again.

EXIT STATUS
  0 the target holds the range   1 not running, refused, or abandoned
  2 bad input                    7 the target did not claim within --timeout

EXAMPLES
  fleetfs handoff 0-8191 --to host-b --mount /mnt/fleet
  fleetfs handoff 8192-16383 --to host-a --timeout 30
)";

constexpr const char* kDrainFooter = R"(
Maintenance: hands every range the agent serves to --to OWNER (as 'fleetfs
handoff' does, all its ranges at once), or, with no --to, releases
them all so that any agent may claim them; the release alone needs no
replica, --to does. The ranges it does not hold are parked too. Every range
is checked before any starts: a range held but not served (its renewals
fail) refuses the drain, as its commits cannot be flushed. A drained agent claims none of its ranges again until
'fleetfs drain --undo' (or a restart, or a handoff back to it); it keeps
running, mounted, serving nothing. Exit status as for 'fleetfs handoff'.

EXAMPLES
  fleetfs drain --to host-b          # before rebooting this host
  fleetfs drain                      # release everything
  fleetfs drain --undo               # take the ranges again
)";

constexpr const char* kStatusFooter = R"(
Reads MOUNT/.fleetfs/status.json from a running agent and prints the owner,
store and ttl, then one line per range: epoch; state (serving, waiting for
another owner, lost, lapsed, failed, pending); local lease time left; open
files; who holds it and until when, or why the last store call failed.

EXAMPLES
  fleetfs status
  fleetfs status /mnt/fleet --json
)";

constexpr const char* kLsFooter = R"(
Lists the tenants of the ranges this agent serves now, one line each, as it
goes: a million tenants list in a bounded amount of memory, on either side.
The agent keeps live state only for its active tenants
(MOUNT/.fleetfs/tenants-live.jsonl: open handles, shipping); the files
themselves are read from the agent's backing directory, bucket by bucket, so
run it as root or as the agent's user. Tenants are sorted within a bucket,
buckets in order. Symlinks, FIFOs, devices and names that are no tenant of
their bucket are left out.

COLUMNS (text)
  KEY      the tenant id (slot mode: slot-SSSSS)
  SLOT     its routing slot
  SIZE     the main file and its -wal, in bytes (K, M, G: powers of 1024)
  JOURNAL  wal, rollback, empty (0 bytes), or not-sqlite (no SQLite header)
  EPOCH    the file's epoch stamp; '*' when it is below the served epoch (the
           file is checked against the replica at its next open)
  SHIPPED  when this agent last shipped it (local time; '-' when it shipped
           nothing since the agent started, or replication is off)
  SEQ      the replica log sequence of that object (or of the file's shipped
           stamp, from before the agent started)
  LAG      age of its oldest commit not yet shipped ('-': replication off)
  OPEN     handles open on it and its sidecars through the mount

JSON LINES (--json)
  One object a line, no header: key, path, slot, size, wal_size,
  journal_mode, epoch_stamp (null: none), served_epoch, stale,
  shipped_seq, shipped_ms (ms since the Unix epoch; null: unknown), lag_s
  (null: replication off), open_handles.

EXAMPLES
  fleetfs ls
  fleetfs ls /mnt/fleet --json | jq -r 'select(.lag_s > 5) | .key'
  fleetfs ls --json | wc -l
)";

constexpr const char* kInspectFooter = R"(
Shows one tenant in depth, from the agent serving MOUNT: who serves it (owner,
range, epoch, lease left); the local file and its -wal, -shm and -journal
sidecars with their sizes; the page size and page count from the database
header; the WAL's frames (its header checked as SQLite's recovery checks it,
frames counted from its size); the epoch and key stamps; open handles; what
was shipped last and the lag; and, with replication, the last objects of the
replica log (sequence, kind, epoch, time) and the restore points (the oldest
and newest time 'fleetfs restore --at' can reach). Reads the backing
directory: run it as root or as the agent's user.

EXIT STATUS
  0  the tenant is served here (its file may still be absent)
  1  MOUNT is not a running fleetfs mount, or the backing directory cannot
     be read
  2  bad input: not a tenant id
  6  the tenant's slot is not served by this agent now; the message (or
     served_here false, why and served_by in --json) says who serves it,
     read from the agent's ownership store

EXAMPLES
  fleetfs inspect acme
  fleetfs inspect acme /mnt/fleet --json
  fleetfs inspect acme --replica-endpoint http://127.0.0.1:9000
)";

}  // namespace

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"fleetfs: a volume agent for fleets of SQLite databases", "fleetfs"};
  app.footer(kMainFooter);
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);
  app.get_formatter()->column_width(34);

  std::vector<std::string> keys;
  std::string slot_mode;
  bool slot_json = false;
  auto* slot = app.add_subcommand(
      "slot", "Print each routing key's slot, bucket, slot-mode path and tenant-mode path");
  slot->footer(kSlotFooter);
  slot->add_option("KEY", keys, "Routing keys (any bytes)")->required();
  slot->add_flag("--json", slot_json, "Print a JSON list of objects (key, slot, bucket, paths)");
  slot->add_option("--mode", slot_mode,
                   "Print only this mode's path: 'tenant' (each key must be a tenant id) or "
                   "'slot'");

  auto add_store_to = [](CLI::App* cmd, LeaseArgs& to) {
    cmd->add_option("--store", to.store,
                    "Ownership store URL (sqlite:///ABSOLUTE/PATH, etcd://HOST:PORT/PREFIX)")
        ->required();
    cmd->add_option("--store-ca", to.tls.ca, "etcds://: CA bundle of the members' certificates");
    cmd->add_option("--store-cert", to.tls.cert, "etcds://: client certificate");
    cmd->add_option("--store-key", to.tls.key, "etcds://: client certificate's key");
  };

  std::vector<std::string> where_keys;
  LeaseArgs where_args;
  auto* where = app.add_subcommand(
      "where", "Say who serves each routing key now: slot, range, owner, epoch, lease end");
  where->footer(kWhereFooter);
  where->add_option("KEY", where_keys, "Routing keys (any bytes)")->required();
  add_store_to(where, where_args);
  where->add_flag("--json", where_args.json,
                  "Print JSON: store, now_ms and a list of keys (key, slot, served, range, "
                  "owner, epoch, lease_expires_ms, left_ms)");

  auto* lease_cmd = app.add_subcommand("lease", "Inspect and operate the slot ownership table");
  lease_cmd->require_subcommand(1);
  lease_cmd->footer(kLeaseFooter);
  LeaseArgs args;
  auto add_store = [&](CLI::App* cmd) { add_store_to(cmd, args); };
  auto* ls = lease_cmd->add_subcommand(
      "ls", "List the table: range, owner, epoch, lease expiry (local time), time left");
  add_store(ls);
  ls->add_flag("--json", args.json, "Print JSON (times in ms since the Unix epoch)");

  auto add_change = [&](const char* name, const char* help, const char* epoch_help) {
    auto* cmd = lease_cmd->add_subcommand(name, help);
    add_store(cmd);
    cmd->add_option("--owner", args.owner, "Owner id: 1-128 bytes, no control characters")
        ->required();
    cmd->add_option("--range", args.range, "Slot range A-B or N, inside 0-16383")->required();
    cmd->add_option("--ttl", args.ttl, "Lease length, 3s to 3600s")->default_str("30s");
    cmd->add_option("--epoch", args.epoch, epoch_help);
    return cmd;
  };
  auto* claim = add_change("claim",
                           "Claim a range (exit 3 when another owner holds a live lease on it)",
                           "Claim above this epoch (a fence floor)");
  auto* renew = add_change("renew", "Renew the lease of a range held at --epoch (exit 4 if lost)",
                           "The epoch held (required)");
  auto* release = add_change("release",
                             "End the lease of a range held at --epoch now (exit 4 if lost)",
                             "The epoch held (required)");

  ConfigInput mount_input;
  std::string config_file, backing, mountpoint, mount_mode, owner, ranges, store, ttl, admin, grace;
  std::string store_ca, store_cert, store_key;
  bool no_create = false;
  auto* mount = app.add_subcommand("mount", "Run the agent: mount the fleet root and serve it");
  mount->footer(WithS3Footer(kMountFooter));
  auto* o_config = mount->add_option("--config", config_file, "TOML configuration file");
  auto* o_backing = mount->add_option("--backing", backing, "Backing directory (absolute)")
                        ->default_str(kDefaultBacking);
  auto* o_mount = mount->add_option("--mount", mountpoint, "Mount point (absolute)")
                      ->default_str(kDefaultMount);
  auto* o_mode = mount->add_option("--mode", mount_mode, "Layout: 'tenant' or 'slot'")
                     ->default_str("tenant");
  auto* o_owner =
      mount->add_option("--owner", owner, "Owner id on the ownership table (default: host name)");
  auto* o_ranges = mount->add_option("--ranges", ranges, "Slot ranges to own: A-B[,C-D...]")
                       ->default_str("0-16383");
  auto* o_store = mount->add_option("--store", store, "Ownership store URL")
                      ->default_str(kDefaultStore);
  auto* o_store_ca =
      mount->add_option("--store-ca", store_ca, "etcds://: CA bundle of the members' certificates");
  auto* o_store_cert =
      mount->add_option("--store-cert", store_cert, "etcds://: client certificate");
  auto* o_store_key =
      mount->add_option("--store-key", store_key, "etcds://: client certificate's key");
  auto* o_ttl = mount->add_option("--ttl", ttl, "Lease length, 3s to 3600s")->default_str("30s");
  auto* o_admin = mount->add_option("--admin", admin, "Admin HTTP endpoint on loopback, or 'off'")
                      ->default_str(kDefaultAdmin);
  auto* o_grace = mount->add_option("--shutdown-grace", grace,
                                    "How long open handles may finish at SIGTERM")
                      ->default_str("5s");
  auto* o_no_create =
      mount->add_flag("--no-create", no_create, "Refuse creating new tenant files (EPERM)");
  std::string replica_url, sync_interval, snapshot_interval, retention, capture_memory,
      capture_spill;
  auto* o_replica = mount->add_option("--replica", replica_url,
                                      "Replica destination (file:///ABSOLUTE/DIR or "
                                      "s3://BUCKET/PREFIX), or 'off'")
                        ->default_str("off");
  auto* o_sync = mount->add_option("--sync-interval", sync_interval, "How often commits ship")
                     ->default_str("1s");
  auto* o_snap = mount->add_option("--snapshot-interval", snapshot_interval,
                                   "How often each tenant's log takes a new snapshot")
                     ->default_str("1h");
  auto* o_retention = mount->add_option("--retention", retention,
                                        "How long any commit stays restorable")
                          ->default_str("72h");
  auto* o_capture_memory =
      mount->add_option("--capture-memory", capture_memory,
                        "Commits not yet shipped held in memory, all tenants together")
          ->default_str("256MiB");
  auto* o_capture_spill =
      mount->add_option("--capture-spill", capture_spill,
                        "Beyond it, commits spilled to the backing volume ('0B': none)")
          ->default_str("4GiB");
  std::string transport;
  auto* o_transport =
      mount->add_option("--transport", transport,
                        "How FUSE requests reach the agent: 'auto', 'io_uring' or 'dev_fuse' "
                        "(see TRANSPORT)")
          ->default_str("auto");
  std::string replica_endpoint, replica_region, replica_path_style;
  auto* o_replica_endpoint = mount->add_option("--replica-endpoint", replica_endpoint,
                                               kReplicaEndpointHelp);
  auto* o_replica_region = mount->add_option("--replica-region", replica_region,
                                             kReplicaRegionHelp);
  auto* o_replica_path_style = mount->add_option("--replica-path-style", replica_path_style,
                                                 kReplicaPathStyleHelp);

  ReplicaArgs rargs;
  auto* replica_cmd = app.add_subcommand("replica", "Inspect a tenant's replica");
  replica_cmd->require_subcommand(1);
  replica_cmd->footer(WithS3Footer(kReplicaFooter));
  auto add_replica_args = [&](CLI::App* cmd) {
    cmd->add_option("TENANT", rargs.tenant, "Tenant id (or routing key with --mode slot)")
        ->required();
    cmd->add_option("--replica", rargs.replica,
                    "Replica destination (file:///ABSOLUTE/DIR or s3://BUCKET/PREFIX)")
        ->required();
    cmd->add_option("--replica-endpoint", rargs.endpoint, kReplicaEndpointHelp);
    cmd->add_option("--replica-region", rargs.region, kReplicaRegionHelp);
    cmd->add_option("--replica-path-style", rargs.path_style, kReplicaPathStyleHelp);
    cmd->add_option("--mode", rargs.mode, "Layout: 'tenant' or 'slot'")->default_str("tenant");
  };
  auto* replica_ls = replica_cmd->add_subcommand("ls", "List the objects of a tenant's replica log");
  add_replica_args(replica_ls);
  replica_ls->add_flag("--json", rargs.json, "Print JSON (times in ms since the Unix epoch)");
  auto* replica_verify = replica_cmd->add_subcommand(
      "verify", "Check the whole log, restore it, run PRAGMA integrity_check");
  add_replica_args(replica_verify);
  auto* restore_cmd =
      app.add_subcommand("restore", "Rebuild a tenant's database from its replica into a file");
  restore_cmd->footer(WithS3Footer(kRestoreFooter));
  add_replica_args(restore_cmd);
  restore_cmd->add_option("--at", rargs.at, "Point in time (default: the newest commit)");
  restore_cmd->add_option("-o,--output", rargs.output, "The file to write (must not exist)")
      ->required();

  std::string status_mount = kDefaultMount;
  bool status_json = false;
  auto* status = app.add_subcommand("status", "Show a running agent's ranges, leases and files");
  status->footer(kStatusFooter);
  status->add_option("MOUNT", status_mount, "The agent's mount point")->default_str(kDefaultMount);
  status->add_flag("--json", status_json, "Print the status document as JSON");

  std::string handoff_range, handoff_to, handoff_mount = kDefaultMount;
  double handoff_timeout_s = 60;
  auto* handoff = app.add_subcommand(
      "handoff", "Hand one served range to another owner: drain, fence, ship, offer, wait");
  handoff->footer(kHandoffFooter);
  handoff->add_option("RANGE", handoff_range, "Exactly one of the agent's configured ranges, A-B")
      ->required();
  handoff->add_option("--to", handoff_to, "The owner id that takes the range")->required();
  handoff->add_option("--mount", handoff_mount, "The agent's mount point")
      ->default_str(kDefaultMount);
  handoff->add_option("--timeout", handoff_timeout_s,
                      "Seconds to wait for the target's claim (default 60)");
  std::string drain_to, drain_mount = kDefaultMount;
  double drain_timeout_s = 60;
  bool drain_undo = false;
  auto* drain = app.add_subcommand(
      "drain", "Hand every served range to an owner, or release them all, for maintenance");
  drain->footer(kDrainFooter);
  drain->add_option("--to", drain_to, "The owner id that takes the ranges (default: release)");
  drain->add_flag("--undo", drain_undo, "Let the drained ranges be claimed again");
  drain->add_option("--mount", drain_mount, "The agent's mount point")->default_str(kDefaultMount);
  drain->add_option("--timeout", drain_timeout_s, "Seconds to wait (default 60)");

  std::string ls_mount = kDefaultMount;
  bool ls_json = false;
  auto* tenants_ls = app.add_subcommand(
      "ls", "List the served tenants: slot, size, journal mode, stamp, shipped, lag, open handles");
  tenants_ls->footer(kLsFooter);
  tenants_ls->add_option("MOUNT", ls_mount, "The agent's mount point")->default_str(kDefaultMount);
  tenants_ls->add_flag("--json", ls_json, "Print JSON Lines, one object per tenant");

  InspectArgs inspect_args;
  inspect_args.mount = kDefaultMount;
  auto* inspect = app.add_subcommand(
      "inspect", "Show one tenant in depth: files, header, WAL, stamps, replica log, who serves it");
  inspect->footer(kInspectFooter);
  inspect->add_option("TENANT", inspect_args.tenant, "Tenant id (or routing key in slot mode)")
      ->required();
  inspect->add_option("MOUNT", inspect_args.mount, "The agent's mount point")
      ->default_str(kDefaultMount);
  inspect->add_flag("--json", inspect_args.json, "Print one JSON document");
  inspect->add_option("--replica-endpoint", inspect_args.endpoint, kReplicaEndpointHelp);
  inspect->add_option("--replica-region", inspect_args.region, kReplicaRegionHelp);
  inspect->add_option("--replica-path-style", inspect_args.path_style, kReplicaPathStyleHelp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForVersion& e) {
    out << kVersion << '\n';
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Point at the help of the deepest command named on the line; `next` is
    // the first argument after it.
    std::string command = "fleetfs";
    const CLI::App* at = &app;
    int next = 1;
    for (; next < argc; ++next) {
      try {
        at = at->get_subcommand(argv[next]);
      } catch (const CLI::OptionNotFound&) {
        break;
      }
      command += std::string(" ") + argv[next];
    }
    if (!at->get_subcommands({}).empty() && next < argc && argv[next][0] != '-') {
      ErrorLine(err, "fleetfs: unknown command '" + std::string(argv[next]) + "'; run '" +
                         command + " --help'");
      return kExitBadInput;
    }
    ErrorLine(err, "fleetfs: " + std::string(e.what()) + "; run '" + command + " --help'");
    return kExitBadInput;
  }

  // Test only (see CheckTestWallOffset): refused before anything runs.
  if (Status offset = CheckTestWallOffset(); !offset.ok()) return Fail(err, offset);

  if (mount->parsed()) {
    auto set = [](CLI::Option* option, const std::string& value, std::optional<std::string>& to) {
      if (option->count() > 0) to = value;
    };
    set(o_config, config_file, mount_input.config_file);
    set(o_backing, backing, mount_input.backing);
    set(o_mount, mountpoint, mount_input.mountpoint);
    set(o_mode, mount_mode, mount_input.mode);
    set(o_owner, owner, mount_input.owner);
    set(o_ranges, ranges, mount_input.ranges);
    set(o_store, store, mount_input.store);
    set(o_store_ca, store_ca, mount_input.store_ca);
    set(o_store_cert, store_cert, mount_input.store_cert);
    set(o_store_key, store_key, mount_input.store_key);
    set(o_ttl, ttl, mount_input.ttl);
    set(o_admin, admin, mount_input.admin);
    set(o_grace, grace, mount_input.shutdown_grace);
    if (o_no_create->count() > 0) mount_input.no_create = true;
    set(o_replica, replica_url, mount_input.replica);
    set(o_sync, sync_interval, mount_input.sync_interval);
    set(o_snap, snapshot_interval, mount_input.snapshot_interval);
    set(o_retention, retention, mount_input.retention);
    set(o_capture_memory, capture_memory, mount_input.capture_memory);
    set(o_capture_spill, capture_spill, mount_input.capture_spill);
    set(o_replica_endpoint, replica_endpoint, mount_input.replica_endpoint);
    set(o_replica_region, replica_region, mount_input.replica_region);
    set(o_replica_path_style, replica_path_style, mount_input.replica_path_style);
    set(o_transport, transport, mount_input.transport);
    auto config = ResolveConfig(mount_input);
    if (!config.ok()) return Fail(err, config.status());
    return RunAgent(*config, err);
  }
  if (status->parsed()) return RunStatus(status_mount, status_json, out, err);
  auto seconds = [](double s) { return Millis(static_cast<std::int64_t>(s * 1000)); };
  if (handoff->parsed()) {
    if (!(handoff_timeout_s > 0)) return Fail(err, InvalidArgument("--timeout must be above 0"));
    return RunHandoff(handoff_range, handoff_to, handoff_mount, seconds(handoff_timeout_s), out,
                      err);
  }
  if (drain->parsed()) {
    if (!(drain_timeout_s > 0)) return Fail(err, InvalidArgument("--timeout must be above 0"));
    return RunDrain(drain_to, drain_undo, drain_mount, seconds(drain_timeout_s), out, err);
  }
  if (tenants_ls->parsed()) return RunLs(ls_mount, ls_json, out, err);
  if (inspect->parsed()) return RunInspect(inspect_args, out, err);
  if (replica_ls->parsed()) return RunReplicaLs(rargs, out, err);
  if (replica_verify->parsed()) return RunReplicaVerify(rargs, out, err);
  if (restore_cmd->parsed()) return RunRestore(rargs, out, err);
  if (where->parsed()) return RunWhere(where_keys, where_args, out, err);
  if (slot->parsed()) return RunSlot(keys, slot_mode, slot_json, out, err);
  if (ls->parsed()) return RunLeaseLs(args, out, err);
  if (claim->parsed()) return RunLeaseChange(LeaseVerb::kClaim, args, out, err);
  if (renew->parsed()) return RunLeaseChange(LeaseVerb::kRenew, args, out, err);
  if (release->parsed()) return RunLeaseChange(LeaseVerb::kRelease, args, out, err);
  ErrorLine(err, "fleetfs: no command given; run 'fleetfs --help'");
  return kExitBadInput;
}

}  // namespace fleetfs::agent
