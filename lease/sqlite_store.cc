#include "lease/sqlite_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

namespace fleetfs::lease {
namespace {

// "flfs": marks a control database as fleetfs's own.
constexpr int kApplicationId = 0x666c6673;
// 1: expiries on the wall clock (lease_expires_ms). 2: expiries on the boot
// clock with the boot id beside each row. A fleetfs that knows only 1 refuses
// a file of 2 ("newer than this fleetfs knows"), which keeps it from reading
// boot times as wall times. 3: offers (a release to one named owner, who alone
// may claim for a window); a fleetfs that knows only 2 would claim over them.
constexpr int kSchemaVersion = 3;
// A live lease of schema 1 keeps at most this much of what it had left when
// it is migrated: the longest ttl (a wall clock set back could otherwise
// make it last for ever).
constexpr std::int64_t kMaxMigratedLeaseMs = 3'600'000;

constexpr const char* kSchemaSql = R"sql(
CREATE TABLE fleetfs_slot_owners (
    range_start      INTEGER NOT NULL CHECK (range_start BETWEEN 0 AND 16383),
    range_end        INTEGER NOT NULL CHECK (range_end BETWEEN range_start AND 16383),
    owner_id         TEXT    NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 128),
    epoch            INTEGER NOT NULL UNIQUE CHECK (epoch > 0),
    lease_expires_boot_ms INTEGER NOT NULL,  -- CLOCK_BOOTTIME of lease_boot_id, in ms
    lease_boot_id    TEXT    NOT NULL,
    offered_to       TEXT    CHECK (offered_to IS NULL OR length(offered_to) BETWEEN 1 AND 128),
    offer_expires_boot_ms INTEGER NOT NULL DEFAULT 0,  -- same boot as the lease's
    PRIMARY KEY (range_start, range_end)
);
CREATE TABLE fleetfs_epoch_counter (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL CHECK (last >= 0)
);
INSERT INTO fleetfs_epoch_counter (id, last) VALUES (1, 0);
)sql";

struct StatementDeleter {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};
using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

struct DbDeleter {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbDeleter>;

// A SQLite result code becomes a Status here, and only here.
Status SqliteStatus(const std::string& path, sqlite3* db, int rc, std::string_view doing) {
  const int primary = rc & 0xff;
  const std::string detail = std::string(doing) + ": " +
                             (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  const std::string where = "control database " + path;
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Unavailable(where + ": " + detail +
                         "; another process held its write lock past the busy timeout");
    case SQLITE_NOTADB:
      return DataLoss(where + ": " + detail +
                      "; the file is not a SQLite database, so it cannot be a control database");
    case SQLITE_CORRUPT:
      return DataLoss(where + ": " + detail + "; the database is corrupt");
    case SQLITE_CANTOPEN:
      return Unavailable(where + ": " + detail +
                         "; the file and its directory must exist and be writable");
    case SQLITE_FULL:
      return Status(Code::kIoError, where + ": " + detail + "; the disk is full");
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return Status(Code::kIoError, where + ": " + detail + "; it must be writable");
    default:
      return Status(Code::kIoError, where + ": " + detail);
  }
}

}  // namespace

struct SqliteStore::Connection {
  Db db;
  // This connection's PRAGMA synchronous, which SQLite lets change only
  // outside a transaction.
  Durability durability = Durability::kSynced;
  // The busy handler's state: when this wait for the write lock began.
  std::chrono::steady_clock::time_point waiting_since{};
  Millis busy_timeout{};
  std::minstd_rand jitter{std::random_device{}()};
};

