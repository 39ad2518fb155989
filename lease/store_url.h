// Store URLs: which ownership store a host uses.
//
//   sqlite:///absolute/path/control.db   the embedded SQLite control database
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "fleet/clock.h"
#include "lease/ownership_store.h"
#include "lease/sqlite_store.h"

namespace fleetfs::lease {

struct StoreUrl {
  enum class Scheme { kSqlite };
  Scheme scheme = Scheme::kSqlite;
  std::string path;  // sqlite: the control database's absolute path
};

// Checks a URL without touching anything.
Result<StoreUrl> ParseStoreUrl(std::string_view url);

// Opens the store a URL names. `clock` must outlive the store.
Result<std::unique_ptr<OwnershipStore>> OpenStore(std::string_view url, const WallClock& clock,
                                                  SqliteStore::Access access);

}  // namespace fleetfs::lease
