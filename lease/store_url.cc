#include "lease/store_url.h"

namespace fleetfs::lease {

Result<StoreUrl> ParseStoreUrl(std::string_view url) {
  const std::string shown(url);
  const auto colon = url.find("://");
  if (colon == std::string_view::npos) {
    return InvalidArgument("store URL '" + shown +
                           "': not a URL; use sqlite:///absolute/path/control.db");
  }
  const std::string_view scheme = url.substr(0, colon);
  const std::string_view rest = url.substr(colon + 3);
  if (scheme != "sqlite") {
    return InvalidArgument("store URL '" + shown + "': unknown scheme '" + std::string(scheme) +
                           "'; supported: sqlite:///absolute/path/control.db");
  }
  if (rest.empty() || rest.front() != '/') {
    return InvalidArgument("store URL '" + shown +
                           "': the control database path must be absolute "
                           "(sqlite:///absolute/path/control.db, three slashes)");
  }
  if (rest.back() == '/') {
    return InvalidArgument("store URL '" + shown + "': names a directory, not a control database file");
  }
  return StoreUrl{StoreUrl::Scheme::kSqlite, std::string(rest)};
}

Result<std::unique_ptr<OwnershipStore>> OpenStore(std::string_view url, const WallClock& clock,
                                                  SqliteStore::Access access) {
  FLEETFS_ASSIGN_OR_RETURN(StoreUrl parsed, ParseStoreUrl(url));
  FLEETFS_ASSIGN_OR_RETURN(std::unique_ptr<SqliteStore> store,
                           SqliteStore::Open(parsed.path, clock, {.access = access}));
  return std::unique_ptr<OwnershipStore>(std::move(store));
}

}  // namespace fleetfs::lease
