// A property of the whole replication path, randomized: SQLite writers in
// threads, whose every change of the main file, -wal and -journal reaches the
// replicator's hooks as the mount reports it (a shim VFS, with jitter between
// hook and write), while the replicator's own loop ships every few ms; then
// every committed row must be in the restored replica. Written after a hole
// seen once in mount_replication's failover_under_load("wal") (not
// reproduced: about 250 tenant runs found none). One short iteration by
// default; STRESS_ITER, STRESS_COMMITS, STRESS_CKPT, STRESS_TENANTS,
// STRESS_SYNC_MS, STRESS_SLOW_MS and STRESS_JITTER scale it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"
#include "fleet/replicator.h"
#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t kEpoch = 7;

// ---- the shim VFS ----

std::mutex g_watch_mu;
std::map<std::string, std::shared_ptr<TenantWatch>> g_watches;  // main path -> watch
std::atomic<int> g_jitter_us{0};

std::string MainOf(std::string_view name) {
  for (std::string_view suffix : {"-wal", "-journal"}) {
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      return std::string(name.substr(0, name.size() - suffix.size()));
    }
  }
  return std::string(name);
}

std::shared_ptr<TenantWatch> WatchOf(std::string_view name) {
  std::lock_guard lock(g_watch_mu);
  auto it = g_watches.find(MainOf(name));
  return it == g_watches.end() ? nullptr : it->second;
}

void Jitter() {
  const int most = g_jitter_us.load();
  if (most <= 0) return;
  thread_local std::mt19937 rng(std::random_device{}());
  const int us = static_cast<int>(rng() % static_cast<unsigned>(most));
  if (us > most / 2) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

sqlite3_vfs* g_real = nullptr;
sqlite3_vfs g_hooked;
sqlite3_io_methods g_io;

struct HookFile {
  sqlite3_file base;
  FileRole role;
  bool watched;
  std::string* main;
  sqlite3_file* real;
};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::optional<FileRole> RoleOf(const char* name, int flags) {
  if (name == nullptr) return std::nullopt;
  std::string_view n(name);
  if (EndsWith(n, "-wal")) return FileRole::kWal;
  if (EndsWith(n, "-journal")) return FileRole::kJournal;
  if (flags & SQLITE_OPEN_MAIN_DB) return FileRole::kMain;
  return std::nullopt;
}

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<HookFile*>(f)->real; }

int HClose(sqlite3_file* f) {
  sqlite3_file* r = Real(f);
  delete reinterpret_cast<HookFile*>(f)->main;
  reinterpret_cast<HookFile*>(f)->main = nullptr;
  return r->pMethods ? r->pMethods->xClose(r) : SQLITE_OK;
}
int HRead(sqlite3_file* f, void* p, int n, sqlite3_int64 off) {
  return Real(f)->pMethods->xRead(Real(f), p, n, off);
}
int HWrite(sqlite3_file* f, const void* p, int n, sqlite3_int64 off) {
  auto* h = reinterpret_cast<HookFile*>(f);
  WriteGuard guard;
  if (h->watched) {
    if (auto w = WatchOf(*h->main)) {
      Jitter();
      guard = w->BeforeWrite(h->role, static_cast<std::uint64_t>(off), static_cast<const char*>(p),
                             static_cast<std::size_t>(n));
      Jitter();
    }
  }
  return h->real->pMethods->xWrite(h->real, p, n, off);
}
int HTruncate(sqlite3_file* f, sqlite3_int64 size) {
  auto* h = reinterpret_cast<HookFile*>(f);
  WriteGuard guard;
  if (h->watched) {
    if (auto w = WatchOf(*h->main)) guard = w->BeforeTruncate(h->role, static_cast<std::uint64_t>(size));
  }
  return h->real->pMethods->xTruncate(h->real, size);
}
int HSync(sqlite3_file* f, int flags) { return Real(f)->pMethods->xSync(Real(f), flags); }
int HFileSize(sqlite3_file* f, sqlite3_int64* s) { return Real(f)->pMethods->xFileSize(Real(f), s); }
int HLock(sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); }
int HUnlock(sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); }
int HCheck(sqlite3_file* f, int* o) { return Real(f)->pMethods->xCheckReservedLock(Real(f), o); }
int HFcntl(sqlite3_file* f, int op, void* a) { return Real(f)->pMethods->xFileControl(Real(f), op, a); }
int HSector(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int HDevice(sqlite3_file* f) { return Real(f)->pMethods->xDeviceCharacteristics(Real(f)); }
int HShmMap(sqlite3_file* f, int i, int sz, int ext, void volatile** pp) {
  return Real(f)->pMethods->xShmMap(Real(f), i, sz, ext, pp);
}
int HShmLock(sqlite3_file* f, int off, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), off, n, flags);
}
void HShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int HShmUnmap(sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); }
int HFetch(sqlite3_file* f, sqlite3_int64 off, int n, void** pp) {
  return Real(f)->pMethods->xFetch(Real(f), off, n, pp);
}
int HUnfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return Real(f)->pMethods->xUnfetch(Real(f), off, p);
}

