#include "agent/cli.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fleet/layout.h"
#include "fleet/slot.h"
#include "lease/lease_ttl.h"
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

// A key as a terminal shows it: printable ASCII as is, other bytes as \xNN.
std::string Printable(std::string_view text) {
  std::string shown;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      shown += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      shown += escaped;
    }
  }
  return shown;
}

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

// A Status's code decides the exit code: bad input is 2, anything else 1.
int Fail(std::ostream& err, const Status& status) {
  err << "fleetfs: " << status.message() << '\n';
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
  std::string owner;
  std::string range;
  std::string ttl = "30s";
  std::string epoch;
  bool json = false;
};

// Checked before the store is opened, so bad input changes nothing.
struct CheckedLease {
  std::string url;
  std::optional<OwnerId> owner;
  std::optional<SlotRange> range;
  Millis ttl{};
  std::optional<Epoch> epoch;
};

Result<CheckedLease> Check(const LeaseArgs& args, bool needs_owner, bool needs_epoch) {
  CheckedLease checked;
  FLEETFS_RETURN_IF_ERROR(lease::ParseStoreUrl(args.store).status());
  checked.url = args.store;
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

int RunLeaseLs(const LeaseArgs& args, std::ostream& out, std::ostream& err) {
  auto checked = Check(args, false, false);
  if (!checked.ok()) return Fail(err, checked.status());
  SystemWallClock clock;
  auto store = lease::OpenStore(checked->url, clock, lease::SqliteStore::Access::kExisting);
  if (!store.ok()) return Fail(err, store.status());
  auto table = (*store)->Read();
  if (!table.ok()) return Fail(err, table.status());
  const WallMs now = (*store)->NowMs();
  if (args.json) {
    Json rows = Json::array();
    for (const auto& row : table->rows()) {
      rows.push_back({{"range", row.range.ToString()},
                      {"first", row.range.first()},
                      {"last", row.range.last()},
                      {"owner", row.owner.str()},
                      {"epoch", row.epoch.value()},
                      {"lease_expires_ms", row.lease_expires_ms},
                      {"lease_expires", lease::FormatWallTime(row.lease_expires_ms)},
                      {"left_ms", std::max<WallMs>(0, row.lease_expires_ms - now)},
                      {"lapsed", row.lease_expires_ms <= now}});
    }
    out << Dump({{"store", (*store)->url()},
                 {"now_ms", now},
                 {"last_epoch", table->last_epoch().value()},
                 {"rows", rows}})
        << '\n';
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"RANGE", "OWNER", "EPOCH", "LEASE EXPIRES", "LEFT"}};
  for (const auto& row : table->rows()) {
    rows.push_back({row.range.ToString(), Printable(row.owner.str()), row.epoch.ToString(),
                    LocalTime(row.lease_expires_ms), TimeLeft(row.lease_expires_ms, now)});
  }
  out << "store " << (*store)->url() << ", highest epoch granted "
      << table->last_epoch().value() << '\n';
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
  auto store = lease::OpenStore(checked->url, clock, lease::SqliteStore::Access::kCreate);
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
    err << "fleetfs: slot range " << held->range.ToString() << " is held by '"
        << Printable(held->owner) << "' until " << LocalTime(held->lease_expires_ms)
        << "; claim again after that\n";
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
      << (grant.fresh ? " (new)" : "") << " until " << LocalTime(grant.lease_expires_ms) << '\n';
  return kExitOk;
}

constexpr const char* kMainFooter = R"(
fleetfs keeps a fleet of SQLite databases, one file per tenant or per routing
slot, on the hosts that own their slots. A host owns slot ranges by claiming
them on a shared ownership table, which grants an epoch (a fencing token), and
renews a lease on them.

EXIT STATUS
  0  success
  1  a failure at run time: the store cannot be reached or is corrupt
  2  bad input: the message names the value and the rule
  3  the range is held by another owner (the message says who, until when)
  4  the range was lost: it is not this owner's at this epoch

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

constexpr const char* kLeaseFooter = R"(
STORE URLS
  sqlite:///absolute/path/control.db   the embedded SQLite control database

The ownership table never overlaps two ranges, never reuses an epoch, and
never lets a claim take a range whose lease is live. A claim of the same range
by its own owner keeps the epoch (a restart is not a new owner).

EXAMPLES
  fleetfs lease claim   --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191
  fleetfs lease ls      --store sqlite:///var/lib/fleetfs/control.db
  fleetfs lease renew   --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191 --epoch 1
  fleetfs lease release --store sqlite:///var/lib/fleetfs/control.db --owner host-a --range 0-8191 --epoch 1
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

  auto* lease_cmd = app.add_subcommand("lease", "Inspect and operate the slot ownership table");
  lease_cmd->require_subcommand(1);
  lease_cmd->footer(kLeaseFooter);
  LeaseArgs args;
  auto add_store = [&](CLI::App* cmd) {
    cmd->add_option("--store", args.store, "Ownership store URL (sqlite:///ABSOLUTE/PATH)")
        ->required();
  };
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
      err << "fleetfs: unknown command '" << argv[next] << "'; run '" << command << " --help'\n";
      return kExitBadInput;
    }
    err << "fleetfs: " << e.what() << "; run '" << command << " --help'\n";
    return kExitBadInput;
  }

  if (slot->parsed()) return RunSlot(keys, slot_mode, slot_json, out, err);
  if (ls->parsed()) return RunLeaseLs(args, out, err);
  if (claim->parsed()) return RunLeaseChange(LeaseVerb::kClaim, args, out, err);
  if (renew->parsed()) return RunLeaseChange(LeaseVerb::kRenew, args, out, err);
  if (release->parsed()) return RunLeaseChange(LeaseVerb::kRelease, args, out, err);
  err << "fleetfs: no command given; run 'fleetfs --help'\n";
  return kExitBadInput;
}

}  // namespace fleetfs::agent
