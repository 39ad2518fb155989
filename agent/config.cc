#include "agent/config.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstring>
#include <toml++/toml.h>

#include "fleet/replica_destination.h"
#include "lease/lease_ttl.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

constexpr const char* kKeys[] = {"backing", "mount",   "mode",  "owner",
                                 "ranges",  "store",   "ttl",   "admin",
                                 "no_create", "shutdown_grace", "replica", "sync_interval",
                                 "snapshot_interval", "retention"};

Status KeyError(std::string_view key, std::string_view what) {
  return InvalidArgument(std::string(key) + ": " + std::string(what));
}

// Reads one key of the file as text; arrays of strings (ranges) are joined
// with commas, integers are taken as written.
Result<std::optional<std::string>> TextKey(const toml::table& table, std::string_view key,
                                           const std::string& file) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::optional<std::string>();
  if (auto s = node->value<std::string>(); s && node->is_string()) return std::optional(*s);
  if (node->is_integer()) return std::optional(std::to_string(*node->value<std::int64_t>()));
  if (const toml::array* array = node->as_array(); array != nullptr && key == "ranges") {
    std::string joined;
    for (const toml::node& item : *array) {
      if (!item.is_string()) {
        return KeyError(key, "in " + file + ", every item of the ranges list is a string \"A-B\"");
      }
      if (!joined.empty()) joined += ",";
      joined += *item.value<std::string>();
    }
    return std::optional(joined);
  }
  return KeyError(key, "in " + file + ", the value must be a string");
}

Status CheckAbsoluteDir(std::string_view key, const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return KeyError(key, "'" + path + "' must be an absolute path");
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // A stale FUSE mount left by a crashed agent: the agent cleans it up.
    if (errno == ENOTCONN && key == "mount") return Status::Ok();
    return KeyError(key, "'" + path + "' does not exist (" + std::strerror(errno) +
                             "); create the directory first");
  }
  if (!S_ISDIR(st.st_mode)) return KeyError(key, "'" + path + "' is not a directory");
  return Status::Ok();
}

bool Within(const std::string& inner, const std::string& outer) {
  std::string o = outer.back() == '/' ? outer : outer + "/";
  return inner == outer || inner.rfind(o, 0) == 0;
}

std::string Canonical(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

}  // namespace

Result<Endpoint> ParseAdminEndpoint(std::string_view text) {
  const std::string rule = "'" + std::string(text) +
                           "' must be HOST:PORT on loopback (127.0.0.1:7878), or 'off': the "
                           "admin server has no authentication";
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return KeyError("admin", rule);
  std::string host(text.substr(0, colon));
  std::string_view port_text = text.substr(colon + 1);
  if (host == "localhost") host = "127.0.0.1";
  in_addr addr{};
  if (::inet_pton(AF_INET, host.c_str(), &addr) != 1 || (ntohl(addr.s_addr) >> 24) != 127) {
    return KeyError("admin", rule);
  }
  int port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
      port > 65535) {
    return KeyError("admin", "port '" + std::string(port_text) + "' must be 1-65535");
  }
  return Endpoint{host, port};
}