int HOpen(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out) {
  auto* h = reinterpret_cast<HookFile*>(f);
  h->real = reinterpret_cast<sqlite3_file*>(h + 1);
  std::memset(h->real, 0, static_cast<std::size_t>(g_real->szOsFile));
  const auto role = RoleOf(name, flags);
  h->role = role.value_or(FileRole::kShm);
  h->watched = role.has_value();
  h->main = new std::string(name ? MainOf(name) : "");
  int rc = g_real->xOpen(g_real, name, h->real, flags, out);
  h->base.pMethods = h->real->pMethods ? &g_io : nullptr;
  return rc;
}

int HDelete(sqlite3_vfs*, const char* name, int sync) {
  WriteGuard guard;
  if (auto role = RoleOf(name, 0)) {
    if (auto w = WatchOf(name)) guard = w->BeforeUnlink(*role);
  }
  return g_real->xDelete(g_real, name, sync);
}

void RegisterHooked() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_real = sqlite3_vfs_find(nullptr);
    g_hooked = *g_real;
    g_hooked.zName = "hooked";
    g_hooked.szOsFile = static_cast<int>(sizeof(HookFile)) + g_real->szOsFile;
    g_hooked.xOpen = HOpen;
    g_hooked.xDelete = HDelete;
    g_hooked.pNext = nullptr;
    g_io = sqlite3_io_methods{3,        HClose,     HRead,      HWrite,    HTruncate, HSync,
                              HFileSize, HLock,     HUnlock,    HCheck,    HFcntl,    HSector,
                              HDevice,   HShmMap,   HShmLock,   HShmBarrier, HShmUnmap, HFetch,
                              HUnfetch};
    sqlite3_vfs_register(&g_hooked, 0);
  });
}

sqlite3* Open(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "hooked"),
            SQLITE_OK);
  sqlite3_busy_timeout(db, 30000);
  return db;
}

int Exec(sqlite3* db, const std::string& sql) {
  return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
}

std::set<long long> Ids(const std::string& path) {
  std::set<long long> ids;
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT id FROM t", -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) ids.insert(sqlite3_column_int64(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return ids;
}

// Forwards, sleeping a while before each create (an upload that takes time).
class SlowDestination final : public Destination {
 public:
  SlowDestination(std::shared_ptr<Destination> inner, int most_ms) : inner_(std::move(inner)), most_ms_(most_ms) {}
  const std::string& url() const override { return inner_->url(); }
  Result<std::vector<std::string>> List(std::string_view d) override { return inner_->List(d); }
  Result<std::vector<std::string>> ListFrom(std::string_view d, std::string_view a) override {
    return inner_->ListFrom(d, a);
  }
  Status Put(std::string_view p, std::string_view b) override { return inner_->Put(p, b); }
  Status PutFile(std::string_view p, int fd) override { return inner_->PutFile(p, fd); }
  Status Create(std::string_view p, std::string_view b) override {
    Sleep();
    return inner_->Create(p, b);
  }
  Status CreateFromFile(std::string_view p, int fd) override {
    Sleep();
    return inner_->CreateFromFile(p, fd);
  }
  Status Get(std::string_view p, const Sink& s) override { return inner_->Get(p, s); }
  Result<std::string> GetHead(std::string_view p, std::size_t n) override { return inner_->GetHead(p, n); }
  Result<std::uint64_t> Size(std::string_view p) override { return inner_->Size(p); }
  Status Remove(std::string_view p) override { return inner_->Remove(p); }
  Status Probe() override { return inner_->Probe(); }
  Result<int> CleanTemps(std::chrono::seconds a) override { return inner_->CleanTemps(a); }

 private:
  void Sleep() {
    if (most_ms_ <= 0) return;
    thread_local std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (most_ms_ * 1000u)));
  }
  std::shared_ptr<Destination> inner_;
  int most_ms_;
};

int Env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

class ReplicatorStress : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterHooked();
    dir_ = fs::temp_directory_path() / ("fleetfs-stress-" + std::to_string(::getpid()));
  }
  void TearDown() override {
    {
      std::lock_guard lock(g_watch_mu);
      g_watches.clear();
    }
    fs::remove_all(dir_);
  }
  fs::path dir_;
  SystemWallClock wall_;
  SystemMonotonicClock mono_;
};