namespace {

// Retries every 0.2-2 ms until the busy timeout. SQLite's default handler
// backs off to 100 ms sleeps, so a long waiter keeps losing the lock to
// newcomers that retry after 1 ms (seen: 3.7 s waits with 8 racing
// processes); short jittered retries keep every waiter in the race.
int RetryUntilTimeout(void* arg, int attempt) {
  auto* connection = static_cast<SqliteStore::Connection*>(arg);
  const auto now = std::chrono::steady_clock::now();
  if (attempt == 0) connection->waiting_since = now;
  if (now - connection->waiting_since >= connection->busy_timeout) return 0;
  std::uniform_int_distribution<int> micros(200, 2000);
  std::this_thread::sleep_for(std::chrono::microseconds(micros(connection->jitter)));
  return 1;
}

}  // namespace

namespace {

class Sql {
 public:
  Sql(const std::string& path, sqlite3* db) : path_(path), db_(db) {}

  Status Exec(const char* sql, std::string_view doing) {
    char* error = nullptr;
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &error);
    sqlite3_free(error);
    if (rc != SQLITE_OK) return SqliteStatus(path_, db_, rc, doing);
    return Status::Ok();
  }

  Result<Statement> Prepare(const char* sql) {
    sqlite3_stmt* raw = nullptr;
    const int rc = sqlite3_prepare_v2(db_, sql, -1, &raw, nullptr);
    Statement statement(raw);
    if (rc != SQLITE_OK) return SqliteStatus(path_, db_, rc, "preparing a query");
    return statement;
  }

  // Runs a statement that returns one integer row.
  Result<std::int64_t> Integer(const char* sql, std::string_view doing) {
    FLEETFS_ASSIGN_OR_RETURN(Statement statement, Prepare(sql));
    const int rc = sqlite3_step(statement.get());
    if (rc != SQLITE_ROW) return SqliteStatus(path_, db_, rc, doing);
    return sqlite3_column_int64(statement.get(), 0);
  }

  // Runs a statement to its end.
  Status Done(sqlite3_stmt* statement, std::string_view doing) {
    const int rc = sqlite3_step(statement);
    if (rc != SQLITE_DONE) return SqliteStatus(path_, db_, rc, doing);
    return Status::Ok();
  }

  Status Error(int rc, std::string_view doing) { return SqliteStatus(path_, db_, rc, doing); }

  void Rollback() { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }

 private:
  const std::string& path_;
  sqlite3* db_;
};

// Owns one transaction: rolled back when it goes out of scope uncommitted, so
// no early return leaves a connection inside a transaction.
class Transaction {
 public:
  explicit Transaction(Sql& sql) : sql_(sql) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    if (open_) sql_.Rollback();
  }

  // `begin` is "BEGIN" (a read) or "BEGIN IMMEDIATE" (a decision).
  Status Begin(const char* begin, std::string_view doing) {
    Status status = sql_.Exec(begin, doing);
    open_ = status.ok();
    return status;
  }
  Status Commit(std::string_view doing) {
    Status status = sql_.Exec("COMMIT", doing);
    open_ = !status.ok();  // a failed COMMIT leaves it open: roll it back
    return status;
  }

 private:
  Sql& sql_;
  bool open_ = false;
};

// What a transaction finds in the file.
struct Schema {
  bool fresh = false;  // an empty database: no fleetfs schema yet
  std::int64_t version = 0;
};

// OK for a fresh (empty) database or one with fleetfs's schema of this
// version or an older one; DataLoss for another application's database.
Result<Schema> CheckSchema(const std::string& path, Sql& sql) {
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t app, sql.Integer("PRAGMA application_id", "reading its id"));
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t tables,
                           sql.Integer("SELECT count(*) FROM sqlite_schema", "reading its schema"));
  if (app == 0 && tables == 0) return Schema{true, 0};
  if (app != kApplicationId) {
    return DataLoss("control database " + path +
                    ": a SQLite database of another application (no fleetfs application id); "
                    "a control database holds only fleetfs's tables, so it is left unchanged");
  }
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t version,
                           sql.Integer("PRAGMA user_version", "reading its schema version"));
  if (version > kSchemaVersion) {
    return Status(Code::kFailedPrecondition,
                  "control database " + path + ": schema version " + std::to_string(version) +
                      " is newer than this fleetfs knows (" + std::to_string(kSchemaVersion) +
                      "); upgrade fleetfs");
  }
  if (version < 1) {
    return DataLoss("control database " + path + ": fleetfs's id with schema version " +
                    std::to_string(version) + ", which no fleetfs ever wrote");
  }
  return Schema{false, version};
}