Result<AgentConfig> ResolveConfig(const ConfigInput& input) {
  ConfigInput merged = input;
  bool file_no_create = false;
  if (input.config_file) {
    const std::string& file = *input.config_file;
    toml::table table;
    try {
      table = toml::parse_file(file);
    } catch (const toml::parse_error& e) {
      std::string where = e.source().begin ? " at line " + std::to_string(e.source().begin.line)
                                           : std::string();
      return InvalidArgument("config file " + file + where + ": " + std::string(e.description()));
    }
    for (const auto& [key, node] : table) {
      bool known = false;
      for (const char* k : kKeys) known = known || key.str() == k;
      if (!known) {
        return InvalidArgument("config file " + file + ": unknown key '" +
                               std::string(key.str()) +
                               "'; the keys are backing, mount, mode, owner, ranges, store, ttl, "
                               "admin, no_create, shutdown_grace, replica, sync_interval, snapshot_interval, "
                               "retention");
      }
    }
    auto fill = [&](std::optional<std::string>& slot, std::string_view key) -> Status {
      if (slot) return Status::Ok();  // the flag wins
      FLEETFS_ASSIGN_OR_RETURN(slot, TextKey(table, key, file));
      return Status::Ok();
    };
    const std::pair<std::optional<std::string>*, std::string_view> text_keys[] = {
        {&merged.backing, "backing"},
        {&merged.mountpoint, "mount"},
        {&merged.mode, "mode"},
        {&merged.owner, "owner"},
        {&merged.ranges, "ranges"},
        {&merged.store, "store"},
        {&merged.ttl, "ttl"},
        {&merged.admin, "admin"},
        {&merged.shutdown_grace, "shutdown_grace"},
        {&merged.replica, "replica"},
        {&merged.sync_interval, "sync_interval"},
        {&merged.snapshot_interval, "snapshot_interval"},
        {&merged.retention, "retention"},
    };
    for (const auto& [slot, key] : text_keys) FLEETFS_RETURN_IF_ERROR(fill(*slot, key));
    if (const toml::node* node = table.get("no_create")) {
      if (!node->is_boolean()) return KeyError("no_create", "in " + file + ", must be true or false");
      file_no_create = *node->value<bool>();
    }
  }

  AgentConfig config;
  config.backing = merged.backing.value_or(kDefaultBacking);
  config.mountpoint = merged.mountpoint.value_or(kDefaultMount);
  FLEETFS_RETURN_IF_ERROR(CheckAbsoluteDir("backing", config.backing));
  FLEETFS_RETURN_IF_ERROR(CheckAbsoluteDir("mount", config.mountpoint));
  const std::string backing = Canonical(config.backing);
  // A stale mount cannot be resolved (ENOTCONN); its path is taken as given.
  const std::string mount = Canonical(config.mountpoint);
  if (Within(mount, backing) || Within(backing, mount)) {
    return KeyError("mount", "'" + config.mountpoint + "' and the backing directory '" +
                                 config.backing + "' must not contain each other");
  }
  config.backing = backing;
  config.mountpoint = mount;

  auto mode = ParseMode(merged.mode.value_or("tenant"));
  if (!mode.ok()) return mode.status().WithContext("mode");
  config.mode = *mode;

  std::string owner = merged.owner.value_or("");
  if (!merged.owner) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    owner = host;
  }
  auto owner_id = lease::OwnerId::Make(owner);
  if (!owner_id.ok()) return owner_id.status().WithContext("owner");
  config.owner = *owner_id;

  auto ranges = lease::ParseRangeList(merged.ranges.value_or("0-16383"));
  if (!ranges.ok()) return ranges.status().WithContext("ranges");
  config.ranges = *ranges;

  config.store = merged.store.value_or(kDefaultStore);
  if (auto url = lease::ParseStoreUrl(config.store); !url.ok()) {
    return url.status().WithContext("store");
  }

  auto ttl = lease::ParseTtl(merged.ttl.value_or("30s"));
  if (!ttl.ok()) return ttl.status().WithContext("ttl");
  config.ttl = *ttl;

  std::string admin = merged.admin.value_or(kDefaultAdmin);
  if (admin != "off") {
    FLEETFS_ASSIGN_OR_RETURN(config.admin, ParseAdminEndpoint(admin));
  }

  auto grace = lease::ParseDuration("shutdown_grace", merged.shutdown_grace.value_or("5s"));
  if (!grace.ok()) return grace.status();
  if (*grace > Millis(600000)) {
    return KeyError("shutdown_grace", "must be at most 600s");
  }
  config.shutdown_grace = *grace;

  config.replica = merged.replica.value_or("off");
  if (config.replica == "off") {
    config.replica.clear();
  } else if (Status url = replica::ValidateDestinationUrl(config.replica); !url.ok()) {
    return url;
  }
  struct Bounded {
    const char* key;
    const std::optional<std::string>& value;
    const char* fallback;
    Millis min, max;
    Millis* out;
  };
  for (const Bounded& b : {
           Bounded{"sync_interval", merged.sync_interval, "1s", Millis(10), Millis(600'000),
                   &config.sync_interval},
           Bounded{"snapshot_interval", merged.snapshot_interval, "1h", Millis(1000),
                   Millis(30LL * 86'400'000), &config.snapshot_interval},
           Bounded{"retention", merged.retention, "72h", Millis(60'000),
                   Millis(3650LL * 86'400'000), &config.retention},
       }) {
    auto d = lease::ParseDuration(b.key, b.value.value_or(b.fallback));
    if (!d.ok()) return d.status();
    if (*d < b.min || *d > b.max) {
      return KeyError(b.key, "must be between " + lease::FormatDuration(b.min) + " and " +
                                 lease::FormatDuration(b.max));
    }
    *b.out = *d;
  }

  config.allow_create = !(input.no_create.value_or(false) || file_no_create);
  return config;
}

}  // namespace fleetfs::agent
