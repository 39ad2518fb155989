#include "lease/sqlite_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "lease/store_url.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::AsGrant;
using testing::FakeBootClock;
using testing::FakeWallClock;
using testing::Owner;
using testing::Range;
using testing::TempDir;

constexpr Millis kTtl{30'000};

// 2023-11-14: a wall time far from any boot time, so a mix-up shows.
constexpr WallMs kWallAtStart = 1'700'000'000'000;

// This host's wall and boot clocks, moving together until a test steps the
// wall clock (a `date -s`) or reboots. As a WallClock, it is the wall clock.
class FakeClocks final : public WallClock {
 public:
  explicit FakeClocks(BootMs boot_start, std::string boot_id = "boot-1")
      : wall(kWallAtStart + boot_start), boot(boot_start, std::move(boot_id)) {}
  WallMs NowMs() const override { return wall.NowMs(); }
  void Advance(Millis by) {
    wall.Advance(by);
    boot.Advance(by);
  }

  FakeWallClock wall;
  FakeBootClock boot;
};

std::unique_ptr<SqliteStore> OpenOrDie(const std::string& path, const WallClock& wall,
                                       SqliteStore::Access access = SqliteStore::Access::kCreate,
                                       const BootClock* boot = nullptr) {
  auto store = SqliteStore::Open(path, wall, {.access = access, .boot = boot});
  EXPECT_TRUE(store.ok()) << store.status().message();
  return store.ok() ? std::move(store).value() : nullptr;
}
std::unique_ptr<SqliteStore> OpenOrDie(const std::string& path, FakeClocks& clocks,
                                       SqliteStore::Access access = SqliteStore::Access::kCreate) {
  return OpenOrDie(path, clocks, access, &clocks.boot);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void RunSql(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

// A VFS over the default one that counts each file's syncs and keeps what
// each file held at its last sync: the least an OS crash or a power loss
// can leave of it (every write after a file's last sync lost).
class SyncWatchingVfs {
 public:
  static constexpr const char* kName = "fleetfs-sync-watching";

  // Registers it once (not as the default) and returns it.
  static SyncWatchingVfs& Get() {
    static SyncWatchingVfs* vfs = new SyncWatchingVfs();
    return *vfs;
  }

  // Syncs of files whose name ends with `suffix` ("" for every file) since
  // the last ResetSyncs.
  int Syncs(const std::string& suffix = "") {
    std::lock_guard lock(mu_);
    int count = 0;
    for (const auto& [name, file] : files_) {
      if (name.ends_with(suffix)) count += file.syncs;
    }
    return count;
  }
  void ResetSyncs() {
    std::lock_guard lock(mu_);
    for (auto& [name, file] : files_) file.syncs = 0;
  }

  // Writes what the control database at `from` (and its WAL) held at their
  // last syncs to `to`: the files as a crash of the OS at this moment could
  // leave them, at worst. No -shm: recovery rebuilds it from the WAL.
  void CopyAsACrashWouldLeave(const std::string& from, const std::string& to) {
    std::lock_guard lock(mu_);
    for (const std::string suffix : {"", "-wal"}) {
      const auto it = files_.find(from + suffix);
      if (it == files_.end() || !it->second.synced) continue;
      std::ofstream out(to + suffix, std::ios::binary | std::ios::trunc);
      out << *it->second.synced;
      ASSERT_TRUE(out.good()) << to + suffix;
    }
  }

 private:
  struct Watched {
    int syncs = 0;
    std::optional<std::string> synced;  // the content at the last sync
  };
  // What SQLite allocates for an open file (szOsFile): this, then the
  // default VFS's file.
  struct File {
    sqlite3_file base;
    sqlite3_file* real;
    const char* name;  // SQLite keeps it valid until xClose; null: a temp file
  };
  static_assert(sizeof(File) % 8 == 0, "the default VFS's file follows, 8-byte aligned");

  SyncWatchingVfs() {
    real_ = sqlite3_vfs_find(nullptr);
    vfs_ = *real_;  // the default's methods take only its pAppData and sizes
    vfs_.zName = kName;
    vfs_.szOsFile = static_cast<int>(sizeof(File)) + real_->szOsFile;
    vfs_.pNext = nullptr;
    vfs_.xOpen = &Open;
    io_ = {};
    io_.iVersion = 3;
    io_.xClose = [](sqlite3_file* f) {
      sqlite3_file* real = Real(f);
      return real->pMethods->xClose(real);
    };
    io_.xRead = [](sqlite3_file* f, void* buffer, int amount, sqlite3_int64 offset) {
      return Real(f)->pMethods->xRead(Real(f), buffer, amount, offset);
    };
    io_.xWrite = [](sqlite3_file* f, const void* buffer, int amount, sqlite3_int64 offset) {
      return Real(f)->pMethods->xWrite(Real(f), buffer, amount, offset);
    };
    io_.xTruncate = [](sqlite3_file* f, sqlite3_int64 size) {
      return Real(f)->pMethods->xTruncate(Real(f), size);
    };
    io_.xSync = &Sync;
    io_.xFileSize = [](sqlite3_file* f, sqlite3_int64* size) {
      return Real(f)->pMethods->xFileSize(Real(f), size);
    };
    io_.xLock = [](sqlite3_file* f, int lock) { return Real(f)->pMethods->xLock(Real(f), lock); };
    io_.xUnlock = [](sqlite3_file* f, int lock) {
      return Real(f)->pMethods->xUnlock(Real(f), lock);
    };
    io_.xCheckReservedLock = [](sqlite3_file* f, int* out) {
      return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
    };
    io_.xFileControl = [](sqlite3_file* f, int op, void* arg) {
      return Real(f)->pMethods->xFileControl(Real(f), op, arg);
    };
    io_.xSectorSize = [](sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); };
    io_.xDeviceCharacteristics = [](sqlite3_file* f) {
      return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
    };
    io_.xShmMap = [](sqlite3_file* f, int page, int size, int extend, void volatile** out) {
      return Real(f)->pMethods->xShmMap(Real(f), page, size, extend, out);
    };
    io_.xShmLock = [](sqlite3_file* f, int offset, int n, int flags) {
      return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
    };
    io_.xShmBarrier = [](sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); };
    io_.xShmUnmap = [](sqlite3_file* f, int remove) {
      return Real(f)->pMethods->xShmUnmap(Real(f), remove);
    };
    io_.xFetch = [](sqlite3_file* f, sqlite3_int64 offset, int amount, void** out) {
      return Real(f)->pMethods->xFetch(Real(f), offset, amount, out);
    };
    io_.xUnfetch = [](sqlite3_file* f, sqlite3_int64 offset, void* page) {
      return Real(f)->pMethods->xUnfetch(Real(f), offset, page);
    };
    EXPECT_EQ(sqlite3_vfs_register(&vfs_, /*makeDflt=*/0), SQLITE_OK);
  }

  static sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<File*>(f)->real; }

  static int Open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
    SyncWatchingVfs& self = Get();
    auto* file = reinterpret_cast<File*>(f);
    file->real = reinterpret_cast<sqlite3_file*>(file + 1);
    file->name = name;
    const int rc = self.real_->xOpen(self.real_, name, file->real, flags, out_flags);
    // SQLite calls xClose only on a file whose pMethods is set.
    file->base.pMethods = file->real->pMethods != nullptr ? &self.io_ : nullptr;
    return rc;
  }

  static int Sync(sqlite3_file* f, int flags) {
    auto* file = reinterpret_cast<File*>(f);
    const int rc = file->real->pMethods->xSync(file->real, flags);
    if (rc != SQLITE_OK || file->name == nullptr) return rc;
    sqlite3_int64 size = 0;
    if (file->real->pMethods->xFileSize(file->real, &size) != SQLITE_OK) return SQLITE_IOERR;
    std::string content(static_cast<std::size_t>(size), '\0');
    if (size > 0 && file->real->pMethods->xRead(file->real, content.data(), static_cast<int>(size),
                                                0) != SQLITE_OK) {
      return SQLITE_IOERR;
    }
    SyncWatchingVfs& self = Get();
    std::lock_guard lock(self.mu_);
    Watched& watched = self.files_[file->name];
    ++watched.syncs;
    watched.synced = std::move(content);
    return rc;
  }

  sqlite3_vfs* real_;
  sqlite3_vfs vfs_;
  sqlite3_io_methods io_;
  std::mutex mu_;                         // guards files_
  std::map<std::string, Watched> files_;  // by the path SQLite opened
};