// The moment a decision or a read is made, on the store's clocks.
struct StoreNow {
  BootMs boot_ms = 0;
  std::string boot_id;
  WallMs wall_ms = 0;  // only to carry schema 1's wall-clock expiries over
};

StoreNow NowOf(const BootClock& boot, const WallClock& wall) {
  return StoreNow{boot.NowMs(), boot.BootId(), wall.NowMs()};
}

// A schema-1 expiry (wall ms) on this boot's clock: what was left of it, at
// most kMaxMigratedLeaseMs; 0 (lapsed) when nothing was left. A fleetfs of
// schema 1 may still be serving that lease while this one upgrades.
BootMs FromWallExpiry(WallMs expires, const StoreNow& now) {
  if (expires <= now.wall_ms) return 0;
  return now.boot_ms + std::min<std::int64_t>(expires - now.wall_ms, kMaxMigratedLeaseMs);
}

// The table in the frame of this boot's clock. A row of another boot has
// ended (that boot's processes are gone): it loads lapsed (expiry 0), keeping
// its owner and epoch, so the counter and epochs never go back.
Result<OwnershipTable> LoadTable(const std::string& path, Sql& sql, const Schema& schema,
                                 const StoreNow& now) {
  if (schema.fresh) return OwnershipTable();
  const bool wall_expiries = schema.version == 1;
  FLEETFS_ASSIGN_OR_RETURN(
      Statement rows,
      sql.Prepare(wall_expiries
                      ? "SELECT range_start, range_end, owner_id, epoch, lease_expires_ms, '', "
                        "NULL, 0 FROM fleetfs_slot_owners"
                  : schema.version == 2
                      ? "SELECT range_start, range_end, owner_id, epoch, lease_expires_boot_ms, "
                        "lease_boot_id, NULL, 0 FROM fleetfs_slot_owners"
                      : "SELECT range_start, range_end, owner_id, epoch, lease_expires_boot_ms, "
                        "lease_boot_id, offered_to, offer_expires_boot_ms "
                        "FROM fleetfs_slot_owners"));
  std::vector<OwnershipRow> loaded;
  int rc;
  while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
    const auto column_text = [&](int i) {
      const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(rows.get(), i));
      return std::string(text ? text : "", sqlite3_column_bytes(rows.get(), i));
    };
    auto range = SlotRange::Make(static_cast<int>(sqlite3_column_int64(rows.get(), 0)),
                                 static_cast<int>(sqlite3_column_int64(rows.get(), 1)));
    auto owner = OwnerId::Make(column_text(2));
    const std::int64_t epoch = sqlite3_column_int64(rows.get(), 3);
    if (!range.ok() || !owner.ok() || epoch <= 0) {
      const Status& why = !range.ok() ? range.status() : owner.status();
      return DataLoss("control database " + path + ": a row of fleetfs_slot_owners is invalid: " +
                      (why.ok() ? "epoch " + std::to_string(epoch) + " is not positive"
                                : why.message()));
    }
    const std::int64_t stored = sqlite3_column_int64(rows.get(), 4);
    BootMs expires = 0;
    BootMs offer_expires = 0;
    const bool this_boot = !wall_expiries && column_text(5) == now.boot_id;
    if (wall_expiries) {
      expires = FromWallExpiry(stored, now);
    } else if (this_boot) {
      expires = stored;
      offer_expires = sqlite3_column_int64(rows.get(), 7);
    }
    OwnershipRow row{*range, *owner, Epoch(static_cast<std::uint64_t>(epoch)), expires};
    if (sqlite3_column_type(rows.get(), 6) != SQLITE_NULL) {
      auto to = OwnerId::Make(column_text(6));
      if (!to.ok()) {
        return DataLoss("control database " + path + ": the offer of row " + range->ToString() +
                        " is invalid: " + to.status().message());
      }
      // An offer of another boot has ended with its lease.
      row.offered_to = *to;
      row.offer_expires_ms = offer_expires;
    }
    loaded.push_back(std::move(row));
  }
  if (rc != SQLITE_DONE) return sql.Error(rc, "reading the ownership rows");
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t last,
                           sql.Integer("SELECT last FROM fleetfs_epoch_counter WHERE id = 1",
                                       "reading the epoch counter"));
  auto table = OwnershipTable::FromParts(std::move(loaded), static_cast<std::uint64_t>(last));
  if (!table.ok()) return table.status().WithContext("control database " + path);
  return table;
}

