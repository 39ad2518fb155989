// SqliteStore: the ownership table in a SQLite control database, the embedded
// default, good for every agent of one host.
//
// Each decision is one BEGIN IMMEDIATE transaction: two connections racing a
// claim are serialized by SQLite's write lock, and the loser sees the winner's
// row and gets Held. A connection waits for the write lock (busy timeout)
// instead of failing with "database is locked". The decision's time is read
// after the lock is taken, so decisions are ordered in time as they are in the
// table. The database runs in WAL mode. A claim, the schema and its migration
// commit with synchronous=FULL: a granted epoch is on disk before the grant is
// answered, so the counter never goes back. A renewal or a release commits
// with synchronous=NORMAL (no sync): it survives a crash of the process but
// maybe not of the OS, which ends every lease of this boot anyway (the
// argument is beside Renew in sqlite_store.cc); so a disk whose syncs stall
// no longer holds up every renewal.
//
// Lease expiries are on the host's boot clock (CLOCK_BOOTTIME, which no
// `date -s` moves), with the boot id beside each row: a row written under
// another boot id (a reboot, or the file moved to another machine) has ended
// and loads lapsed, keeping its owner and epoch. The wall clock takes no part
// in a decision; ToWallMs turns an expiry into a wall time for display.
//
// The schema is fleetfs's own (tables fleetfs_slot_owners and
// fleetfs_epoch_counter), marked by PRAGMA application_id; a database of
// another application is refused, never changed. A database of schema 1
// (wall-clock expiries) is migrated in place, in one transaction, by the
// first Open with kCreate.
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
    // The clock leases are measured on; null: the host's (SystemBootClock).
    // Must outlive the store.
    const BootClock* boot = nullptr;
    // The SQLite VFS the connections use, by its registered name; empty: the
    // default. For tests that watch the store's file calls (its syncs).
    std::string vfs{};
  };

  // Opens (and with kCreate, initializes) the control database at `path`.
  // `wall` serves only ToWallMs and the migration of schema 1's wall-clock
  // expiries; it must outlive the store.
  static Result<std::unique_ptr<SqliteStore>> Open(const std::string& path, const WallClock& wall,
                                                   Options options);
  ~SqliteStore() override;

  struct Connection;  // one pooled sqlite3 connection and its busy state

  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override;
  Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                         Millis ttl) override;
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override;
  Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch, const OwnerId& to,
                     Millis window) override;
  bool keeps_offers() const override { return true; }
  Result<OwnershipTable> Read() override;
  // The boot clock: the frame of this store's expiries.
  BootMs NowMs() const override { return boot_.NowMs(); }
  WallMs ToWallMs(BootMs store_ms) const override;
  std::string url() const override { return "sqlite://" + path_; }

 private:
  using ConnectionPtr = std::unique_ptr<Connection>;

  SqliteStore(std::string path, const WallClock& wall, const BootClock& boot,
              std::unique_ptr<BootClock> owned_boot, Options options);

  Result<ConnectionPtr> Acquire();
  void Return(ConnectionPtr connection);
  // How a decision's COMMIT reaches the disk; why each decision has the one
  // it has is told in sqlite_store.cc.
  enum class Durability {
    kSynced,    // synchronous=FULL: the WAL is synced before COMMIT returns
    kUnsynced,  // synchronous=NORMAL: written to the WAL, not synced
  };

  // Runs `decide` on the table loaded inside one BEGIN IMMEDIATE transaction
  // and writes what it changed, committed with `durability`; a decision that
  // fails writes nothing.
  template <typename T, typename Decide>
  Result<T> Decide(Durability durability, Decide&& decide);

  const std::string path_;
  const WallClock& wall_;
  const std::unique_ptr<BootClock> owned_boot_;  // the host's, when none was passed in
  const BootClock& boot_;
  const Options options_;

  std::mutex mu_;                       // guards idle_
  std::vector<ConnectionPtr> idle_;     // connections not in use
};

}  // namespace fleetfs::lease
