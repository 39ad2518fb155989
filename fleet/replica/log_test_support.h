// Helpers shared by tests that need a key's replica log: a LogBuilder writes
// one through a real LogWriter (markers, snapshots, segments, tombstones) and
// keeps the database each commit leaves, so what a restore returns can be
// compared with it. Header-only, for gtest binaries (it asserts).
//
// Thread-safety: one builder per test thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fleet/replica/destination.h"
#include "fleet/replica/log_object.h"
#include "fleet/replica/log_writer.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica::testing {

inline constexpr const char* kLogDir = "176/acme.db";  // tenant "acme"
inline constexpr std::size_t kLogPage = 4096;

class LogBuilder {
 public:
  static constexpr std::uint64_t kMaxEpoch = 5;

  explicit LogBuilder(Destination& dest, std::string dir = kLogDir)
      : writer_(dest, std::move(dir)) {}

  // Takes the key at `epoch` and writes its marker, written at `at`.
  void Take(std::uint64_t epoch, WallMs at = 1) {
    auto t = writer_.Takeover(epoch, kMaxEpoch);
    ASSERT_TRUE(t.ok() && t->kind == TakeoverKind::kReady);
    auto m = writer_.WriteMarker(at, kMaxEpoch);
    ASSERT_TRUE(m.ok() && m->kind == LogWriteKind::kAppended);
  }
  // The file was created anew (after a deletion), holding `db`.
  void Recreate(std::string db) { db_ = std::move(db); }
  void Snapshot(WallMs as_of, SnapshotOwner owner = {1000, 1000, 0600}) {
    states_[as_of] = db_;
    UniqueFd src(::memfd_create("db", 0)), out(::memfd_create("snap", 0));
    ASSERT_EQ(::pwrite(src.get(), db_.data(), db_.size(), 0), static_cast<ssize_t>(db_.size()));
    auto sum = WriteLogSnapshot(src.get(), db_.size(), writer_.position(), as_of, owner, nullptr,
                                out.get());
    ASSERT_TRUE(sum.ok()) << sum.status().message();
    Appended(writer_.AppendFile(out.get(), *sum, kMaxEpoch));
  }
  // One segment; each commit writes page `page` full of `fill`.
  void Segment(std::vector<std::pair<WallMs, char>> commits, std::uint64_t page = 0) {
    std::vector<Txn> txns;
    for (auto [ms, fill] : commits) {
      const std::uint64_t off = page * kLogPage;
      if (db_.size() < off + kLogPage) db_.resize(off + kLogPage, '\0');
      db_.replace(off, kLogPage, std::string(kLogPage, fill));
      txns.push_back(Txn{ms, db_.size(), {PageWrite{off, std::string(kLogPage, fill)}}});
      states_[ms] = db_;
    }
    AppendSegment(txns);
  }
  // One segment; each commit leaves the database `db`, and writes the pages
  // in which it differs from the one before (a real database's commits).
  void Commits(std::vector<std::pair<WallMs, std::string>> commits) {
    std::vector<Txn> txns;
    for (auto& [ms, db] : commits) {
      Txn t{ms, db.size(), {}};
      for (std::uint64_t off = 0; off < db.size(); off += kLogPage) {
        std::string page = db.substr(off, kLogPage);
        if (db_.compare(std::min<std::uint64_t>(off, db_.size()), kLogPage, page) != 0) {
          t.writes.push_back(PageWrite{off, std::move(page)});
        }
      }
      db_ = std::move(db);
      states_[ms] = db_;
      txns.push_back(std::move(t));
    }
    AppendSegment(txns);
  }
  // A segment of exactly these transactions; the builder's own database is
  // not changed (for objects no writer makes).
  void RawSegment(const std::vector<Txn>& txns) { AppendSegment(txns); }
  void Tombstone(WallMs at) {
    auto t = EncodeLogTombstone(writer_.position(), at);
    ASSERT_TRUE(t.ok());
    Appended(writer_.Append(*t, kMaxEpoch));
    db_.clear();
    states_[at] = db_;
  }
  // The database after the last commit at or before `ms`.
  std::string StateAt(WallMs ms) const {
    auto it = states_.upper_bound(ms);
    return it == states_.begin() ? std::string() : std::prev(it)->second;
  }
  const std::string& db() const { return db_; }
  const LogPosition& position() const { return writer_.position(); }

 private:
  void AppendSegment(const std::vector<Txn>& txns) {
    auto seg = EncodeLogSegment(writer_.position(), txns);
    ASSERT_TRUE(seg.ok()) << seg.status().message();
    Appended(writer_.Append(*seg, kMaxEpoch));
  }
  void Appended(const Result<LogWriteOutcome>& r) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->kind, LogWriteKind::kAppended);
  }
  LogWriter writer_;
  std::string db_;
  std::map<WallMs, std::string> states_;
};

}  // namespace fleetfs::replica::testing