void BindRow(sqlite3_stmt* statement, const OwnershipRow& row, const std::string& boot_id) {
  sqlite3_bind_int(statement, 1, row.range.first());
  sqlite3_bind_int(statement, 2, row.range.last());
  sqlite3_bind_text(statement, 3, row.owner.str().data(), static_cast<int>(row.owner.str().size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_int64(statement, 4, static_cast<sqlite3_int64>(row.epoch.value()));
  sqlite3_bind_int64(statement, 5, row.lease_expires_ms);
  sqlite3_bind_text(statement, 6, boot_id.data(), static_cast<int>(boot_id.size()),
                    SQLITE_TRANSIENT);
  if (row.offered_to) {
    sqlite3_bind_text(statement, 7, row.offered_to->str().data(),
                      static_cast<int>(row.offered_to->str().size()), SQLITE_TRANSIENT);
  } else {
    sqlite3_bind_null(statement, 7);
  }
  sqlite3_bind_int64(statement, 8, row.offered_to ? row.offer_expires_ms : 0);
}

constexpr const char* kUpsertSql =
    "INSERT INTO fleetfs_slot_owners "
    "(range_start, range_end, owner_id, epoch, lease_expires_boot_ms, lease_boot_id, "
    "offered_to, offer_expires_boot_ms) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (range_start, range_end) DO UPDATE SET "
    "owner_id = excluded.owner_id, epoch = excluded.epoch, "
    "lease_expires_boot_ms = excluded.lease_expires_boot_ms, "
    "lease_boot_id = excluded.lease_boot_id, offered_to = excluded.offered_to, "
    "offer_expires_boot_ms = excluded.offer_expires_boot_ms";

// Writes the rows of `after` that differ from `before`, and the counter. A
// written row's expiry is on this boot's clock, so it carries this boot's id.
Status StoreChanges(Sql& sql, const OwnershipTable& before, const OwnershipTable& after,
                    const std::string& boot_id) {
  FLEETFS_ASSIGN_OR_RETURN(
      Statement remove,
      sql.Prepare("DELETE FROM fleetfs_slot_owners WHERE range_start = ?1 AND range_end = ?2"));
  for (const auto& old : before.rows()) {
    const bool kept = std::any_of(after.rows().begin(), after.rows().end(),
                                  [&](const OwnershipRow& row) { return row.range == old.range; });
    if (kept) continue;
    sqlite3_reset(remove.get());
    sqlite3_bind_int(remove.get(), 1, old.range.first());
    sqlite3_bind_int(remove.get(), 2, old.range.last());
    FLEETFS_RETURN_IF_ERROR(sql.Done(remove.get(), "deleting a replaced row"));
  }
  // An upsert, not INSERT OR REPLACE: a repeated epoch must fail loudly, not
  // silently delete the row that holds it.
  FLEETFS_ASSIGN_OR_RETURN(Statement upsert, sql.Prepare(kUpsertSql));
  for (const auto& row : after.rows()) {
    const bool unchanged =
        std::find(before.rows().begin(), before.rows().end(), row) != before.rows().end();
    if (unchanged) continue;
    sqlite3_reset(upsert.get());
    BindRow(upsert.get(), row, boot_id);
    FLEETFS_RETURN_IF_ERROR(sql.Done(upsert.get(), "writing an ownership row"));
  }
  if (after.last_epoch() != before.last_epoch()) {
    FLEETFS_ASSIGN_OR_RETURN(Statement counter,
                             sql.Prepare("UPDATE fleetfs_epoch_counter SET last = ?1 WHERE id = 1"));
    sqlite3_bind_int64(counter.get(), 1, static_cast<sqlite3_int64>(after.last_epoch().value()));
    FLEETFS_RETURN_IF_ERROR(sql.Done(counter.get(), "writing the epoch counter"));
  }
  return Status::Ok();
}

// Schema 1 to 2, inside the caller's write transaction: the expiry column
// becomes the boot clock's, each row gets this boot's id, and a lease still
// live on the wall clock keeps what it had left (FromWallExpiry). Rows,
// epochs and the counter are kept as they are. All of it commits or none.
Status MigrateFromWallClock(Sql& sql, const StoreNow& now) {
  FLEETFS_ASSIGN_OR_RETURN(Statement rows,
                           sql.Prepare("SELECT range_start, range_end, lease_expires_ms "
                                       "FROM fleetfs_slot_owners"));
  struct Expiry {
    int first, last;
    BootMs expires;
  };
  std::vector<Expiry> expiries;
  int rc;
  while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
    expiries.push_back({sqlite3_column_int(rows.get(), 0), sqlite3_column_int(rows.get(), 1),
                        FromWallExpiry(sqlite3_column_int64(rows.get(), 2), now)});
  }
  if (rc != SQLITE_DONE) return sql.Error(rc, "reading the rows to migrate");
  rows.reset();
  FLEETFS_RETURN_IF_ERROR(
      sql.Exec("ALTER TABLE fleetfs_slot_owners "
               "RENAME COLUMN lease_expires_ms TO lease_expires_boot_ms; "
               "ALTER TABLE fleetfs_slot_owners "
               "ADD COLUMN lease_boot_id TEXT NOT NULL DEFAULT ''",
               "migrating the schema from wall-clock to boot-clock expiries"));
  FLEETFS_ASSIGN_OR_RETURN(
      Statement update,
      sql.Prepare("UPDATE fleetfs_slot_owners SET lease_expires_boot_ms = ?3, lease_boot_id = ?4 "
                  "WHERE range_start = ?1 AND range_end = ?2"));
  for (const Expiry& e : expiries) {
    sqlite3_reset(update.get());
    sqlite3_bind_int(update.get(), 1, e.first);
    sqlite3_bind_int(update.get(), 2, e.last);
    sqlite3_bind_int64(update.get(), 3, e.expires);
    sqlite3_bind_text(update.get(), 4, now.boot_id.data(), static_cast<int>(now.boot_id.size()),
                      SQLITE_TRANSIENT);
    FLEETFS_RETURN_IF_ERROR(sql.Done(update.get(), "migrating a row to the boot clock"));
  }
  return sql.Exec("PRAGMA user_version = 2", "marking the migrated schema");
}

// Schema 2 to 3, inside the caller's write transaction: rows gain an offer
// (none). Everything else is kept as it is.
Status AddOffers(Sql& sql) {
  FLEETFS_RETURN_IF_ERROR(
      sql.Exec("ALTER TABLE fleetfs_slot_owners ADD COLUMN offered_to TEXT "
               "CHECK (offered_to IS NULL OR length(offered_to) BETWEEN 1 AND 128); "
               "ALTER TABLE fleetfs_slot_owners "
               "ADD COLUMN offer_expires_boot_ms INTEGER NOT NULL DEFAULT 0",
               "migrating the schema: rows gain offers"));
  return sql.Exec(("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str(),
                  "marking the migrated schema");
}

}  // namespace

SqliteStore::SqliteStore(std::string path, const WallClock& wall, const BootClock& boot,
                         std::unique_ptr<BootClock> owned_boot, Options options)
    : path_(std::move(path)),
      wall_(wall),
      owned_boot_(std::move(owned_boot)),
      boot_(boot),
      options_(options) {}

SqliteStore::~SqliteStore() = default;

Result<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                       const WallClock& wall, Options options) {
  if (path.empty() || path.front() != '/') {
    return InvalidArgument("control database '" + path + "': the path must be absolute");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || options.access == Access::kExisting) {
      return Status(errno == ENOENT ? Code::kNotFound : Code::kIoError,
                    "control database " + path + ": " + std::strerror(errno) +
                        (errno == ENOENT ? "; claim a range first to create it" : ""));
    }
  } else if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("control database " + path + ": not a regular file");
  }
  std::unique_ptr<BootClock> owned_boot;
  if (options.boot == nullptr) {
    FLEETFS_ASSIGN_OR_RETURN(owned_boot, SystemBootClock::Make());
  }
  const BootClock& boot = options.boot != nullptr ? *options.boot : *owned_boot;
  std::unique_ptr<SqliteStore> store(
      new SqliteStore(path, wall, boot, std::move(owned_boot), options));
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, store->Acquire());
  Sql sql(path, connection->db.get());
  {
    // Read-only first: another application's database must not be touched,
    // not even by the switch to WAL mode below.
    Transaction read(sql);
    FLEETFS_RETURN_IF_ERROR(read.Begin("BEGIN", "starting a read"));
    FLEETFS_RETURN_IF_ERROR(CheckSchema(path, sql).status());
    FLEETFS_RETURN_IF_ERROR(read.Commit("ending the read"));
  }
  if (options.access == Access::kCreate) {
    // Outside a transaction: SQLite changes the journal mode only there.
    FLEETFS_ASSIGN_OR_RETURN(Statement mode, sql.Prepare("PRAGMA journal_mode=WAL"));
    const int rc = sqlite3_step(mode.get());
    if (rc != SQLITE_ROW) return sql.Error(rc, "switching to WAL mode");
    const std::string got = reinterpret_cast<const char*>(sqlite3_column_text(mode.get(), 0));
    if (got != "wal") {
      return Unavailable("control database " + path + ": could not switch to WAL mode (got " +
                         got + ")");
    }
    mode.reset();
    Transaction write(sql);
    FLEETFS_RETURN_IF_ERROR(write.Begin("BEGIN IMMEDIATE", "taking the write lock"));
    FLEETFS_ASSIGN_OR_RETURN(const Schema schema, CheckSchema(path, sql));
    if (schema.fresh) {
      FLEETFS_RETURN_IF_ERROR(sql.Exec(kSchemaSql, "creating the schema"));
      FLEETFS_RETURN_IF_ERROR(
          sql.Exec(("PRAGMA application_id = " + std::to_string(kApplicationId) +
                    "; PRAGMA user_version = " + std::to_string(kSchemaVersion))
                       .c_str(),
                   "marking the schema"));
    } else {
      if (schema.version == 1) {
        FLEETFS_RETURN_IF_ERROR(MigrateFromWallClock(sql, NowOf(boot, wall)));
      }
      if (schema.version <= 2) FLEETFS_RETURN_IF_ERROR(AddOffers(sql));
    }
    FLEETFS_RETURN_IF_ERROR(write.Commit("committing the schema"));
  }
  store->Return(std::move(connection));
  return store;
}

