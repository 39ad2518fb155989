#include "lease/store_url.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "fleet/unique_fd.h"

#include "lease/etcd_store.h"

namespace fleetfs::lease {
namespace {

constexpr const char* kForms =
    "sqlite:///absolute/path/control.db, etcd://HOST:PORT[,HOST:PORT...]/PREFIX or "
    "etcds://HOST:PORT[,HOST:PORT...]/PREFIX";

bool HostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-';
}

bool PrefixChar(char c) { return HostChar(c) || c == '_'; }

// "host:port" or "[v6]:port".
Status CheckEndpoint(const std::string& shown, std::string_view endpoint) {
  const std::string where = "store URL '" + shown + "': endpoint '" + std::string(endpoint) + "'";
  if (endpoint.empty()) {
    return InvalidArgument(where + ": empty; endpoints are HOST:PORT separated by commas");
  }
  const auto colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) {
    return InvalidArgument(where + ": no port; an endpoint is HOST:PORT");
  }
  const std::string_view host = endpoint.substr(0, colon);
  const std::string_view port = endpoint.substr(colon + 1);
  if (host.empty()) return InvalidArgument(where + ": empty host; an endpoint is HOST:PORT");
  const bool v6 = host.size() > 2 && host.front() == '[' && host.back() == ']' &&
                  host.substr(1, host.size() - 2).find_first_not_of("0123456789abcdefABCDEF:.") ==
                      std::string_view::npos;
  const bool named = std::all_of(host.begin(), host.end(), HostChar);
  if (!v6 && !named) {
    return InvalidArgument(where + ": host '" + std::string(host) +
                           "' must be a name or IPv4 address (letters, digits, '.', '-') or "
                           "[IPv6]");
  }
  int number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || number < 1 ||
      number > 65535) {
    return InvalidArgument(where + ": port '" + std::string(port) + "' must be 1-65535");
  }
  return Status::Ok();
}

Result<StoreUrl> ParseEtcd(const std::string& shown, StoreUrl::Scheme scheme,
                           std::string_view rest) {
  const auto slash = rest.find('/');
  const std::string_view hosts = rest.substr(0, slash);
  StoreUrl url;
  url.scheme = scheme;
  if (hosts.empty()) {
    return InvalidArgument("store URL '" + shown +
                           "': no endpoint; an etcd URL is etcd://HOST:PORT[,HOST:PORT...]/PREFIX");
  }
  std::size_t start = 0;
  while (true) {
    const auto comma = hosts.find(',', start);
    const std::string_view endpoint = hosts.substr(start, comma - start);
    FLEETFS_RETURN_IF_ERROR(CheckEndpoint(shown, endpoint));
    if (std::find(url.endpoints.begin(), url.endpoints.end(), endpoint) != url.endpoints.end()) {
      return InvalidArgument("store URL '" + shown + "': endpoint '" + std::string(endpoint) +
                             "' is named twice");
    }
    url.endpoints.emplace_back(endpoint);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  const std::string prefix_rule =
      "; the prefix is 1-128 characters of A-Z a-z 0-9 . _ -, in segments separated by single "
      "'/', none of them '.' or '..'";
  if (slash == std::string_view::npos || slash + 1 == rest.size()) {
    return InvalidArgument("store URL '" + shown +
                           "': no key prefix; name one after the endpoints, as in "
                           "etcd://127.0.0.1:2379/fleetfs" + prefix_rule);
  }
  const std::string_view prefix = rest.substr(slash + 1);
  std::string_view bad;
  if (prefix.size() > 128) bad = "is longer than 128 characters";
  std::size_t segment = 0;
  for (std::size_t i = 0; i <= prefix.size() && bad.empty(); ++i) {
    if (i == prefix.size() || prefix[i] == '/') {
      const std::string_view part = prefix.substr(segment, i - segment);
      if (part.empty()) bad = "has an empty segment (a '/' at either end, or '//')";
      if (part == "." || part == "..") bad = "has a '.' or '..' segment";
      segment = i + 1;
    } else if (!PrefixChar(prefix[i])) {
      bad = "has a character outside A-Z a-z 0-9 . _ - /";
    }
  }
  if (!bad.empty()) {
    return InvalidArgument("store URL '" + shown + "': prefix '" + std::string(prefix) + "' " +
                           std::string(bad) + prefix_rule);
  }
  url.prefix = std::string(prefix);
  return url;
}

}  // namespace

