#include "agent/config.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <map>
#include <toml++/toml.h>

#include "fleet/unique_fd.h"

#include "fleet/replica/destination.h"
#include "lease/lease_ttl.h"
#include "lease/store_url.h"

namespace fleetfs::agent {
namespace {

constexpr const char* kKeys[] = {"backing", "mount",   "mode",  "owner",
                                 "ranges",  "store",   "store_ca", "store_cert", "store_key", "ttl", "admin",
                                 "no_create", "shutdown_grace", "replica", "sync_interval",
                                 "snapshot_interval", "retention", "capture_memory",
                                 "capture_spill", "replica_endpoint", "replica_region",
                                 "replica_path_style", "transport"};

Status KeyError(std::string_view key, std::string_view what) {
  return InvalidArgument(std::string(key) + ": " + std::string(what));
}

bool IsDurationKey(std::string_view key) {
  return key == "ttl" || key == "shutdown_grace" || key == "sync_interval" ||
         key == "snapshot_interval" || key == "retention";
}

bool IsSizeKey(std::string_view key) { return key == "capture_memory" || key == "capture_spill"; }

// Reads one key of the file as text: strings as written, the ranges list
// joined with commas. Numbers are refused: a duration without its unit, or a
// slot number where a range is meant, is a guess the agent does not make.
Result<std::optional<std::string>> TextKey(const toml::table& table, std::string_view key) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::optional<std::string>();
  if (key == "replica_path_style") {
    // A boolean, as TOML writes one; "true" in quotes is a string and refused.
    if (!node->is_boolean()) return KeyError(key, "must be true or false (unquoted)");
    return std::optional<std::string>(*node->value<bool>() ? "true" : "false");
  }
  if (node->is_string()) return std::optional(*node->value<std::string>());
  if (IsDurationKey(key) && (node->is_integer() || node->is_floating_point())) {
    return KeyError(key, "a duration is a string with its unit, as in \"30s\" or \"200ms\" "
                         "(ms, s, m or h); a bare number is refused");
  }
  if (IsSizeKey(key) && (node->is_integer() || node->is_floating_point())) {
    return KeyError(key, "a size is a string with its unit, as in \"256MiB\" (B, KiB, MiB, GiB "
                         "or TiB); a bare number is refused");
  }
  if (key == "ranges") {
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      return KeyError(key, "ranges are a string \"A-B,C-D\" or a list of strings [\"A-B\"]; "
                           "a bare number is refused");
    }
    std::string joined;
    for (const toml::node& item : *array) {
      if (!item.is_string()) {
        return KeyError(key, "every item of the ranges list is a string \"A-B\"");
      }
      if (!joined.empty()) joined += ",";
      joined += *item.value<std::string>();
    }
    return std::optional(joined);
  }
  return KeyError(key, "the value must be a string");
}

// Paths and URLs are quoted in every status document and log line.
Status CheckUtf8(std::string_view key, std::string_view value) {
  if (lease::IsValidUtf8(value)) return Status::Ok();
  return KeyError(key, "'" + lease::Printable(value) + "' is not valid UTF-8");
}

Status CheckAbsolute(std::string_view key, const std::string& path) {
  FLEETFS_RETURN_IF_ERROR(CheckUtf8(key, path));
  if (path.empty() || path[0] != '/') {
    return KeyError(key, "'" + path + "' must be an absolute path");
  }
  return Status::Ok();
}

Result<std::uint64_t> BoundedSize(std::string_view key, const std::string& text, std::uint64_t min,
                                  std::uint64_t max, std::string_view range) {
  FLEETFS_ASSIGN_OR_RETURN(std::uint64_t n, ParseByteSize(key, text));
  if (n < min || n > max) return KeyError(key, "must be between " + std::string(range));
  return n;
}

Result<Millis> BoundedDuration(std::string_view key, const std::string& text, Millis min,
                               Millis max) {
  FLEETFS_ASSIGN_OR_RETURN(Millis d, lease::ParseDuration(key, text));
  if (d < min || d > max) {
    return KeyError(key, "must be between " + lease::FormatDuration(min) + " and " +
                             lease::FormatDuration(max));
  }
  return d;
}