Result<SqliteStore::ConnectionPtr> SqliteStore::Acquire() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      ConnectionPtr connection = std::move(idle_.back());
      idle_.pop_back();
      return connection;
    }
  }
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
                    (options_.access == Access::kCreate ? SQLITE_OPEN_CREATE : 0);
  const int rc = sqlite3_open_v2(path_.c_str(), &raw, flags,
                                 options_.vfs.empty() ? nullptr : options_.vfs.c_str());
  Db db(raw);
  if (rc != SQLITE_OK) return SqliteStatus(path_, db.get(), rc, "opening");
  sqlite3_extended_result_codes(db.get(), 1);
  auto connection = std::make_unique<Connection>();
  connection->busy_timeout = options_.busy_timeout;
  sqlite3_busy_handler(db.get(), RetryUntilTimeout, connection.get());
  // FULL until a decision says otherwise: Open writes the schema and
  // migrates it on the first connection.
  Sql sql(path_, db.get());
  FLEETFS_RETURN_IF_ERROR(sql.Exec("PRAGMA synchronous=FULL", "setting synchronous=FULL"));
  connection->db = std::move(db);
  return connection;
}

void SqliteStore::Return(ConnectionPtr connection) {
  std::lock_guard lock(mu_);
  idle_.push_back(std::move(connection));
}