TEST(SqliteStore, decisions_persist_across_reopen) {
  TempDir dir;
  FakeClocks clock(1'000'000);
  const std::string path = dir.File("control.db");
  {
    auto store = OpenOrDie(path, clock);
    const Grant grant = AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
    EXPECT_EQ(grant.epoch, Epoch(1));
    EXPECT_EQ(grant.lease_expires_ms, 1'030'000);
    clock.Advance(Millis(10'000));
    EXPECT_EQ(AsGrant(store->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl)).lease_expires_ms,
              1'040'000);
    ASSERT_TRUE(*store->Release(Range(0, 99), Owner("a"), Epoch(1)));
  }
  auto store = OpenOrDie(path, clock, SqliteStore::Access::kExisting);
  auto table = store->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 1u);
  EXPECT_EQ(table->rows()[0],
            (OwnershipRow{Range(0, 99), Owner("a"), Epoch(1), 1'010'000}));
  EXPECT_EQ(table->last_epoch(), Epoch(1));
}

TEST(SqliteStore, the_counter_survives_removed_rows) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  auto store = OpenOrDie(path, clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.Advance(kTtl);
  // A claim of another shape absorbs the lapsed row; the counter stays.
  EXPECT_EQ(AsGrant(store->Claim(Range(0, 49), Owner("b"), kTtl, 0)).epoch, Epoch(2));
  EXPECT_EQ(AsGrant(store->Claim(Range(50, 99), Owner("c"), kTtl, 0)).epoch, Epoch(3));
  EXPECT_EQ(store->Read()->last_epoch(), Epoch(3));
}

