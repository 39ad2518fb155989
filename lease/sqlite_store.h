// SqliteStore: the ownership table in a SQLite control database, the embedded
// default, good for every agent of one host.
//
// Each decision is one BEGIN IMMEDIATE transaction: two connections racing a
// claim are serialized by SQLite's write lock, and the loser sees the winner's
// row and gets Held. A connection waits for the write lock (busy timeout)
// instead of failing with "database is locked". The decision's time is read
// after the lock is taken, so decisions are ordered in time as they are in the
// table. The database runs in WAL mode with synchronous=FULL: a granted epoch
// is on disk before the grant is answered, so the counter never goes back.
//
// The schema is fleetfs's own (tables fleetfs_slot_owners and
// fleetfs_epoch_counter), marked by PRAGMA application_id; a database of
// another application is refused, never changed.
//
// Thread-safety: all calls are safe from any thread; each takes a pooled
// connection of its own.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "lease/ownership_store.h"

struct sqlite3;

namespace fleetfs::lease {

class SqliteStore final : public OwnershipStore {
 public:
  enum class Access {
    kCreate,    // make the file and its schema when missing (claims, the agent)
    kExisting,  // refuse a missing file; never write the schema (listing)
  };

  struct Options {
    Access access = Access::kCreate;
    // How long a decision waits for another process's write lock.
    Millis busy_timeout{10'000};
  };

  // Opens (and with kCreate, initializes) the control database at `path`.
  // `clock` gives lease times and must outlive the store.
  static Result<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                   const WallClock& clock, Options options);
  ~SqliteStore() override;

  struct Connection;  // one pooled sqlite3 connection and its busy state

  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override;
  Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                         Millis ttl) override;
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override;
  Result<OwnershipTable> Read() override;
  WallMs NowMs() const override { return clock_.NowMs(); }
  std::string url() const override { return "sqlite://" + path_; }

 private:
  using ConnectionPtr = std::unique_ptr<Connection>;

  SqliteStore(std::string path, const WallClock& clock, Options options);

  Result<ConnectionPtr> Acquire();
  void Return(ConnectionPtr connection);
  // Runs `decide` on the table loaded inside one BEGIN IMMEDIATE transaction
  // and writes what it changed; a decision that fails writes nothing.
  template <typename T, typename Decide>
  Result<T> Decide(Decide&& decide);

  const std::string path_;
  const WallClock& clock_;
  const Options options_;

  std::mutex mu_;                       // guards idle_
  std::vector<ConnectionPtr> idle_;     // connections not in use
};

}  // namespace fleetfs::lease