template <typename T, typename DecideFn>
Result<T> SqliteStore::Decide(Durability durability, DecideFn&& decide) {
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, Acquire());
  Sql sql(path_, connection->db.get());
  std::optional<Result<T>> answer;
  const Status status = [&]() -> Status {
    if (connection->durability != durability) {
      FLEETFS_RETURN_IF_ERROR(sql.Exec(durability == Durability::kSynced
                                           ? "PRAGMA synchronous=FULL"
                                           : "PRAGMA synchronous=NORMAL",
                                       "setting the decision's synchronous mode"));
      connection->durability = durability;
    }
    Transaction transaction(sql);
    FLEETFS_RETURN_IF_ERROR(transaction.Begin("BEGIN IMMEDIATE", "taking the write lock"));
    // Read after the lock: decisions are then ordered in time as in the table.
    const StoreNow now = NowOf(boot_, wall_);
    FLEETFS_ASSIGN_OR_RETURN(const Schema schema, CheckSchema(path_, sql));
    if (schema.fresh) {
      return Status(Code::kFailedPrecondition,
                    "control database " + path_ + ": it has no fleetfs schema yet");
    }
    if (schema.version != kSchemaVersion) {
      // Only a store opened kCreate migrates, and only it decides.
      return Status(Code::kFailedPrecondition,
                    "control database " + path_ + ": schema version " +
                        std::to_string(schema.version) +
                        (schema.version == 1 ? " has wall-clock expiries"
                                             : " keeps no offers (this fleetfs's is " +
                                                   std::to_string(kSchemaVersion) + ")") +
                        "; a claim or an agent migrates it first");
    }
    FLEETFS_ASSIGN_OR_RETURN(const OwnershipTable before, LoadTable(path_, sql, schema, now));
    OwnershipTable after = before;
    answer.emplace(decide(after, now.boot_ms));
    // A refused decision (an exhausted counter) writes nothing.
    if (answer->ok() && !(after == before)) {
      FLEETFS_RETURN_IF_ERROR(StoreChanges(sql, before, after, now.boot_id));
    }
    return transaction.Commit("committing the decision");
  }();
  // A connection whose last transaction failed is not reused.
  if (!status.ok()) return status;
  Return(std::move(connection));
  return std::move(*answer);
}