TEST(SqliteStore, a_refused_claim_names_the_holder_and_writes_nothing) {
  TempDir dir;
  FakeClocks clock(0);
  auto store = OpenOrDie(dir.File("control.db"), clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  const auto before = *store->Read();
  const auto refused = store->Claim(Range(10, 20), Owner("b"), kTtl, 0);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "a", 30'000}));
  EXPECT_EQ(*store->Read(), before);
}

TEST(SqliteStore, two_connections_racing_a_claim_get_one_owner_and_no_lock_error) {
  TempDir dir;
  SystemWallClock clock;
  const std::string path = dir.File("control.db");
  auto first = OpenOrDie(path, clock);
  auto second = OpenOrDie(path, clock);
  constexpr int kRounds = 40;
  int last_winner = -1;
  std::uint64_t last_epoch = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::barrier start(2);
    Result<Decision> answers[2] = {Internal("not run"), Internal("not run")};
    auto race = [&](int i, SqliteStore* store) {
      start.arrive_and_wait();
      answers[i] = store->Claim(Range(0, 99), Owner(i == 0 ? "a" : "b"), kTtl, 0);
    };
    std::thread a(race, 0, first.get());
    std::thread b(race, 1, second.get());
    a.join();
    b.join();
    ASSERT_TRUE(answers[0].ok()) << answers[0].status().message();
    ASSERT_TRUE(answers[1].ok()) << answers[1].status().message();
    const int granted = std::holds_alternative<Grant>(*answers[0]) +
                        std::holds_alternative<Grant>(*answers[1]);
    ASSERT_EQ(granted, 1) << "round " << round;
    const int winner = std::holds_alternative<Grant>(*answers[0]) ? 0 : 1;
    const auto& held = std::get<Held>(*answers[1 - winner]);
    EXPECT_EQ(held.owner, winner == 0 ? "a" : "b");
    const Grant grant = std::get<Grant>(*answers[winner]);
    // The same owner reclaiming its own released row keeps the epoch (a
    // restart is not a new owner); a new owner gets counter + 1.
    EXPECT_EQ(grant.epoch, Epoch(winner == last_winner ? last_epoch : last_epoch + 1));
    last_winner = winner;
    last_epoch = grant.epoch.value();
    ASSERT_TRUE(*first->Release(Range(0, 99), Owner(winner == 0 ? "a" : "b"), grant.epoch));
  }
}

// One decision a child process saw, for the parent to check.
struct Event {
  // 'C' claim granted, 'R' renew granted, 'L' release done; 'S' closes a
  // child's log with its slowest call in ms (in the epoch field).
  char kind;
  int process;
  int first, last;
  std::uint64_t epoch;
  bool fresh;
  WallMs sent, answered;
};

// Races claims, renewals and releases on one control file for `run_for`.
// Writes one line per granted decision; exits 1 on any store error.
[[noreturn]] void RaceChild(int process, const std::string& path, const std::string& log,
                            std::chrono::milliseconds run_for) {
  SystemWallClock clock;
  auto opened = SqliteStore::Open(path, clock, {});
  if (!opened.ok()) {
    std::fprintf(stderr, "child %d: %s\n", process, opened.status().message().c_str());
    _exit(1);
  }
  auto& store = **opened;
  const OwnerId owner = Owner("p" + std::to_string(process));
  // Shapes that overlap in many ways, so the processes contend.
  const SlotRange shapes[] = {Range(0, 15), Range(16, 31), Range(0, 31), Range(32, 63),
                              Range(8, 40), Range(0, 63),  Range(60, 63), Range(20, 20)};
  std::mt19937 rng(static_cast<unsigned>(process * 7919 + ::getpid()));
  std::map<SlotRange, Epoch> held;
  std::ofstream out(log);
  WallMs slowest = 0;
  const auto end = std::chrono::steady_clock::now() + run_for;
  while (std::chrono::steady_clock::now() < end) {
    const SlotRange range = shapes[rng() % std::size(shapes)];
    const Millis ttl(20 + rng() % 200);
    const WallMs sent = clock.NowMs();
    const auto it = held.find(range);
    const int op = rng() % 4;
    if (it != held.end() && op == 0) {
      const auto released = store.Release(range, owner, it->second);
      if (!released.ok()) {
        std::fprintf(stderr, "child %d: %s\n", process, released.status().message().c_str());
        _exit(1);
      }
      if (*released) {
        out << "L " << process << ' ' << range.first() << ' ' << range.last() << ' '
            << it->second.value() << " 0 " << sent << ' ' << clock.NowMs() << '\n';
      }
      held.erase(it);
      continue;
    }
    const bool renew = it != held.end() && op != 1;
    const auto answer = renew ? store.Renew(range, owner, it->second, ttl)
                              : store.Claim(range, owner, ttl, 0);
    const WallMs answered = clock.NowMs();
    slowest = std::max(slowest, answered - sent);
    if (!answer.ok()) {
      std::fprintf(stderr, "child %d: %s\n", process, answer.status().message().c_str());
      _exit(1);
    }
    if (const auto* grant = std::get_if<Grant>(&*answer)) {
      held[range] = grant->epoch;
      out << (renew ? 'R' : 'C') << ' ' << process << ' ' << range.first() << ' '
          << range.last() << ' ' << grant->epoch.value() << ' ' << grant->fresh << ' ' << sent
          << ' ' << answered << '\n';
    } else if (std::holds_alternative<Lost>(*answer)) {
      held.erase(range);
    }
  }
  out << "S " << process << " 0 0 " << slowest << " 0 0 0\n";
  out.close();
  _exit(out ? 0 : 1);
}

