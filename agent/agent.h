// Agent: `fleetfs mount`. Wires the ownership store, this host's leases, the
// FUSE mount and the admin server around one libuv loop that owns time.
//
// Start: volume lock, mount point (a stale mount is cleaned up), store,
// admin listener, first claim, then the mount. Run: refresh every ttl/3,
// wake at the next local lapse, run store calls on the thread pool, publish
// a new serving view on every change. SIGTERM/SIGINT: stop exposing, give
// open handles a bounded time, fence and flush on the pool while the loop
// keeps renewing, release when DESIGN section 2 allows, unmount, exit 0 (or
// kExitLapsed when held ranges lapse instead). A backing volume that turns
// read-only or fails writes (agent/backing_watch: the mount's counters, then
// a probe on the pool) stops serving and releases like a stop, then stands
// by in phase failed until a signal, and exits 1. The phases and the
// release rules are agent/lifecycle's; this file carries its decisions out.
//
// Thread-safety: Run blocks the calling thread, which becomes the loop
// thread. The status snapshot is read from FUSE threads too; everything it
// reads is thread-safe.
#pragma once

#include <ostream>

#include "agent/config.h"

namespace fleetfs::agent {

// Runs the agent until it is stopped; returns the process exit code (0 after
// a clean stop, 1 when it could not start or serve, 2 for bad configuration,
// kExitLapsed (5) when a stop left held ranges to lapse instead of releasing
// them). A non-zero code is explained on `err` when the agent could not
// start, and in the log (stderr) once it ran.
int RunAgent(const AgentConfig& config, std::ostream& err);

}  // namespace fleetfs::agent
