// Store URLs: which ownership store a host uses.
//
//   sqlite:///absolute/path/control.db          the embedded SQLite control database
//   etcd://HOST:PORT[,HOST:PORT...]/PREFIX      an etcd 3.4+ cluster (its v3 JSON gateway)
//   etcds://HOST:PORT[,HOST:PORT...]/PREFIX     the same over TLS (store_ca, store_cert,
//                                               store_key)
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "lease/ownership_store.h"
#include "lease/sqlite_store.h"

namespace fleetfs::lease {

struct StoreUrl {
  enum class Scheme { kSqlite, kEtcd, kEtcds };
  Scheme scheme = Scheme::kSqlite;
  std::string path;                    // sqlite: the control database's absolute path
  std::vector<std::string> endpoints;  // etcd: "host:port", in the URL's order
  std::string prefix;                  // etcd: the key prefix, no '/' at either end

  bool is_etcd() const { return scheme != Scheme::kSqlite; }
};

// TLS files of an etcds:// store (config keys store_ca, store_cert, store_key).
struct StoreTls {
  std::string ca;    // "" : the system's CA bundle
  std::string cert;  // client certificate; with key, or neither
  std::string key;

  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

// Checks a URL without touching anything.
Result<StoreUrl> ParseStoreUrl(std::string_view url);

// Checks that the TLS settings fit the URL: only etcds:// takes them, paths
// are absolute, and a client certificate comes with its key. Files are not
// opened here.
Status CheckStoreTls(const StoreUrl& url, const StoreTls& tls);

// Checks the TLS files themselves: each one named is a regular file this
// process can read, and the key is not encrypted (fleetfs has no passphrase
// to give, and OpenSSL would ask for one on the terminal). The message names
// the config key and the file.
Status CheckStoreTlsFiles(const StoreTls& tls);

// Opens the store a URL names (an etcds:// store after CheckStoreTlsFiles). `clock` must outlive the store. An etcd store
// does not contact the cluster until its first call.
Result<std::unique_ptr<OwnershipStore>> OpenStore(std::string_view url, const WallClock& clock,
                                                  SqliteStore::Access access,
                                                  const StoreTls& tls = {});

}  // namespace fleetfs::lease
