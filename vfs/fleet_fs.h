// FleetFs: the fleet root, a FUSE low-level passthrough of the backing
// directory filtered by the serving view (DESIGN section 3).
//
//   ROOT/BBB/            the 256 bucket directories, always listed
//   ROOT/BBB/<file>      a fleet file whose slot the view serves, else hidden
//   ROOT/.fleetfs/       read-only: status.json and ranges, made by the agent
//
// Every operation on an open handle checks, against the view it loaded, that
// the handle's slot is still served under the token it was opened with, and
// holds that view until it is done. Publishing a view that withdraws ranges
// queues a fence: a thread of the mount waits until no operation holds an
// older view (so writes already inside have finished or failed), then tells
// the kernel to forget the entries and cached pages of those ranges.
//
// Writes are write-through (no writeback cache, no kernel passthrough) and
// fleetfs implements no lock operation: the kernel keeps SQLite's POSIX
// locks, coherent for every process that uses the mount.
//
// An operation that changes a backing file is admitted again after anything
// it waited for (replication's hooks) and right before the backing call, and
// one whose backing call returned after its range's local lease ended is
// answered ESTALE. Every local user is an untrusted client: each handle has a
// kind checked by every handler, and an inode holds no descriptor (the
// backing file is opened by name under its bucket when needed), so what the
// kernel caches costs no descriptors.
//
// The parts: fleet_fs.cc (the FUSE handlers), inode_table (inode numbers),
// negative_names (absent names the kernel caches), fence (what the kernel is
// told when a range is withdrawn), control_files (.fleetfs/), permission
// (the kernel's access rule, for a create that finds a file), refusal_log
// (rate-limited log lines), and serving_view (the admission rule).
//
// Thread-safety: Publish, WaitForFences, stats and the open-handle counts
// are safe from any thread. The FUSE session runs on its own threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "fleet/clock.h"
#include "fleet/layout.h"
#include "fleet/status.h"
#include "fleet/tenant_hooks.h"
#include "vfs/fuse_transport.h"
#include "vfs/serving_view.h"
#include "vfs/vfs_stats.h"

namespace fleetfs::vfs {

struct MountOptions {
  std::string backing;     // absolute path of an existing directory
  std::string mountpoint;  // absolute path of an existing, unmounted directory
  FleetMode mode = FleetMode::kTenant;
  bool allow_create = true;  // false: creating a main file is refused (sidecars still work)
  int max_threads = 10;
  Transport transport = Transport::kAuto;
  const MonotonicClock* clock = nullptr;  // must outlive the mount
  // Times FUSE requests for the latency histograms; `clock` when null. Apart
  // so that a test that counts the lease clock's reads is not raced by
  // other requests' timing reads.
  const MonotonicClock* latency_clock = nullptr;
  // Contents of the virtual files under .fleetfs/, made when one is opened,
  // on a FUSE thread.
  std::function<std::string()> status_json;
  std::function<std::string()> ranges_text;
  std::function<std::string()> tenants_live;
  // Answers a request written to .fleetfs/control by an allowed caller (see
  // control_files.h), on the FUSE thread of the write; it may block briefly.
  // Unset: every request is refused.
  struct ControlReply {
    bool accepted = false;
    std::string text;  // read back from the descriptor; ends with a newline
  };
  std::function<ControlReply(std::string_view request)> control;
  // Called once, from the session's thread, when the session ends without
  // Unmount (someone unmounted it, or the kernel aborted the connection).
  std::function<void()> on_session_end;
  // Called on the FUSE thread just before a write, truncate, allocate, fsync
  // or unlink reaches the backing file: after its last admission check, with
  // the operation's views held. Tests use it to keep a call in flight.
  std::function<void()> before_backing_write;
  // Tests: called while Mount sets the transport up, once requests may
  // already be served (TransportOptions::serving_before_start_returns).
  std::function<void()> serving_before_mount_returns;
  // Replication (may be null): told of every change to a main file, -wal or
  // -journal before it reaches the disk, and asked to prepare each main file
  // before its first exposure under an epoch. Must outlive the mount.
  TenantHooks* hooks = nullptr;
};

class FleetFs {
 public:
  // Mounts and starts serving `initial`. Fails when the backing directory
  // cannot be opened or the kernel refuses the mount.
  static Result<std::unique_ptr<FleetFs>> Mount(MountOptions options,
                                                std::shared_ptr<const ServingView> initial);
  ~FleetFs();  // unmounts when Unmount was not called
  FleetFs(const FleetFs&) = delete;
  FleetFs& operator=(const FleetFs&) = delete;

  // Makes `view` the one every later operation checks, and queues the fence
  // of every range it withdraws. Returns at once.
  void Publish(std::shared_ptr<const ServingView> view);
  // Blocks until every fence queued so far is done.
  void WaitForFences();
  // Ends the session and removes the mount. Publish an empty view and wait
  // for its fence first: after this, open descriptors fail with ENOTCONN.
  void Unmount();

  // The transport in use: "io_uring" or "/dev/fuse". Known when Mount
  // returns; with kAuto, why io_uring was not used is in TransportWhy().
  std::string TransportName() const;
  std::string TransportWhy() const;  // empty when the asked-for one runs

  const VfsStats& stats() const;
  std::size_t OpenHandles() const;
  // Inodes the kernel holds a lookup of (forgets shrink it).
  std::size_t KnownInodes() const;
  std::size_t OpenHandlesIn(Slot first, Slot last) const;
  // Open handles per tenant (main path; its sidecars' handles count for it),
  // in no order: as many entries as tenants with open files.
  std::vector<std::pair<std::string, std::size_t>> OpenHandlesByTenant() const;

  class Impl;

 private:
  explicit FleetFs(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fleetfs::vfs