TEST_F(ReplicatorStress, every_committed_row_of_two_contending_writers_reaches_the_replica) {
  const int iterations = Env("STRESS_ITER", 1);
  const int commits = Env("STRESS_COMMITS", 200);
  const int autockpt = Env("STRESS_CKPT", 1000);
  const int tenants = Env("STRESS_TENANTS", 3);
  const int sync_ms = Env("STRESS_SYNC_MS", 3);
  const int slow_ms = Env("STRESS_SLOW_MS", 0);
  g_jitter_us = Env("STRESS_JITTER", 200);
  for (int it = 0; it < iterations; ++it) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "backing");
    auto inner = *OpenDestination("file://" + (dir_ / "replica").string());
    auto dest = std::make_shared<SlowDestination>(inner, slow_ms);
    ReplicatorOptions o;
    o.backing = (dir_ / "backing").string();
    o.destination = dest;
    o.wall = &wall_;
    o.mono = &mono_;
    o.sync_interval = std::chrono::milliseconds(sync_ms);
    o.serving_epoch = [](Slot) -> std::optional<std::uint64_t> { return kEpoch; };
    auto rep = Replicator::Start(o);
    ASSERT_TRUE(rep.ok()) << rep.status().message();

    struct T {
      FleetFile k;
      std::string path;
      std::mutex mu;
      std::set<long long> committed;
      std::atomic<int> left{0};
      std::vector<sqlite3*> conns;
    };
    std::vector<std::unique_ptr<T>> ts;
    for (int n = 0; n < tenants; ++n) {
      auto t = std::make_unique<T>();
      t->k = *ParseFleetPath(FleetMode::kTenant,
                             TenantPath("stress-" + std::to_string(it) + "-" + std::to_string(n)));
      t->path = (dir_ / "backing" / t->k.main_path).string();
      t->left = commits;
      fs::create_directories(fs::path(t->path).parent_path());
      {
        UniqueFd fd(::open(t->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
        ASSERT_TRUE(fd.valid());
        ASSERT_TRUE(WriteStamps(fd.get(), kEpoch, t->k.key, t->k.main_path).ok());
      }
      {
        std::lock_guard lock(g_watch_mu);
        g_watches[t->path] = (*rep)->Watch(t->k, kEpoch);
      }
      // make_tenant
      sqlite3* db = Open(t->path);
      ASSERT_EQ(Exec(db, "PRAGMA journal_mode=wal"), SQLITE_OK);
      ASSERT_EQ(Exec(db, "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, pad BLOB)"), SQLITE_OK);
      sqlite3_close(db);
      ts.push_back(std::move(t));
    }
    std::vector<std::thread> writers;
    for (auto& t : ts) {
      for (int w = 0; w < 2; ++w) {
        t->conns.push_back(Open(t->path));
        Exec(t->conns.back(), "PRAGMA journal_mode=wal");
        Exec(t->conns.back(), "PRAGMA wal_autocheckpoint=" + std::to_string(autockpt));
      }
    }
    for (auto& tp : ts) {
      T* t = tp.get();
      for (int w = 0; w < 2; ++w) {
        writers.emplace_back([t, w] {
          sqlite3* db = t->conns[w];
          for (long long i = 1; t->left.fetch_sub(1) > 0; ++i) {
            const long long row = (w + 1) * 1000000LL + i;
            if (Exec(db, "BEGIN IMMEDIATE") != SQLITE_OK) {
              ADD_FAILURE() << sqlite3_errmsg(db);
              return;
            }
            Exec(db, "INSERT INTO t(id, pad) VALUES (" + std::to_string(row) + ", randomblob(300))");
            if (Exec(db, "COMMIT") != SQLITE_OK) {
              ADD_FAILURE() << sqlite3_errmsg(db);
              return;
            }
            std::lock_guard lock(t->mu);
            t->committed.insert(row);
          }
        });
      }
    }
    for (auto& w : writers) w.join();
    ASSERT_TRUE((*rep)->Flush(mono_.Now() + std::chrono::seconds(60)));
    bool bad = false;
    for (auto& t : ts) {
      const auto local = Ids(t->path);
      EXPECT_EQ(local, t->committed) << "sqlite itself lost commits";
      const std::string out = (dir_ / "restored").string();
      {
        UniqueFd fd(::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        auto r = RestoreFromLog(*inner, LogDir(t->k), std::nullopt, fd.get(),
                                std::numeric_limits<std::uint64_t>::max());
        ASSERT_TRUE(r.ok()) << r.status().message();
      }
      const auto restored = Ids(out);
      std::vector<long long> missing;
      std::set_difference(t->committed.begin(), t->committed.end(), restored.begin(),
                          restored.end(), std::back_inserter(missing));
      auto stats = (*rep)->Stats();
      EXPECT_TRUE(missing.empty()) << "iteration " << it << " " << t->k.main_path << ": "
                                   << missing.size() << " of " << t->committed.size()
                                   << " commits missing, first "
                                   << (missing.empty() ? 0 : missing.front()) << "; snapshots "
                                   << stats.snapshots << " segments " << stats.segments
                                   << " failures " << stats.capture_failures;
      if (!missing.empty()) {
        bad = true;
        fs::copy(dir_ / "replica", fs::path("/tmp") / ("stress-replica-" + std::to_string(it)),
                 fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      }
    }
    {
      std::lock_guard lock(g_watch_mu);
      g_watches.clear();
    }
    for (auto& t : ts) {
      for (sqlite3* c : t->conns) sqlite3_close(c);
    }
    (*rep)->Stop();
    if (bad) break;
  }
}

}  // namespace
}  // namespace fleetfs::replica