// A claim is synced: it may take a new epoch from the counter (and give a
// slot to another owner), and a claim lost to a crash after it was answered
// would let the counter go back and grant that epoch a second time.
Result<Decision> SqliteStore::Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                                    std::uint64_t floor) {
  return Decide<Decision>(Durability::kSynced, [&](OwnershipTable& table, BootMs now) {
    return table.Claim(range, owner, now, ttl, floor);
  });
}

// A renewal and a release (the agent's, or `fleetfs lease renew|release`)
// are not synced (synchronous=NORMAL), so a disk that stalls its syncs does
// not hold up every renewal (seen: 1.3 s per fdatasync beside fsync-heavy
// writers, past the 1 s a call has at a 3 s ttl). Why nothing is lost that
// any decision relies on:
// - Each writes only the expiry (and boot id) of the one row that stays
//   (range, owner, epoch): no epoch is granted, the counter does not move, no
//   owner or bounds change.
// - An unsynced COMMIT is in the WAL file, in the OS's page cache: every
//   connection of this host reads it at once, and a crash of the process
//   loses nothing. Only an OS crash or a power loss can lose it.
// - Either is a reboot, and the next boot has a new boot id: every row of the
//   old boot loads lapsed (LoadTable), whatever expiry it holds, and every
//   process that served under it is gone. So a lost renewal or release (the
//   row back to its earlier expiry, or to an earlier boot's id, not the next
//   boot's either) leaves every row as the next boot would load it anyway.
// - The WAL is appended in commit order and recovered as a prefix (frame
//   checksums chain), and a synced COMMIT syncs the whole file: a claim
//   answered after a release (a handover) keeps that release, and no
//   answered claim is lost for the unsynced commits before it.
// Assumed: the database is on a local disk whose unsynced writes are lost
// only with the OS. A write error in writeback (which only an fsync would
// report), or a block device or network file system that drops written
// data and reconnects while the OS runs on, could undo an answered renewal
// with the boot id unchanged; a renewal would then have to be bounded by a
// sync done off its path (not done; the README states the assumption).
// Not avoided: the COMMIT that brings the WAL to its autocheckpoint size
// (1000 pages; a renewal writes 2, so once in some 500 renewals) checkpoints,
// which syncs the WAL and the database file, and the first COMMIT after it
// restarts the WAL and syncs its header. Those two renewals in 500 can still stall on
// a busy disk; taking the checkpoint off them would let the WAL grow without
// bound while only renewals run.
Result<Decision> SqliteStore::Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                                    Millis ttl) {
  return Decide<Decision>(Durability::kUnsynced,
                          [&](OwnershipTable& table, BootMs now) -> Result<Decision> {
                            return table.Renew(range, owner, epoch, now, ttl);
                          });
}

