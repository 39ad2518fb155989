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
constexpr int kSchemaVersion = 1;

constexpr const char* kSchemaSql = R"sql(
CREATE TABLE fleetfs_slot_owners (
    range_start      INTEGER NOT NULL CHECK (range_start BETWEEN 0 AND 16383),
    range_end        INTEGER NOT NULL CHECK (range_end BETWEEN range_start AND 16383),
    owner_id         TEXT    NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 128),
    epoch            INTEGER NOT NULL UNIQUE CHECK (epoch > 0),
    lease_expires_ms INTEGER NOT NULL,
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

// OK for a fresh (empty) database, setting *fresh, or for one with fleetfs's
// schema; DataLoss for another application's database.
Status CheckSchema(const std::string& path, Sql& sql, bool* fresh) {
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t app, sql.Integer("PRAGMA application_id", "reading its id"));
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t tables,
                           sql.Integer("SELECT count(*) FROM sqlite_schema", "reading its schema"));
  *fresh = false;
  if (app == 0 && tables == 0) {
    *fresh = true;
    return Status::Ok();
  }
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
  return Status::Ok();
}

Result<OwnershipTable> LoadTable(const std::string& path, Sql& sql, bool fresh) {
  if (fresh) return OwnershipTable();
  FLEETFS_ASSIGN_OR_RETURN(
      Statement rows,
      sql.Prepare("SELECT range_start, range_end, owner_id, epoch, lease_expires_ms "
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
    loaded.push_back(OwnershipRow{*range, *owner, Epoch(static_cast<std::uint64_t>(epoch)),
                                  sqlite3_column_int64(rows.get(), 4)});
  }
  if (rc != SQLITE_DONE) return sql.Error(rc, "reading the ownership rows");
  FLEETFS_ASSIGN_OR_RETURN(std::int64_t last,
                           sql.Integer("SELECT last FROM fleetfs_epoch_counter WHERE id = 1",
                                       "reading the epoch counter"));
  auto table = OwnershipTable::FromParts(std::move(loaded), static_cast<std::uint64_t>(last));
  if (!table.ok()) return table.status().WithContext("control database " + path);
  return table;
}

// Writes the rows of `after` that differ from `before`, and the counter.
Status StoreChanges(Sql& sql, const OwnershipTable& before, const OwnershipTable& after) {
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
  FLEETFS_ASSIGN_OR_RETURN(
      Statement upsert,
      sql.Prepare("INSERT INTO fleetfs_slot_owners "
                  "(range_start, range_end, owner_id, epoch, lease_expires_ms) "
                  "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (range_start, range_end) DO UPDATE SET "
                  "owner_id = excluded.owner_id, epoch = excluded.epoch, "
                  "lease_expires_ms = excluded.lease_expires_ms"));
  for (const auto& row : after.rows()) {
    const bool unchanged =
        std::find(before.rows().begin(), before.rows().end(), row) != before.rows().end();
    if (unchanged) continue;
    sqlite3_reset(upsert.get());
    sqlite3_bind_int(upsert.get(), 1, row.range.first());
    sqlite3_bind_int(upsert.get(), 2, row.range.last());
    sqlite3_bind_text(upsert.get(), 3, row.owner.str().data(),
                      static_cast<int>(row.owner.str().size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(upsert.get(), 4, static_cast<sqlite3_int64>(row.epoch.value()));
    sqlite3_bind_int64(upsert.get(), 5, row.lease_expires_ms);
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

}  // namespace

SqliteStore::SqliteStore(std::string path, const WallClock& clock, Options options)
    : path_(std::move(path)), clock_(clock), options_(options) {}

SqliteStore::~SqliteStore() = default;

Result<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                       const WallClock& clock, Options options) {
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
  std::unique_ptr<SqliteStore> store(new SqliteStore(path, clock, options));
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, store->Acquire());
  Sql sql(path, connection->db.get());
  {
    // Read-only first: another application's database must not be touched,
    // not even by the switch to WAL mode below.
    Transaction read(sql);
    FLEETFS_RETURN_IF_ERROR(read.Begin("BEGIN", "starting a read"));
    bool fresh = false;
    FLEETFS_RETURN_IF_ERROR(CheckSchema(path, sql, &fresh));
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
    bool fresh = false;
    FLEETFS_RETURN_IF_ERROR(CheckSchema(path, sql, &fresh));
    if (fresh) {
      FLEETFS_RETURN_IF_ERROR(sql.Exec(kSchemaSql, "creating the schema"));
      FLEETFS_RETURN_IF_ERROR(
          sql.Exec(("PRAGMA application_id = " + std::to_string(kApplicationId) +
                    "; PRAGMA user_version = " + std::to_string(kSchemaVersion))
                       .c_str(),
                   "marking the schema"));
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
  const int rc = sqlite3_open_v2(path_.c_str(), &raw, flags, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) return SqliteStatus(path_, db.get(), rc, "opening");
  sqlite3_extended_result_codes(db.get(), 1);
  auto connection = std::make_unique<Connection>();
  connection->busy_timeout = options_.busy_timeout;
  sqlite3_busy_handler(db.get(), RetryUntilTimeout, connection.get());
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
Result<T> SqliteStore::Decide(DecideFn&& decide) {
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, Acquire());
  Sql sql(path_, connection->db.get());
  std::optional<Result<T>> answer;
  const Status status = [&]() -> Status {
    Transaction transaction(sql);
    FLEETFS_RETURN_IF_ERROR(transaction.Begin("BEGIN IMMEDIATE", "taking the write lock"));
    // Read after the lock: decisions are then ordered in time as in the table.
    const WallMs now = clock_.NowMs();
    bool fresh = false;
    FLEETFS_RETURN_IF_ERROR(CheckSchema(path_, sql, &fresh));
    if (fresh) {
      return Status(Code::kFailedPrecondition,
                    "control database " + path_ + ": it has no fleetfs schema yet");
    }
    FLEETFS_ASSIGN_OR_RETURN(const OwnershipTable before, LoadTable(path_, sql, fresh));
    OwnershipTable after = before;
    answer.emplace(decide(after, now));
    // A refused decision (an exhausted counter) writes nothing.
    if (answer->ok() && !(after == before)) {
      FLEETFS_RETURN_IF_ERROR(StoreChanges(sql, before, after));
    }
    return transaction.Commit("committing the decision");
  }();
  // A connection whose last transaction failed is not reused.
  if (!status.ok()) return status;
  Return(std::move(connection));
  return std::move(*answer);
}

Result<Decision> SqliteStore::Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                                    std::uint64_t floor) {
  return Decide<Decision>([&](OwnershipTable& table, WallMs now) {
    return table.Claim(range, owner, now, ttl, floor);
  });
}

Result<Decision> SqliteStore::Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                                    Millis ttl) {
  return Decide<Decision>([&](OwnershipTable& table, WallMs now) -> Result<Decision> {
    return table.Renew(range, owner, epoch, now, ttl);
  });
}

Result<bool> SqliteStore::Release(SlotRange range, const OwnerId& owner, Epoch epoch) {
  return Decide<bool>([&](OwnershipTable& table, WallMs now) -> Result<bool> {
    return table.Release(range, owner, epoch, now);
  });
}

Result<OwnershipTable> SqliteStore::Read() {
  FLEETFS_ASSIGN_OR_RETURN(ConnectionPtr connection, Acquire());
  Sql sql(path_, connection->db.get());
  std::optional<OwnershipTable> table;
  const Status status = [&]() -> Status {
    Transaction transaction(sql);
    FLEETFS_RETURN_IF_ERROR(transaction.Begin("BEGIN", "starting a read"));
    bool fresh = false;
    FLEETFS_RETURN_IF_ERROR(CheckSchema(path_, sql, &fresh));
    FLEETFS_ASSIGN_OR_RETURN(table, LoadTable(path_, sql, fresh));
    return transaction.Commit("ending the read");
  }();
  if (!status.ok()) return status;
  Return(std::move(connection));
  return std::move(*table);
}

}  // namespace fleetfs::lease