TEST(SqliteStore, eight_processes_racing_on_one_file_keep_every_invariant) {
  TempDir dir;
  SystemWallClock clock;
  const std::string path = dir.File("control.db");
  ASSERT_NE(OpenOrDie(path, clock), nullptr);
  constexpr int kProcesses = 8;
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RaceChild(i, path, dir.File("events-" + std::to_string(i)), Millis(3'000));
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a racing process hit a store error (see its stderr above)";
  }
  std::vector<Event> events;
  for (int i = 0; i < kProcesses; ++i) {
    std::ifstream in(dir.File("events-" + std::to_string(i)));
    Event e{};
    while (in >> e.kind >> e.process >> e.first >> e.last >> e.epoch >> e.fresh >> e.sent >>
           e.answered) {
      events.push_back(e);
    }
  }
  // The stored table keeps its invariants (Read refuses overlap and repeats).
  auto table = OpenOrDie(path, clock, SqliteStore::Access::kExisting)->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  const std::uint64_t counter = table->last_epoch().value();

  // Every fresh epoch was granted once, and together they are exactly
  // 1..counter: each fresh grant was counter + 1, with no gap and no repeat.
  std::set<std::uint64_t> fresh;
  std::map<std::uint64_t, std::pair<int, std::pair<int, int>>> epoch_holder;
  int claims = 0, renewals = 0, releases = 0;
  std::uint64_t slowest_ms = 0;
  for (const Event& e : events) {
    if (e.kind == 'S') {
      slowest_ms = std::max(slowest_ms, e.epoch);
      continue;
    }
    if (e.kind == 'C' && e.fresh) {
      ++claims;
      EXPECT_TRUE(fresh.insert(e.epoch).second) << "epoch " << e.epoch << " granted twice";
    }
    renewals += e.kind == 'R';
    releases += e.kind == 'L';
    // One epoch belongs to one owner and one range, forever.
    const auto holder = std::pair{e.process, std::pair{e.first, e.last}};
    const auto [it, inserted] = epoch_holder.emplace(e.epoch, holder);
    EXPECT_EQ(it->second, holder) << "epoch " << e.epoch << " served two holders";
  }
  EXPECT_EQ(fresh.size(), counter);
  if (!fresh.empty()) {
    EXPECT_EQ(*fresh.begin(), 1u);
    EXPECT_EQ(*fresh.rbegin(), counter);
  }
  // Once a newer epoch covers a slot, no older epoch on it is granted again:
  // a call sent after the newer grant was answered never gets the older one.
  for (const Event& newer : events) {
    if (newer.kind != 'C' || !newer.fresh) continue;
    const SlotRange newer_range = Range(newer.first, newer.last);
    for (const Event& older : events) {
      if (older.kind == 'L' || older.kind == 'S' || older.epoch >= newer.epoch) continue;
      if (!Range(older.first, older.last).Overlaps(newer_range)) continue;
      EXPECT_LE(older.sent, newer.answered)
          << "epoch " << older.epoch << " was granted after epoch " << newer.epoch
          << " took an overlapping range";
    }
  }
  EXPECT_GT(claims, kProcesses) << "the race must actually hand ranges over";
  EXPECT_GT(renewals, 0);
  EXPECT_GT(releases, 0);
  std::printf("race: %d fresh claims, %d renewals, %d releases; counter %llu; slowest call %llu ms\n",
              claims, renewals, releases, static_cast<unsigned long long>(counter),
              static_cast<unsigned long long>(slowest_ms));
}

TEST(SqliteStore, a_file_that_is_not_a_database_is_refused_and_left_unchanged) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  const std::string junk(4096, 'x');
  std::ofstream(path, std::ios::binary) << junk;
  for (auto access : {SqliteStore::Access::kCreate, SqliteStore::Access::kExisting}) {
    const auto store = SqliteStore::Open(path, clock, {.access = access});
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), Code::kDataLoss);
    EXPECT_NE(store.status().message().find("control database " + path), std::string::npos);
    EXPECT_NE(store.status().message().find("not a SQLite database"), std::string::npos)
        << store.status().message();
  }
  EXPECT_TRUE(ReadAll(path) == junk) << "the file changed";
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST(SqliteStore, another_applications_database_is_refused_and_left_unchanged) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("app.db");
  RunSql(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)");
  const std::string before = ReadAll(path);
  const auto store = SqliteStore::Open(path, clock, {});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kDataLoss);
  EXPECT_NE(store.status().message().find("another application"), std::string::npos);
  EXPECT_TRUE(ReadAll(path) == before) << "the file changed";
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST(SqliteStore, a_missing_file_is_not_created_for_reading) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  const auto store = SqliteStore::Open(path, clock, {.access = SqliteStore::Access::kExisting});
  EXPECT_EQ(store.status().code(), Code::kNotFound);
  EXPECT_NE(store.status().message().find(path), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SqliteStore, a_missing_directory_is_named) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("no/such/dir/control.db");
  const auto store = SqliteStore::Open(path, clock, {});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir.File("no")));
}

TEST(SqliteStore, a_corrupt_row_is_reported_not_served) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  ASSERT_NE(OpenOrDie(path, clock), nullptr);
  RunSql(path,
         "PRAGMA ignore_check_constraints=ON; INSERT INTO fleetfs_slot_owners VALUES "
         "(0, 9, 'a', 1, 0, 'boot-1', NULL, 0), (5, 20, 'b', 2, 0, 'boot-1', NULL, 0)");
  auto store = OpenOrDie(path, clock);
  const auto claim = store->Claim(Range(100, 200), Owner("c"), kTtl, 0);
  EXPECT_EQ(claim.status().code(), Code::kDataLoss);
  EXPECT_NE(claim.status().message().find("overlap"), std::string::npos);
  EXPECT_EQ(store->Read().status().code(), Code::kDataLoss);
}