Result<bool> SqliteStore::Release(SlotRange range, const OwnerId& owner, Epoch epoch) {
  return Decide<bool>(Durability::kUnsynced,
                      [&](OwnershipTable& table, BootMs now) -> Result<bool> {
                        return table.Release(range, owner, epoch, now);
                      });
}

// Unsynced, as a release: it writes only the one row that stays (range,
// owner, epoch), its expiry and its offer; an OS crash that loses it is a
// reboot, after which every row of this boot loads lapsed and its offer
// ended anyway.
Result<bool> SqliteStore::Offer(SlotRange range, const OwnerId& owner, Epoch epoch,
                                const OwnerId& to, Millis window) {
  return Decide<bool>(Durability::kUnsynced,
                      [&](OwnershipTable& table, BootMs now) -> Result<bool> {
                        return table.Offer(range, owner, epoch, now, to, window);
                      });
}

Result<OwnershipTable> SqliteStore::Read() {
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, Acquire());
  Sql sql(path_, connection->db.get());
  std::optional<OwnershipTable> table;
  const Status status = [&]() -> Status {
    Transaction transaction(sql);
    FLEETFS_RETURN_IF_ERROR(transaction.Begin("BEGIN", "starting a read"));
    FLEETFS_ASSIGN_OR_RETURN(const Schema schema, CheckSchema(path_, sql));
    FLEETFS_ASSIGN_OR_RETURN(table, LoadTable(path_, sql, schema, NowOf(boot_, wall_)));
    return transaction.Commit("ending the read");
  }();
  if (!status.ok()) return status;
  Return(std::move(connection));
  return std::move(*table);
}

}  // namespace fleetfs::lease

namespace fleetfs::lease {

WallMs SqliteStore::ToWallMs(BootMs store_ms) const {
  const WallMs offset = wall_.NowMs() - boot_.NowMs();
  // Saturates: a lease that never ends (INT64_MAX) must not wrap into the past.
  if (offset > 0 && store_ms > INT64_MAX - offset) return INT64_MAX;
  if (offset < 0 && store_ms < INT64_MIN - offset) return INT64_MIN;
  return store_ms + offset;
}

}  // namespace fleetfs::lease
