// `fleetfs replica ls|verify` and `fleetfs restore` on a key's replica log:
// the command functions run against a file:// replica written by a real
// LogWriter, judged by exit code, output and the file a restore leaves.
#include "agent/replica_cli.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fleet/replica/counting_destination.h"
#include "fleet/replica/log_names.h"
#include "fleet/replica/log_reader.h"
#include "fleet/replica/log_test_support.h"
#include "lease/test_support.h"

namespace fleetfs::agent {
namespace {

using lease::testing::TempDir;
using replica::testing::kLogDir;
constexpr std::uint64_t kAny = std::numeric_limits<std::uint64_t>::max();
using replica::testing::kLogPage;
using replica::testing::LogBuilder;
using Json = nlohmann::json;

// 2026-01-01T00:00:00Z; the tests run in UTC, so local times are these.
constexpr WallMs kT0 = 1'767'225'600'000;

struct Ran {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A real SQLite database in rollback-journal mode, so the file itself holds
// each committed state: what an agent's commits would have shipped.
class Database {
 public:
  explicit Database(std::string path) : path_(std::move(path)) {
    Exec("PRAGMA journal_mode=DELETE; CREATE TABLE t(n INTEGER PRIMARY KEY, v TEXT)");
  }
  // Inserts row `n` and returns the file as that commit left it.
  std::string Insert(int n) {
    Exec("INSERT INTO t VALUES(" + std::to_string(n) + ", randomblob(3000))");
    return Slurp(path_);
  }
  std::string Bytes() const { return Slurp(path_); }

 private:
  void Exec(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  std::string path_;
};

// The rows of the database in `path`, in order.
std::vector<int> Rows(const std::string& path) {
  std::vector<int> rows;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT n FROM t ORDER BY n", -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  while (stmt && sqlite3_step(stmt) == SQLITE_ROW) rows.push_back(sqlite3_column_int(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

class ReplicaCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // Local time is UTC, so the times the commands print are known here.
    ::setenv("TZ", "UTC", 1);
    ::tzset();
    std::filesystem::create_directories(replica_dir_);
    auto dest = replica::OpenDestination(url_);
    ASSERT_TRUE(dest.ok()) << dest.status().message();
    dest_ = *dest;
    log_ = std::make_unique<LogBuilder>(*dest_);
  }

  Ran Run(int (*command)(const ReplicaArgs&, std::ostream&, std::ostream&),
          std::function<void(ReplicaArgs&)> more = nullptr) {
    ReplicaArgs args;
    args.tenant = "acme";
    args.replica = url_;
    if (more) more(args);
    std::ostringstream out, err;
    Ran ran;
    ran.code = command(args, out, err);
    ran.out = out.str();
    ran.err = err.str();
    return ran;
  }
  Ran Ls(bool json) {
    return Run(RunReplicaLs, [json](ReplicaArgs& a) { a.json = json; });
  }
  Ran Verify() { return Run(RunReplicaVerify); }
  Ran Restore(const std::string& at = "") {
    return Run(RunRestore, [&](ReplicaArgs& a) {
      a.output = output_;
      a.at = at;
    });
  }
  std::string ObjectFile(std::uint64_t seq) const {
    return replica_dir_ + "/" + replica::LogObjectPath(kLogDir, seq);
  }
  std::uint64_t ObjectBytes(std::uint64_t seq) const {
    return std::filesystem::file_size(ObjectFile(seq));
  }