TEST(SqliteStore, a_write_lock_held_past_the_busy_timeout_is_unavailable_not_locked) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  auto store = SqliteStore::Open(path, clock, {.busy_timeout = Millis(50)});
  ASSERT_TRUE(store.ok()) << store.status().message();
  sqlite3* holder = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &holder), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(holder, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  const auto claim = (*store)->Claim(Range(0, 1), Owner("a"), kTtl, 0);
  EXPECT_EQ(claim.status().code(), Code::kUnavailable);
  EXPECT_NE(claim.status().message().find("held its write lock past the busy timeout"),
            std::string::npos)
      << claim.status().message();
  sqlite3_exec(holder, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(holder);
  // The store works again once the lock is gone.
  EXPECT_EQ(AsGrant((*store)->Claim(Range(0, 1), Owner("a"), kTtl, 0)).epoch, Epoch(1));
}

// ---- the boot clock: no wall-clock step decides anything ----

constexpr Millis kHour{3'600'000};

TEST(SqliteStore, a_wall_clock_step_forward_lets_no_one_claim_a_live_lease) {
  TempDir dir;
  FakeClocks clock(50'000);
  auto store = OpenOrDie(dir.File("control.db"), clock);
  const Grant a = AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.Advance(Millis(10'000));
  clock.wall.Advance(kHour);  // date -s "+1 hour": the wall lease would be long over
  const auto refused = store->Claim(Range(0, 99), Owner("b"), kTtl, 0);
  ASSERT_TRUE(refused.ok()) << refused.status().message();
  EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "a", a.lease_expires_ms}));
  const Grant renewed = AsGrant(store->Renew(Range(0, 99), Owner("a"), a.epoch, kTtl));
  EXPECT_EQ(renewed.epoch, a.epoch);
  EXPECT_EQ(renewed.lease_expires_ms, 60'000 + kTtl.count());
}

TEST(SqliteStore, a_wall_clock_step_back_does_not_keep_a_lapsed_lease) {
  TempDir dir;
  FakeClocks clock(50'000);
  auto store = OpenOrDie(dir.File("control.db"), clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.wall.Advance(-kHour);  // date -s "-1 hour": the wall lease would last an hour more
  clock.Advance(kTtl);         // the holder died; one ttl passes on the boot clock
  const Grant b = AsGrant(store->Claim(Range(0, 99), Owner("b"), kTtl, 0));
  EXPECT_EQ(b.epoch, Epoch(2));
  EXPECT_TRUE(b.fresh);
}

TEST(SqliteStore, a_lease_lives_exactly_its_ttl_on_the_boot_clock_whatever_the_wall_does) {
  TempDir dir;
  FakeClocks clock(50'000);
  auto store = OpenOrDie(dir.File("control.db"), clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.wall.Advance(-kHour);
  clock.boot.Advance(kTtl - Millis(1));
  EXPECT_TRUE(std::holds_alternative<Held>(*store->Claim(Range(0, 99), Owner("b"), kTtl, 0)));
  clock.wall.Advance(2 * kHour);
  clock.boot.Advance(Millis(1));
  EXPECT_EQ(AsGrant(store->Claim(Range(0, 99), Owner("b"), kTtl, 0)).epoch, Epoch(2));
}

TEST(SqliteStore, each_row_is_written_with_the_boot_id_of_its_decision) {
  TempDir dir;
  FakeClocks clock(50'000, "0f1e2d3c-boot");
  const std::string path = dir.File("control.db");
  auto store = OpenOrDie(path, clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* row = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT lease_expires_boot_ms, lease_boot_id FROM "
                               "fleetfs_slot_owners",
                               -1, &row, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(row), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(row, 0), 50'000 + kTtl.count());
  EXPECT_EQ(reinterpret_cast<const char*>(sqlite3_column_text(row, 1)),
            std::string("0f1e2d3c-boot"));
  sqlite3_finalize(row);
  sqlite3_close(db);
}

TEST(SqliteStore, a_new_boot_ends_every_lease_of_the_old_one_and_keeps_epochs_and_counter) {
  TempDir dir;
  const std::string path = dir.File("control.db");
  {
    FakeClocks before(900'000'000, "boot-1");
    auto store = OpenOrDie(path, before);
    AsGrant(store->Claim(Range(0, 99), Owner("a"), Millis(3'600'000), 0));
    AsGrant(store->Claim(Range(100, 199), Owner("b"), Millis(3'600'000), 0));
    AsGrant(store->Claim(Range(200, 299), Owner("c"), kTtl, 0));
    ASSERT_TRUE(*store->Release(Range(200, 299), Owner("c"), Epoch(3)));
  }
  // Rebooted: the boot clock starts again near 0, below every old expiry.
  FakeClocks after(5'000, "boot-2");
  auto store = OpenOrDie(path, after, SqliteStore::Access::kExisting);
  const auto table = store->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 3u);
  EXPECT_EQ(table->rows()[0], (OwnershipRow{Range(0, 99), Owner("a"), Epoch(1), 0}));
  EXPECT_EQ(table->rows()[1], (OwnershipRow{Range(100, 199), Owner("b"), Epoch(2), 0}));
  EXPECT_EQ(table->rows()[2], (OwnershipRow{Range(200, 299), Owner("c"), Epoch(3), 0}));
  EXPECT_EQ(table->last_epoch(), Epoch(3));
}

TEST(SqliteStore, a_claim_after_a_reboot_gets_an_epoch_above_every_old_one) {
  TempDir dir;
  const std::string path = dir.File("control.db");
  {
    FakeClocks before(900'000'000, "boot-1");
    auto store = OpenOrDie(path, before);
    AsGrant(store->Claim(Range(0, 99), Owner("a"), Millis(3'600'000), 0));
    AsGrant(store->Claim(Range(100, 199), Owner("b"), Millis(3'600'000), 0));
  }
  FakeClocks after(5'000, "boot-2");
  auto store = OpenOrDie(path, after);
  const Grant c = AsGrant(store->Claim(Range(50, 149), Owner("c"), kTtl, 0));
  EXPECT_EQ(c.epoch, Epoch(3));
  EXPECT_TRUE(c.fresh);
  EXPECT_EQ(c.lease_expires_ms, 5'000 + kTtl.count());
  // The new row is of this boot: live, and refused to others.
  EXPECT_TRUE(std::holds_alternative<Held>(*store->Claim(Range(0, 99), Owner("a"), kTtl, 0)));
  EXPECT_EQ(store->Read()->last_epoch(), Epoch(3));
}

TEST(SqliteStore, after_a_reboot_an_owner_reclaims_its_own_row_at_its_epoch_as_after_any_restart) {
  TempDir dir;
  const std::string path = dir.File("control.db");
  {
    FakeClocks before(900'000'000, "boot-1");
    AsGrant(OpenOrDie(path, before)->Claim(Range(0, 99), Owner("a"), Millis(3'600'000), 0));
  }
  FakeClocks after(5'000, "boot-2");
  const Grant a = AsGrant(OpenOrDie(path, after)->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(a.epoch, Epoch(1));
  EXPECT_FALSE(a.fresh);
  EXPECT_EQ(a.lease_expires_ms, 5'000 + kTtl.count());
}

// The rows as "range owner epoch expiry; ...", so a failure shows them.
std::string RowsOf(const Result<OwnershipTable>& table) {
  if (!table.ok()) return table.status().message();
  std::string out;
  for (const auto& row : table->rows()) {
    out += row.range.ToString() + " " + row.owner.str() + " " + row.epoch.ToString() + " " +
           std::to_string(row.lease_expires_ms) + "; ";
  }
  return out + "last epoch " + table->last_epoch().ToString();
}

// A store whose files SyncWatchingVfs watches.
std::unique_ptr<SqliteStore> OpenWatched(const std::string& path, FakeClocks& clocks) {
  SyncWatchingVfs::Get();
  auto store =
      SqliteStore::Open(path, clocks, {.boot = &clocks.boot, .vfs = SyncWatchingVfs::kName});
  EXPECT_TRUE(store.ok()) << store.status().message();
  return store.ok() ? std::move(store).value() : nullptr;
}

TEST(SqliteStore, a_claim_is_synced_before_it_is_answered_and_a_renewal_or_release_is_not) {
  TempDir dir;
  FakeClocks clock(1'000'000);
  const std::string path = dir.File("control.db");
  auto store = OpenWatched(path, clock);
  SyncWatchingVfs& vfs = SyncWatchingVfs::Get();
  vfs.ResetSyncs();
  const Grant a = AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_GE(vfs.Syncs("-wal"), 1) << "a claim that takes a new epoch is on disk when answered";
  vfs.ResetSyncs();
  clock.Advance(Millis(10'000));
  AsGrant(store->Renew(Range(0, 99), Owner("a"), a.epoch, kTtl));
  EXPECT_EQ(vfs.Syncs(), 0) << "a renewal waits for no sync";
  ASSERT_TRUE(*store->Release(Range(0, 99), Owner("a"), a.epoch));
  EXPECT_EQ(vfs.Syncs(), 0) << "a release waits for no sync";
  // The owner's own released row, reclaimed at its epoch, is a claim all the
  // same: synced, after the unsynced decisions on the same connection.
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_GE(vfs.Syncs("-wal"), 1);
  vfs.ResetSyncs();
  EXPECT_EQ(AsGrant(store->Claim(Range(100, 199), Owner("b"), kTtl, 0)).epoch, Epoch(2));
  EXPECT_GE(vfs.Syncs("-wal"), 1);
}

// The argument for unsynced renewals and releases, played out: what an OS
// crash can lose of them, the next boot would not have seen anyway.
TEST(SqliteStore, renewals_and_releases_lost_to_an_os_crash_change_nothing_the_next_boot_sees) {
  TempDir dir;
  FakeClocks clock(1'000'000, "boot-1");
  const std::string path = dir.File("control.db");
  auto store = OpenWatched(path, clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  AsGrant(store->Claim(Range(100, 199), Owner("b"), kTtl, 0));
  clock.Advance(Millis(20'000));
  EXPECT_EQ(AsGrant(store->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl)).lease_expires_ms,
            1'050'000);
  ASSERT_TRUE(*store->Release(Range(100, 199), Owner("b"), Epoch(2)));
  SyncWatchingVfs::Get().CopyAsACrashWouldLeave(path, dir.File("crashed.db"));

  // Had the boot gone on (it cannot: this is the copy a crash leaves), the
  // renewal and the release would be lost: the crash did lose them.
  FakeClocks same_boot(1'020'000, "boot-1");
  EXPECT_EQ(RowsOf(OpenOrDie(dir.File("crashed.db"), same_boot)->Read()),
            "0-99 a 1 1030000; 100-199 b 2 1030000; last epoch 2");
  // But a crash is a reboot: every row of boot-1 has ended, with its owner
  // and epoch, exactly as in the file that lost nothing.
  FakeClocks next_boot(5'000, "boot-2");
  const auto crashed = OpenOrDie(dir.File("crashed.db"), next_boot)->Read();
  const auto intact = OpenOrDie(path, next_boot, SqliteStore::Access::kExisting)->Read();
  EXPECT_EQ(RowsOf(crashed), "0-99 a 1 0; 100-199 b 2 0; last epoch 2");
  EXPECT_EQ(RowsOf(crashed), RowsOf(intact));
}

TEST(SqliteStore, a_claim_answered_after_unsynced_decisions_survives_an_os_crash_with_them) {
  TempDir dir;
  FakeClocks clock(1'000'000, "boot-1");
  const std::string path = dir.File("control.db");
  auto store = OpenWatched(path, clock);
  AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.Advance(Millis(20'000));
  AsGrant(store->Renew(Range(0, 99), Owner("a"), Epoch(1), kTtl));
  // A handover: a releases, c claims the range at once.
  ASSERT_TRUE(*store->Release(Range(0, 99), Owner("a"), Epoch(1)));
  EXPECT_EQ(AsGrant(store->Claim(Range(0, 99), Owner("c"), kTtl, 0)).epoch, Epoch(2));
  SyncWatchingVfs::Get().CopyAsACrashWouldLeave(path, dir.File("crashed.db"));

  FakeClocks same_boot(1'020'000, "boot-1");
  EXPECT_EQ(RowsOf(OpenOrDie(dir.File("crashed.db"), same_boot)->Read()),
            "0-99 c 2 1050000; last epoch 2");
  // After the reboot the counter is where the answered claim left it: epoch 2
  // is never granted again.
  FakeClocks next_boot(5'000, "boot-2");
  auto rebooted = OpenOrDie(dir.File("crashed.db"), next_boot);
  EXPECT_EQ(AsGrant(rebooted->Claim(Range(0, 99), Owner("d"), kTtl, 0)).epoch, Epoch(3));
}

TEST(SqliteStore, to_wall_ms_shows_a_store_time_on_the_wall_clock_of_now) {
  TempDir dir;
  FakeClocks clock(50'000);
  auto store = OpenOrDie(dir.File("control.db"), clock);
  const Grant a = AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  EXPECT_EQ(store->NowMs(), 50'000);
  EXPECT_EQ(store->ToWallMs(a.lease_expires_ms), kWallAtStart + 50'000 + kTtl.count());
  // Display follows the wall clock; the decision above did not.
  clock.wall.Advance(kHour);
  EXPECT_EQ(store->ToWallMs(a.lease_expires_ms),
            kWallAtStart + 50'000 + kTtl.count() + kHour.count());
  EXPECT_EQ(store->ToWallMs(INT64_MAX), INT64_MAX);
}

// ---- schema 1 (wall-clock expiries), as fleetfs wrote it before ----

constexpr const char* kSchemaV1 = R"sql(
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
PRAGMA journal_mode=WAL;
PRAGMA application_id = 1718380147;  -- 0x666c6673, "flfs"
PRAGMA user_version = 1;
)sql";

std::int64_t UserVersion(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* version = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &version, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_step(version), SQLITE_ROW);
  const std::int64_t value = sqlite3_column_int64(version, 0);
  sqlite3_finalize(version);
  sqlite3_close(db);
  return value;
}

// A schema-1 file at wall time kWallAtStart + 50 s: a live lease (20 s left),
// a lapsed one, one 10 h ahead (written under a wall clock set back), and a
// counter above every row.
std::string MakeSchemaV1(const TempDir& dir) {
  const std::string path = dir.File("control.db");
  const WallMs now = kWallAtStart + 50'000;
  RunSql(path, kSchemaV1);
  const auto row = [](const char* start, WallMs expires) {
    return std::string(start) + std::to_string(expires) + ")";
  };
  const std::string rows = row("(0, 99, 'a', 3, ", now + 20'000) + ", " +
                           row("(100, 199, 'b', 5, ", now - 5'000) + ", " +
                           row("(200, 299, 'c', 6, ", now + 36'000'000);
  RunSql(path, ("INSERT INTO fleetfs_slot_owners VALUES " + rows +
                "; UPDATE fleetfs_epoch_counter SET last = 7")
                   .c_str());
  return path;
}

TEST(SqliteStore, a_schema_1_file_is_read_with_live_wall_leases_kept_and_left_unchanged) {
  TempDir dir;
  const std::string path = MakeSchemaV1(dir);
  FakeClocks clock(50'000, "boot-9");
  auto table = OpenOrDie(path, clock, SqliteStore::Access::kExisting)->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 3u);
  EXPECT_EQ(table->rows()[0], (OwnershipRow{Range(0, 99), Owner("a"), Epoch(3), 70'000}));
  EXPECT_EQ(table->rows()[1], (OwnershipRow{Range(100, 199), Owner("b"), Epoch(5), 0}));
  EXPECT_EQ(table->rows()[2],
            (OwnershipRow{Range(200, 299), Owner("c"), Epoch(6), 50'000 + kHour.count()}));
  EXPECT_EQ(table->last_epoch(), Epoch(7));
  EXPECT_EQ(UserVersion(path), 1) << "a listing migrated the file";
}

TEST(SqliteStore, a_schema_1_file_is_migrated_in_place_keeping_rows_epochs_and_counter) {
  TempDir dir;
  const std::string path = MakeSchemaV1(dir);
  FakeClocks clock(50'000, "boot-9");
  auto store = OpenOrDie(path, clock);
  EXPECT_EQ(UserVersion(path), 3);
  // Another boot reads what the migration wrote: every row of boot-9.
  {
    FakeClocks other(50'000, "boot-10");
    auto table = OpenOrDie(path, other, SqliteStore::Access::kExisting)->Read();
    ASSERT_TRUE(table.ok()) << table.status().message();
    for (const auto& row : table->rows()) EXPECT_EQ(row.lease_expires_ms, 0);
  }
  // The live lease keeps what it had left (20 s), on the boot clock.
  const auto held = store->Claim(Range(0, 99), Owner("z"), kTtl, 0);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(std::get<Held>(*held), (Held{Range(0, 99), "a", 70'000}));
  // A lease from a wall clock set back keeps at most the longest ttl.
  const auto capped = store->Claim(Range(200, 299), Owner("z"), kTtl, 0);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(std::get<Held>(*capped), (Held{Range(200, 299), "c", 50'000 + kHour.count()}));
  // The lapsed one is claimed above the counter; its owner's renewal still
  // works up to then, as for any lapse nobody used.
  EXPECT_EQ(AsGrant(store->Renew(Range(100, 199), Owner("b"), Epoch(5), kTtl)).epoch, Epoch(5));
  clock.Advance(kTtl);
  const Grant z = AsGrant(store->Claim(Range(0, 199), Owner("z"), kTtl, 0));
  EXPECT_EQ(z.epoch, Epoch(8));
  // Reopening does not migrate twice.
  EXPECT_NE(OpenOrDie(path, clock), nullptr);
  EXPECT_EQ(store->Read()->last_epoch(), Epoch(8));
}

TEST(SqliteStore, a_schema_1_file_is_not_decided_on_by_a_listing_store) {
  TempDir dir;
  const std::string path = MakeSchemaV1(dir);
  FakeClocks clock(50'000);
  auto store = OpenOrDie(path, clock, SqliteStore::Access::kExisting);
  const auto claim = store->Claim(Range(300, 399), Owner("z"), kTtl, 0);
  EXPECT_EQ(claim.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(claim.status().message().find("wall-clock expiries"), std::string::npos)
      << claim.status().message();
  EXPECT_EQ(UserVersion(path), 1);
}

TEST(SqliteStore, an_offer_lets_only_its_target_claim_and_shows_in_the_table) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  auto store = OpenOrDie(path, clock);
  const Grant old = AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
  clock.Advance(Millis(1'000));
  ASSERT_TRUE(*store->Offer(Range(0, 99), Owner("a"), old.epoch, Owner("b"), kTtl));
  // Another process reads it from the file.
  auto reader = OpenOrDie(path, clock, SqliteStore::Access::kExisting);
  const auto table = reader->Read();
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_EQ(table->rows().size(), 1u);
  EXPECT_EQ(table->rows()[0].offered_to, Owner("b"));
  EXPECT_EQ(table->rows()[0].offer_expires_ms, 31'000);
  EXPECT_EQ(table->rows()[0].lease_expires_ms, 1'000);
  const auto refused = store->Claim(Range(0, 99), Owner("c"), kTtl, 0);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(std::get<Held>(*refused), (Held{Range(0, 99), "b", 31'000, true}));
  EXPECT_TRUE(std::holds_alternative<Held>(*store->Claim(Range(0, 99), Owner("a"), kTtl, 0)));
  const Grant next = AsGrant(reader->Claim(Range(0, 99), Owner("b"), kTtl, 0));
  EXPECT_TRUE(next.fresh);
  EXPECT_GT(next.epoch, old.epoch);
  EXPECT_FALSE(store->Read()->rows()[0].offered_to.has_value());
}

TEST(SqliteStore, an_offer_of_another_boot_has_ended) {
  TempDir dir;
  const std::string path = dir.File("control.db");
  {
    FakeClocks before(900'000'000, "boot-1");
    auto store = OpenOrDie(path, before);
    AsGrant(store->Claim(Range(0, 99), Owner("a"), kTtl, 0));
    ASSERT_TRUE(*store->Offer(Range(0, 99), Owner("a"), Epoch(1), Owner("b"), Millis(3'600'000)));
  }
  FakeClocks after(5'000, "boot-2");
  auto store = OpenOrDie(path, after);
  EXPECT_TRUE(AsGrant(store->Claim(Range(0, 99), Owner("c"), kTtl, 0)).fresh);
}

TEST(SqliteStore, a_schema_newer_than_this_fleetfs_is_refused) {
  TempDir dir;
  FakeClocks clock(0);
  const std::string path = dir.File("control.db");
  ASSERT_NE(OpenOrDie(path, clock), nullptr);
  RunSql(path, "PRAGMA user_version = 4");
  const auto store = SqliteStore::Open(path, clock, {.boot = &clock.boot});
  EXPECT_EQ(store.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("upgrade fleetfs"), std::string::npos);
}

TEST(StoreUrl, accepts_absolute_sqlite_paths_only) {
  EXPECT_EQ(ParseStoreUrl("sqlite:///var/lib/fleetfs/control.db")->path,
            "/var/lib/fleetfs/control.db");
  const std::pair<const char*, const char*> bad[] = {
      {"sqlite://relative.db", "must be absolute"},
      {"sqlite://", "must be absolute"},
      {"zk://127.0.0.1:2181/x", "unknown scheme 'zk'"},
      {"etcd://127.0.0.1:2379", "no key prefix"},
      {"/var/lib/control.db", "not a URL"},
      {"sqlite:///var/lib/", "names a directory"},
  };
  for (const auto& [url, why] : bad) {
    const auto parsed = ParseStoreUrl(url);
    ASSERT_FALSE(parsed.ok()) << url;
    EXPECT_EQ(parsed.status().message().rfind("store URL '" + std::string(url) + "'", 0), 0u);
    EXPECT_NE(parsed.status().message().find(why), std::string::npos)
        << parsed.status().message();
  }
}

}  // namespace
}  // namespace fleetfs::lease