// Checks one value and sets it. The file's values go through here even when
// a flag overrides them, so a wrong value never hides behind a flag. What
// depends on the file system (directories, the store file) is checked
// later, for the values that win.
Status ApplyValue(std::string_view key, const std::string& value, AgentConfig& config) {
  if (key == "backing") {
    FLEETFS_RETURN_IF_ERROR(CheckAbsolute(key, value));
    config.backing = value;
  } else if (key == "mount") {
    FLEETFS_RETURN_IF_ERROR(CheckAbsolute(key, value));
    config.mountpoint = value;
  } else if (key == "mode") {
    auto mode = ParseMode(value);
    if (!mode.ok()) return mode.status().WithContext("mode");
    config.mode = *mode;
  } else if (key == "owner") {
    auto owner = lease::OwnerId::Make(value);
    if (!owner.ok()) return owner.status().WithContext("owner");
    config.owner = *owner;
  } else if (key == "ranges") {
    auto ranges = lease::ParseRangeList(value);
    if (!ranges.ok()) return ranges.status().WithContext("ranges");
    config.ranges = *ranges;
  } else if (key == "store") {
    FLEETFS_RETURN_IF_ERROR(CheckUtf8(key, value));
    if (auto url = lease::ParseStoreUrl(value); !url.ok()) return url.status().WithContext("store");
    config.store = value;
  } else if (key == "store_ca" || key == "store_cert" || key == "store_key") {
    // Empty: unset (the system's CA bundle; no client certificate).
    if (!value.empty()) FLEETFS_RETURN_IF_ERROR(CheckAbsolute(key, value));
    std::string& field = key == "store_ca"     ? config.store_tls.ca
                         : key == "store_cert" ? config.store_tls.cert
                                               : config.store_tls.key;
    field = value;
  } else if (key == "ttl") {
    auto ttl = lease::ParseTtl(value);
    if (!ttl.ok()) return ttl.status().WithContext("ttl");
    config.ttl = *ttl;
  } else if (key == "admin") {
    config.admin.reset();
    if (value != "off") {
      FLEETFS_ASSIGN_OR_RETURN(config.admin, ParseAdminEndpoint(value));
    }
  } else if (key == "shutdown_grace") {
    FLEETFS_ASSIGN_OR_RETURN(config.shutdown_grace,
                             BoundedDuration(key, value, Millis(0), Millis(600'000)));
  } else if (key == "replica") {
    config.replica.clear();
    if (value != "off") {
      FLEETFS_RETURN_IF_ERROR(CheckUtf8(key, value));
      FLEETFS_RETURN_IF_ERROR(replica::ValidateDestinationUrl(value));
      config.replica = value;
    }
  } else if (key == "replica_endpoint") {
    FLEETFS_ASSIGN_OR_RETURN(config.replica_s3.endpoint, ParseReplicaEndpoint(value));
  } else if (key == "replica_region") {
    FLEETFS_RETURN_IF_ERROR(CheckReplicaRegion(value));
    config.replica_s3.region = value;
  } else if (key == "replica_path_style") {
    FLEETFS_ASSIGN_OR_RETURN(config.replica_s3.path_style, ParseReplicaPathStyle(value));
  } else if (key == "sync_interval") {
    FLEETFS_ASSIGN_OR_RETURN(config.sync_interval,
                             BoundedDuration(key, value, Millis(10), Millis(600'000)));
  } else if (key == "snapshot_interval") {
    FLEETFS_ASSIGN_OR_RETURN(config.snapshot_interval,
                             BoundedDuration(key, value, Millis(1000), Millis(30LL * 86'400'000)));
  } else if (key == "capture_memory") {
    FLEETFS_ASSIGN_OR_RETURN(config.capture_memory,
                             BoundedSize(key, value, 1ull << 20, 1ull << 40, "1MiB and 1TiB"));
  } else if (key == "capture_spill") {
    FLEETFS_ASSIGN_OR_RETURN(config.capture_spill,
                             BoundedSize(key, value, 0, 1ull << 50, "0B and 1024TiB"));
  } else if (key == "transport") {
    FLEETFS_ASSIGN_OR_RETURN(config.transport, ParseTransport(value));
  } else if (key == "retention") {
    FLEETFS_ASSIGN_OR_RETURN(config.retention,
                             BoundedDuration(key, value, Millis(60'000),
                                             Millis(3650LL * 86'400'000)));
  } else {
    return KeyError(key, "not a configuration key");
  }
  return Status::Ok();
}

// The control database before the agent touches anything: its directory
// exists, and a file already there is a SQLite database (an empty file is
// one SQLite will initialise). Nothing is created here.
Status CheckStoreFile(const std::string& url, const lease::StoreTls& tls) {
  auto parsed = lease::ParseStoreUrl(url);
  if (!parsed.ok()) return parsed.status().WithContext("store");
  FLEETFS_RETURN_IF_ERROR(lease::CheckStoreTls(*parsed, tls));
  if (parsed->is_etcd()) {
    // The cluster is reached at start; the TLS files must be usable now.
    return lease::CheckStoreTlsFiles(tls);
  }
  const std::string& path = parsed->path;
  const std::string dir = path.substr(0, std::max<std::size_t>(path.rfind('/'), 1));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return KeyError("store", "the directory " + dir + " of the control database " + path +
                                 " does not exist; create it first");
  }
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();  // the agent makes it
    return KeyError("store", path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return KeyError("store", path + " is not a regular file");
  if (st.st_size == 0) return Status::Ok();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return KeyError("store", path + ": " + std::strerror(errno));
  static constexpr char kMagic[] = "SQLite format 3";  // 16 bytes with its NUL
  char header[sizeof kMagic] = {};
  const ssize_t n = ::pread(fd.get(), header, sizeof header, 0);
  if (n != static_cast<ssize_t>(sizeof header) || std::memcmp(header, kMagic, sizeof kMagic) != 0) {
    return KeyError("store", path + " exists and is not a SQLite database; name the control "
                                    "database, or a path where the agent may create it");
  }
  return Status::Ok();
}

Status CheckAbsoluteDir(std::string_view key, const std::string& path) {
  FLEETFS_RETURN_IF_ERROR(CheckAbsolute(key, path));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // A stale FUSE mount left by a crashed agent: the agent cleans it up.
    // ECONNABORTED: a request that raced with the daemon's death.
    if ((errno == ENOTCONN || errno == ECONNABORTED) && key == "mount") return Status::Ok();
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

Result<std::uint64_t> ParseByteSize(std::string_view key, std::string_view text) {
  static constexpr std::pair<std::string_view, int> kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}};
  const std::string rule = "'" + lease::Printable(text) +
                           "': a size is a whole number and its unit, as in 256MiB (B, KiB, MiB, "
                           "GiB or TiB)";
  for (const auto& [unit, shift] : kUnits) {
    if (!text.ends_with(unit)) continue;
    const std::string_view digits = text.substr(0, text.size() - unit.size());
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) break;
    if (n > (UINT64_MAX >> shift)) return KeyError(key, rule + "; too large");
    return n << shift;
  }
  return KeyError(key, rule);
}

Result<std::string> ParseReplicaEndpoint(std::string_view text) {
  constexpr std::string_view kKey = "replica_endpoint";
  if (text.empty()) return std::string();
  FLEETFS_RETURN_IF_ERROR(CheckUtf8(kKey, text));
  auto refuse = [&](const std::string& problem) {
    return KeyError(kKey, "'" + lease::Printable(text) + "' " + problem +
                              "; write http(s)://HOST[:PORT], as in https://s3.eu-west-1."
                              "amazonaws.com or http://127.0.0.1:9000");
  };
  std::string_view rest;
  if (text.starts_with("https://")) {
    rest = text.substr(8);
  } else if (text.starts_with("http://")) {
    rest = text.substr(7);
  } else {
    return refuse("is not an http:// or https:// URL");
  }
  const std::size_t end = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, end);
  const std::string_view after = end == std::string_view::npos ? "" : rest.substr(end);
  if (authority.find('@') != std::string_view::npos) {
    // Not quoted: what precedes the '@' may be a secret.
    return KeyError(kKey, "the URL holds a user name (USER@HOST): credentials come from the "
                          "environment or the AWS credentials file, never from the URL; write "
                          "http(s)://HOST[:PORT]");
  }
  if (after.find_first_of("?#") != std::string_view::npos) {
    return refuse("has a query or fragment");
  }
  if (!after.empty() && after != "/") {
    return refuse("has a path: the bucket and prefix go in the replica URL, "
                  "s3://BUCKET/PREFIX");
  }
  std::string_view host = authority;
  std::string_view port;
  bool port_given = false;
  if (host.starts_with('[')) {
    const std::size_t close = host.find(']');
    if (close == std::string_view::npos) return refuse("has an unclosed '[' in its host");
    const std::string_view tail = host.substr(close + 1);
    if (!tail.empty() && !tail.starts_with(':')) return refuse("has text after its ']'");
    port_given = !tail.empty();
    if (port_given) port = tail.substr(1);
    const std::string_view v6 = host.substr(1, close - 1);
    if (v6.empty() || v6.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos) {
      return refuse("has a bracketed host that is not an IPv6 address");
    }
  } else {
    const std::size_t colon = host.find(':');
    if (colon != std::string_view::npos) {
      port_given = true;
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
    }
    if (host.empty()) return refuse("names no host");
    if (host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                               ".-_") != std::string_view::npos) {
      return refuse("has a host with a character other than letters, digits, '.', '-' and '_'");
    }
  }
  if (port_given) {
    int n = 0;
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), n);
    if (port.empty() || ec != std::errc() || p != port.data() + port.size() || n < 1 ||
        n > 65535) {
      return refuse("has a port other than 1-65535");
    }
  }
  return std::string(text.substr(0, text.size() - (after == "/" ? 1 : 0)));
}

Status CheckReplicaRegion(std::string_view text) {
  if (text.empty()) return Status::Ok();
  if (text.size() > 32 ||
      text.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string_view::npos) {
    return KeyError("replica_region", "'" + lease::Printable(text) +
                                          "' is not a region name: 1 to 32 lowercase letters, "
                                          "digits and hyphens, as in eu-west-1");
  }
  return Status::Ok();
}

Result<std::optional<bool>> ParseReplicaPathStyle(std::string_view text) {
  if (text.empty()) return std::optional<bool>();
  if (text == "true") return std::optional<bool>(true);
  if (text == "false") return std::optional<bool>(false);
  return KeyError("replica_path_style", "'" + lease::Printable(text) + "' must be true or false");
}

Status CheckS3SettingsApply(std::string_view replica, const replica::S3Settings& s3) {
  if (replica.starts_with("s3://")) return Status::Ok();
  const char* key = !s3.endpoint.empty()   ? "replica_endpoint"
                    : !s3.region.empty()   ? "replica_region"
                    : s3.path_style.has_value() ? "replica_path_style"
                                           : nullptr;
  if (key == nullptr) return Status::Ok();
  const std::string now = replica.empty() ? std::string("replication is off")
                                          : "the replica is " + std::string(replica);
  return KeyError(key, "applies only to an s3:// replica, and " + now);
}

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

Result<vfs::Transport> ParseTransport(std::string_view text) {
  for (vfs::Transport t : {vfs::Transport::kAuto, vfs::Transport::kIoUring,
                           vfs::Transport::kDevFuse}) {
    if (text == TransportValue(t)) return t;
  }
  return KeyError("transport", "'" + lease::Printable(text) +
                                   "' is not a transport; the values are auto (io_uring when the "
                                   "kernel allows it, else /dev/fuse), io_uring and dev_fuse");
}

std::string_view TransportValue(vfs::Transport transport) {
  switch (transport) {
    case vfs::Transport::kAuto: return "auto";
    case vfs::Transport::kIoUring: return "io_uring";
    case vfs::Transport::kDevFuse: return "dev_fuse";
  }
  return "auto";
}

Result<AgentConfig> ResolveConfig(const ConfigInput& input) {
  // Each key's value as given on the command line, then the file's beneath.
  const std::pair<std::string_view, const std::optional<std::string>*> flags[] = {
      {"backing", &input.backing},
      {"mount", &input.mountpoint},
      {"mode", &input.mode},
      {"owner", &input.owner},
      {"ranges", &input.ranges},
      {"store", &input.store},
      {"store_ca", &input.store_ca},
      {"store_cert", &input.store_cert},
      {"store_key", &input.store_key},
      {"ttl", &input.ttl},
      {"admin", &input.admin},
      {"shutdown_grace", &input.shutdown_grace},
      {"replica", &input.replica},
      {"sync_interval", &input.sync_interval},
      {"snapshot_interval", &input.snapshot_interval},
      {"retention", &input.retention},
      {"capture_memory", &input.capture_memory},
      {"capture_spill", &input.capture_spill},
      {"replica_endpoint", &input.replica_endpoint},
      {"replica_region", &input.replica_region},
      {"replica_path_style", &input.replica_path_style},
      {"transport", &input.transport},
  };
  std::map<std::string_view, std::string> values;
  bool file_no_create = false;
  if (input.config_file) {
    const std::string& file = *input.config_file;
    auto in_file = [&](const Status& status) {
      return InvalidArgument("config file " + file + ": " + status.message());
    };
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
                               lease::Printable(key.str()) +
                               "'; the keys are backing, mount, mode, owner, ranges, store, store_ca, "
                               "store_cert, store_key, ttl, "
                               "admin, no_create, shutdown_grace, replica, sync_interval, "
                               "snapshot_interval, retention, capture_memory, capture_spill, "
                               "replica_endpoint, replica_region, replica_path_style, "
                               "transport");
      }
    }
    AgentConfig scratch;  // where the file's own values are checked
    for (const auto& [key, flag] : flags) {
      auto text = TextKey(table, key);
      if (!text.ok()) return in_file(text.status());
      if (!*text) continue;
      if (Status valid = ApplyValue(key, **text, scratch); !valid.ok()) return in_file(valid);
      values[key] = **text;
    }
    if (const toml::node* node = table.get("no_create")) {
      if (!node->is_boolean()) return in_file(KeyError("no_create", "must be true or false"));
      file_no_create = *node->value<bool>();
    }
  }
  for (const auto& [key, flag] : flags) {
    if (*flag) values[key] = **flag;  // the flag wins
  }
  AgentConfig config;
  const std::pair<std::string_view, const char*> defaults[] = {
      {"backing", kDefaultBacking}, {"mount", kDefaultMount},     {"mode", "tenant"},
      {"ranges", "0-16383"},        {"store", kDefaultStore},     {"ttl", "30s"},
      {"admin", kDefaultAdmin},     {"shutdown_grace", "5s"},     {"replica", "off"},
      {"sync_interval", "1s"},      {"snapshot_interval", "1h"}, {"retention", "72h"},
      {"capture_memory", "256MiB"}, {"capture_spill", "4GiB"},   {"transport", "auto"},
  };
  for (const auto& [key, fallback] : defaults) {
    if (values.count(key) == 0) values[key] = fallback;
  }
  if (values.count("owner") == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    values["owner"] = host;
  }
  for (const auto& [key, flag] : flags) {
    FLEETFS_RETURN_IF_ERROR(ApplyValue(key, values[key], config));
  }
  FLEETFS_RETURN_IF_ERROR(CheckS3SettingsApply(config.replica, config.replica_s3));

  // What the file system says, for the values that win; still nothing is
  // created or changed.
  FLEETFS_RETURN_IF_ERROR(CheckAbsoluteDir("backing", config.backing));
  FLEETFS_RETURN_IF_ERROR(CheckAbsoluteDir("mount", config.mountpoint));
  const std::string backing = Canonical(config.backing);
  // A stale mount cannot be resolved (ENOTCONN); its path is taken as given.
  const std::string mount = Canonical(config.mountpoint);
  if (Within(mount, backing) || Within(backing, mount)) {
    return KeyError("mount", "'" + config.mountpoint + "' and the backing directory '" +
                                 config.backing + "' must not contain each other");
  }
  FLEETFS_RETURN_IF_ERROR(CheckUtf8("backing", backing));
  FLEETFS_RETURN_IF_ERROR(CheckUtf8("mount", mount));
  config.backing = backing;
  config.mountpoint = mount;
  FLEETFS_RETURN_IF_ERROR(CheckStoreFile(config.store, config.store_tls));

  config.allow_create = !(input.no_create.value_or(false) || file_no_create);
  return config;
}

}  // namespace fleetfs::agent