  TempDir dir_;
  const std::string replica_dir_ = dir_.File("replica");
  const std::string url_ = "file://" + replica_dir_;
  const std::string output_ = dir_.File("restored.db");
  std::shared_ptr<replica::Destination> dest_;
  std::unique_ptr<LogBuilder> log_;
};

// marker 0 (epoch 1), snapshot 1, segment 2 (two commits), marker 3 (epoch
// 2), segment 4, tombstone 5.
void WriteEveryKind(LogBuilder& log) {
  log.Take(1, kT0);
  log.Recreate(std::string(kLogPage, 'a'));
  log.Snapshot(kT0 + 100);
  log.Segment({{kT0 + 200, 'b'}, {kT0 + 300, 'c'}}, 1);
  log.Take(2, kT0 + 400);
  log.Segment({{kT0 + 500, 'd'}});
  log.Tombstone(kT0 + 600);
}

TEST_F(ReplicaCli, ls_prints_every_object_of_the_log_and_what_it_holds_as_a_whole) {
  WriteEveryKind(*log_);
  const Ran ran = Ls(false);
  ASSERT_EQ(ran.code, 0) << ran.err;
  std::istringstream lines(ran.out);
  std::vector<std::string> l;
  for (std::string line; std::getline(lines, line);) l.push_back(line);
  ASSERT_EQ(l.size(), 1u + 1 + 6 + 4) << ran.out;
  EXPECT_EQ(l[0], "176/acme.db at " + url_ + " (times local, UTC)");
  EXPECT_EQ(l[1],
            "SEQ  KIND       EPOCH  FIRST                    LAST                     DB_SIZE  "
            "COMMITS  BYTES");
  const char* kinds[] = {"marker", "snapshot", "segment", "marker", "segment", "tombstone"};
  for (int seq = 0; seq < 6; ++seq) {
    std::istringstream row(l[2 + seq]);
    std::string s, kind;
    row >> s >> kind;
    EXPECT_EQ(s, std::to_string(seq));
    EXPECT_EQ(kind, kinds[seq]);
  }
  EXPECT_NE(l[4].find("2026-01-01T00:00:00.200  2026-01-01T00:00:00.300  8192     2        " +
                      std::to_string(ObjectBytes(2))),
            std::string::npos)
      << l[4];
  EXPECT_NE(l[2].find("-        -        " + std::to_string(ObjectBytes(0))), std::string::npos)
      << l[2];
  EXPECT_EQ(l[8], "objects       6 (sequences 0 to 5)");
  EXPECT_EQ(l[9], "newest epoch  2");
  EXPECT_EQ(l[10], "restorable    from 2026-01-01T00:00:00.100 to 2026-01-01T00:00:00.600");
  EXPECT_EQ(l[11],
            "deleted       yes, at 2026-01-01T00:00:00.600 (tombstone 5); a restore of the newest "
            "state finds no file");
}

TEST_F(ReplicaCli, the_tail_gives_the_last_objects_and_the_restore_points) {
  WriteEveryKind(*log_);
  ReplicaArgs args;
  args.tenant = "acme";
  args.replica = url_;
  auto tail = ReadReplicaTail(args, 3, kAny);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  EXPECT_EQ(tail->log_dir, "176/acme.db");
  EXPECT_EQ(tail->objects, 6u);
  ASSERT_EQ(tail->tail.size(), 3u);
  EXPECT_EQ(tail->tail[0].seq, 3u);
  EXPECT_EQ(tail->tail[0].kind, "marker");
  EXPECT_EQ(tail->tail[1].kind, "segment");
  EXPECT_EQ(tail->tail[2].kind, "tombstone");
  EXPECT_EQ(tail->tail[2].epoch, 2u);
  EXPECT_EQ(tail->tail[2].bytes, ObjectBytes(5));
  EXPECT_EQ(tail->newest_epoch, 2u);
  EXPECT_EQ(tail->restorable_from_ms, kT0 + 100);
  EXPECT_EQ(tail->restorable_to_ms, kT0 + 600);
  EXPECT_TRUE(tail->deleted);
  EXPECT_EQ(RestoreTimeText(kT0 + 100), "2026-01-01T00:00:00.100");
}

TEST_F(ReplicaCli, a_tail_of_markers_after_a_tombstone_still_says_deleted_and_an_empty_log_says_nothing) {
  ReplicaArgs args;
  args.tenant = "acme";
  args.replica = url_;
  auto empty = ReadReplicaTail(args, 5, kAny);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty->objects, 0u);
  EXPECT_TRUE(empty->tail.empty());
  EXPECT_FALSE(empty->restorable_from_ms.has_value());
  WriteEveryKind(*log_);
  log_->Take(3, kT0 + 700);
  auto tail = ReadReplicaTail(args, 2, kAny);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  EXPECT_EQ(tail->tail.back().kind, "marker");
  EXPECT_TRUE(tail->deleted);
  EXPECT_EQ(tail->newest_epoch, 3u);
}

TEST_F(ReplicaCli, an_object_above_the_stores_counter_is_refused_not_the_newest_epoch) {
  WriteEveryKind(*log_);
  {
    // Forged: written by anyone who can write the destination.
    replica::LogWriter forger(*dest_, kLogDir);
    auto took = forger.Takeover(std::uint64_t{1} << 62, kAny);
    ASSERT_TRUE(took.ok() && took->kind == replica::TakeoverKind::kReady);
    auto marked = forger.WriteMarker(kT0 + 700, kAny);
    ASSERT_TRUE(marked.ok() && marked->kind == replica::LogWriteKind::kAppended);
  }
  auto tail = ReadLogTail(*dest_, kLogDir, 3, 5);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  ASSERT_EQ(tail->tail.size(), 3u);
  EXPECT_TRUE(tail->tail.back().refused);
  EXPECT_EQ(tail->tail.back().epoch, std::uint64_t{1} << 62);
  EXPECT_FALSE(tail->tail.front().refused);
  EXPECT_EQ(tail->newest_epoch, 2u);
  EXPECT_EQ(tail->restorable_to_ms, kT0 + 600);
  EXPECT_TRUE(tail->deleted);
}

TEST_F(ReplicaCli, the_tail_of_a_log_without_a_snapshot_reads_a_bounded_number_of_headers) {
  log_->Take(1, kT0);
  for (int i = 1; i < 40; ++i) log_->Segment({{kT0 + i, 'x'}});
  replica::CountingDestination counted(dest_);
  auto tail = ReadLogTail(counted, kLogDir, 3, kAny);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  EXPECT_EQ(tail->objects, 40u);
  EXPECT_FALSE(tail->restorable_from_ms.has_value());
  EXPECT_EQ(tail->newest_epoch, 1u);
  const auto n = counted.counts();
  EXPECT_LE(n.gets + n.heads, 3 + kTailSnapshotSearch) << "headers read: " << n.gets + n.heads;
}

TEST_F(ReplicaCli, ls_json_gives_each_objects_header_and_the_summary_in_ms) {
  WriteEveryKind(*log_);
  const Ran ran = Ls(true);
  ASSERT_EQ(ran.code, 0) << ran.err;
  auto object = [&](std::uint64_t seq, const char* kind, std::uint64_t epoch, WallMs first,
                    WallMs last, std::uint64_t db_size, std::uint32_t commits) {
    return Json{
        {"seq", seq},      {"kind", kind},       {"epoch", epoch},     {"first_ms", first},
        {"last_ms", last}, {"db_size", db_size}, {"commits", commits}, {"bytes", ObjectBytes(seq)}};
  };
  const Json expected = {{"tenant", "acme"},
                         {"key", "176/acme.db"},
                         {"replica", url_},
                         {"objects",
                          {object(0, "marker", 1, kT0, kT0, 0, 0),
                           object(1, "snapshot", 1, kT0 + 100, kT0 + 100, kLogPage, 0),
                           object(2, "segment", 1, kT0 + 200, kT0 + 300, 2 * kLogPage, 2),
                           object(3, "marker", 2, kT0 + 400, kT0 + 400, 0, 0),
                           object(4, "segment", 2, kT0 + 500, kT0 + 500, 2 * kLogPage, 1),
                           object(5, "tombstone", 2, kT0 + 600, kT0 + 600, 0, 0)}},
                         {"newest_epoch", 2},
                         {"deleted", true},
                         {"restorable_from_ms", kT0 + 100},
                         {"restorable_to_ms", kT0 + 600}};
  EXPECT_EQ(Json::parse(ran.out), expected) << ran.out;
}

TEST_F(ReplicaCli, ls_of_an_empty_log_says_the_replica_holds_nothing_and_json_lists_no_objects) {
  const Ran text = Ls(false);
  EXPECT_EQ(text.code, 1);
  EXPECT_EQ(text.err, "fleetfs: replica " + url_ +
                          " holds nothing for 176/acme.db (its log 176/acme.db is empty)\n");
  const Ran json = Ls(true);
  ASSERT_EQ(json.code, 0) << json.err;
  const Json doc = Json::parse(json.out);
  EXPECT_EQ(doc["objects"], Json::array());
  EXPECT_EQ(doc["newest_epoch"], nullptr);
  EXPECT_EQ(doc["deleted"], false);
  EXPECT_EQ(doc["restorable_from_ms"], nullptr);
  EXPECT_EQ(doc["restorable_to_ms"], nullptr);
}

// A real database's log: marker 0, snapshot 1 (row 1), segment 2 (rows 2
// and 3), segment 3 (row 4).
void WriteDatabaseLog(LogBuilder& log, Database& db,
                      replica::SnapshotOwner owner = {1000, 1000, 0600}) {
  log.Take(1, kT0);
  log.Recreate(db.Insert(1));
  log.Snapshot(kT0 + 100, owner);
  std::string row2 = db.Insert(2);
  std::string row3 = db.Insert(3);
  log.Commits({{kT0 + 200, row2}, {kT0 + 300, row3}});
  log.Commits({{kT0 + 400, db.Insert(4)}});
}

TEST_F(ReplicaCli, verify_reads_the_whole_chain_restores_the_newest_state_and_checks_integrity) {
  Database db(dir_.File("work.db"));
  WriteDatabaseLog(*log_, db);
  const Ran ran = Verify();
  ASSERT_EQ(ran.code, 0) << ran.err;
  std::uint64_t bytes = 0;
  for (std::uint64_t seq = 0; seq <= 3; ++seq) bytes += ObjectBytes(seq);
  EXPECT_EQ(ran.out, "ok: 176/acme.db at " + url_ +
                         "\n"
                         "  log         objects 0 to 3 (4, " +
                         std::to_string(bytes) +
                         " bytes), epochs 1 to 1, chain ok\n"
                         "  restored    snapshot 1 and 3 commits after it (through object 3), as "
                         "of 2026-01-01T00:00:00.400 UTC, " +
                         std::to_string(db.Bytes().size()) +
                         " bytes\n"
                         "  integrity   PRAGMA integrity_check: ok\n");
}

TEST_F(ReplicaCli, verify_of_a_wal_database_leaves_nothing_in_the_temporary_directory) {
  Database db(dir_.File("work.db"));
  {
    // WAL in the header: the restored copy opens in WAL mode, and a
    // read-only connection leaves its -wal and -shm behind when it closes.
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(dir_.File("work.db").c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(raw);
  }
  WriteDatabaseLog(*log_, db);
  const std::string tmp = dir_.File("tmp");
  std::filesystem::create_directories(tmp);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const Ran ran = Verify();
  if (old) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  ASSERT_EQ(ran.code, 0) << ran.err;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << left.size() << " left, first " << left.front();
}

TEST_F(ReplicaCli, verify_names_a_damaged_object_even_before_the_newest_snapshot) {
  Database db(dir_.File("work.db"));
  WriteDatabaseLog(*log_, db);
  log_->Recreate(db.Insert(5));
  log_->Snapshot(kT0 + 500);  // 4: a restore of the newest state starts here
  std::string seg = Slurp(ObjectFile(2));
  seg.back() ^= 1;
  std::ofstream(ObjectFile(2), std::ios::binary | std::ios::trunc) << seg;
  const Ran ran = Verify();
  EXPECT_EQ(ran.code, 1);
  EXPECT_EQ(ran.out, "");
  EXPECT_NE(ran.err.find("verify 176/acme.db: replica log object " + url_ +
                         "/176/acme.db/00000000000000000002: "),
            std::string::npos)
      << ran.err;
  EXPECT_NE(ran.err.find("checksum"), std::string::npos) << ran.err;
}

TEST_F(ReplicaCli, restore_writes_the_newest_state_with_the_tenant_files_mode_and_owner) {
  Database db(dir_.File("work.db"));
  WriteDatabaseLog(*log_, db, replica::SnapshotOwner{1234, 5678, 0640});
  const Ran ran = Restore();
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(Slurp(output_), db.Bytes());
  EXPECT_EQ(Rows(output_), (std::vector<int>{1, 2, 3, 4}));
  struct stat st;
  ASSERT_EQ(::stat(output_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  std::string owner = std::to_string(::geteuid()) + ":" + std::to_string(::getegid());
  if (::geteuid() == 0) {  // only root can give a file away
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 5678u);
    owner = "1234:5678";
  }
  EXPECT_EQ(ran.out, "restored 176/acme.db to " + output_ +
                         ": as of 2026-01-01T00:00:00.400 UTC (object 3 of the log, whose newest "
                         "epoch is 1), 3 commits after its snapshot, " +
                         std::to_string(db.Bytes().size()) + " bytes, mode 0640, owner " + owner +
                         "\n");
}

TEST_F(ReplicaCli, restore_at_a_time_between_two_segments_gives_exactly_the_commits_up_to_then) {
  Database db(dir_.File("work.db"));
  WriteDatabaseLog(*log_, db);
  // Between segment 2's second commit (300) and segment 3 (400); the local
  // time form and the milliseconds form say the same.
  for (const std::string& at :
       {"@" + std::to_string(kT0 + 350), std::string("2026-01-01T00:00:00.35")}) {
    const Ran ran = Restore(at);
    ASSERT_EQ(ran.code, 0) << at << ": " << ran.err;
    EXPECT_EQ(Rows(output_), (std::vector<int>{1, 2, 3})) << at;
    EXPECT_EQ(Slurp(output_), log_->StateAt(kT0 + 350)) << at;
    EXPECT_NE(ran.out.find("as of 2026-01-01T00:00:00.300 UTC (object 2 of the log"),
              std::string::npos)
        << ran.out;
    EXPECT_NE(ran.out.find(", 2 commits after its snapshot"), std::string::npos) << ran.out;
    std::filesystem::remove(output_);
  }
  // Between the two commits of segment 2.
  const Ran ran = Restore("@" + std::to_string(kT0 + 250));
  ASSERT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(Rows(output_), (std::vector<int>{1, 2}));
}

TEST_F(ReplicaCli, restore_of_a_deleted_key_says_when_and_leaves_no_file) {
  WriteEveryKind(*log_);
  const Ran ran = Restore();
  EXPECT_EQ(ran.code, 1);
  EXPECT_EQ(ran.err,
            "fleetfs: 176/acme.db was deleted at 2026-01-01T00:00:00.600 UTC (tombstone, object 5 "
            "of its log)\n");
  EXPECT_FALSE(std::filesystem::exists(output_));
  // Before the deletion, the state of then.
  const Ran before = Restore("@" + std::to_string(kT0 + 550));
  ASSERT_EQ(before.code, 0) << before.err;
  EXPECT_EQ(Slurp(output_), log_->StateAt(kT0 + 550));
}

TEST_F(ReplicaCli, restore_of_an_empty_log_says_the_replica_holds_nothing) {
  const Ran ran = Restore();
  EXPECT_EQ(ran.code, 1);
  EXPECT_EQ(ran.err, "fleetfs: replica " + url_ +
                         " holds nothing for 176/acme.db (no snapshot in its log)\n");
  EXPECT_FALSE(std::filesystem::exists(output_));
}

TEST_F(ReplicaCli, a_key_in_the_old_replica_layout_is_refused_by_every_command) {
  std::filesystem::create_directories(replica_dir_ +
                                      "/176/acme.db/e00000000000000000001-g00000000");
  for (auto [name, ran] : {std::pair{"ls", Ls(false)}, std::pair{"ls --json", Ls(true)},
                           std::pair{"verify", Verify()}, std::pair{"restore", Restore()},
                           std::pair{"restore --at", Restore("@" + std::to_string(kT0))}}) {
    EXPECT_EQ(ran.code, 1) << name;
    EXPECT_EQ(ran.out, "") << name;
    EXPECT_NE(ran.err.find("a generation directory of the old replica layout"), std::string::npos)
        << name << ": " << ran.err;
    EXPECT_NE(ran.err.find("replica log " + url_ + "/176/acme.db"), std::string::npos)
        << name << ": " << ran.err;
  }
  EXPECT_FALSE(std::filesystem::exists(output_));
}

TEST_F(ReplicaCli,
       a_restore_at_a_time_before_retention_is_refused_naming_the_oldest_restorable_time) {
  log_->Take(1, kT0);  // 0
  log_->Recreate(std::string(kLogPage, 'a'));
  log_->Snapshot(kT0 + 100);          // 1
  log_->Segment({{kT0 + 150, 'b'}});  // 2
  log_->Snapshot(kT0 + 200);          // 3
  log_->Segment({{kT0 + 250, 'c'}});  // 4
  auto pruned = replica::PruneLog(*dest_, kLogDir, kT0 + 220, LogBuilder::kMaxEpoch);
  ASSERT_TRUE(pruned.ok()) << pruned.status().message();
  ASSERT_EQ(*pruned, 3);
  const Ran ran = Restore("@" + std::to_string(kT0 + 150));
  EXPECT_EQ(ran.code, 1);
  EXPECT_EQ(ran.err,
            "fleetfs: 176/acme.db cannot be restored at 2026-01-01T00:00:00.150 UTC: "
            "retention at " +
                url_ +
                " kept nothing that old; the oldest restorable time is "
                "2026-01-01T00:00:00.200 UTC (--at @" +
                std::to_string(kT0 + 200) + ", snapshot 3 of the log)\n");
  EXPECT_FALSE(std::filesystem::exists(output_));
  const Ran oldest = Restore("@" + std::to_string(kT0 + 200));
  EXPECT_EQ(oldest.code, 0) << oldest.err;
}

}  // namespace
}  // namespace fleetfs::agent