Result<StoreUrl> ParseStoreUrl(std::string_view url) {
  const std::string shown(url);
  const auto colon = url.find("://");
  if (colon == std::string_view::npos) {
    return InvalidArgument("store URL '" + shown + "': not a URL; use " + kForms);
  }
  const std::string_view scheme = url.substr(0, colon);
  const std::string_view rest = url.substr(colon + 3);
  if (scheme == "etcd") return ParseEtcd(shown, StoreUrl::Scheme::kEtcd, rest);
  if (scheme == "etcds") return ParseEtcd(shown, StoreUrl::Scheme::kEtcds, rest);
  if (scheme != "sqlite") {
    return InvalidArgument("store URL '" + shown + "': unknown scheme '" + std::string(scheme) +
                           "'; supported: " + kForms);
  }
  if (rest.empty() || rest.front() != '/') {
    return InvalidArgument("store URL '" + shown +
                           "': the control database path must be absolute "
                           "(sqlite:///absolute/path/control.db, three slashes)");
  }
  if (rest.back() == '/') {
    return InvalidArgument("store URL '" + shown + "': names a directory, not a control database file");
  }
  return StoreUrl{StoreUrl::Scheme::kSqlite, std::string(rest), {}, {}};
}

Status CheckStoreTls(const StoreUrl& url, const StoreTls& tls) {
  if (url.scheme != StoreUrl::Scheme::kEtcds) {
    if (tls.empty()) return Status::Ok();
    const char* key = !tls.ca.empty() ? "store_ca" : !tls.cert.empty() ? "store_cert" : "store_key";
    return InvalidArgument(std::string(key) + ": TLS files are for an etcds:// store only");
  }
  for (const auto& [key, path] : {std::pair{"store_ca", &tls.ca}, std::pair{"store_cert", &tls.cert},
                                  std::pair{"store_key", &tls.key}}) {
    if (!path->empty() && path->front() != '/') {
      return InvalidArgument(std::string(key) + ": '" + *path + "' must be an absolute path");
    }
  }
  if (tls.cert.empty() != tls.key.empty()) {
    return InvalidArgument(std::string(tls.cert.empty() ? "store_cert" : "store_key") +
                           ": a client certificate (store_cert) and its key (store_key) go "
                           "together; give both or neither");
  }
  return Status::Ok();
}

Status CheckStoreTlsFiles(const StoreTls& tls) {
  for (const auto& [key, path] : {std::pair{"store_ca", &tls.ca}, std::pair{"store_cert", &tls.cert},
                                  std::pair{"store_key", &tls.key}}) {
    if (path->empty()) continue;
    const std::string where = std::string(key) + ": " + *path;
    UniqueFd fd(::open(path->c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) return InvalidArgument(where + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return InvalidArgument(where + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) {
      return InvalidArgument(where + " is not a regular file; name the PEM file itself");
    }
    if (path != &tls.key) continue;
    // A PEM key under a passphrase says so in its first lines: PKCS#8
    // "BEGIN ENCRYPTED PRIVATE KEY", or the older "Proc-Type: 4,ENCRYPTED".
    std::string head(4096, '\0');
    const ssize_t n = ::read(fd.get(), head.data(), head.size());
    if (n < 0) return InvalidArgument(where + ": " + std::strerror(errno));
    head.resize(static_cast<std::size_t>(n));
    if (head.find("ENCRYPTED") != std::string::npos) {
      return InvalidArgument(where + " is protected by a passphrase, which fleetfs has no way to "
                             "give; store the key decrypted, readable only by the agent's user "
                             "(openssl pkey -in KEY -out NEW_KEY; chmod 600 NEW_KEY)");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<OwnershipStore>> OpenStore(std::string_view url, const WallClock& clock,
                                                  SqliteStore::Access access,
                                                  const StoreTls& tls) {
  FLEETFS_ASSIGN_OR_RETURN(StoreUrl parsed, ParseStoreUrl(url));
  FLEETFS_RETURN_IF_ERROR(CheckStoreTls(parsed, tls));
  if (parsed.is_etcd()) {
    FLEETFS_RETURN_IF_ERROR(CheckStoreTlsFiles(tls));
    static const SystemMonotonicClock mono;
    EtcdTls etcd_tls{parsed.scheme == StoreUrl::Scheme::kEtcds, tls.ca, tls.cert, tls.key};
    auto client = std::make_unique<EtcdClient>(parsed.endpoints,
                                               MakeCurlTransport(std::move(etcd_tls)), mono);
    return std::unique_ptr<OwnershipStore>(std::make_unique<EtcdStore>(
        std::move(client), parsed.prefix, std::string(url), clock, mono, EtcdStore::Options{}));
  }
  FLEETFS_ASSIGN_OR_RETURN(std::unique_ptr<SqliteStore> store,
                           SqliteStore::Open(parsed.path, clock, {.access = access}));
  return std::unique_ptr<OwnershipStore>(std::move(store));
}

}  // namespace fleetfs::lease
