// The fleetfs command line: parses arguments, runs one command, and turns its
// Status into a message and an exit code (the one place that happens).
//
// Exit codes: 0 success; 1 a failure at run time (store unreachable, corrupt
// file); 2 bad input (the message names the thing and the rule); 3 the range
// is held by another owner; 4 the range was lost (not this owner's at this
// epoch); 5 (mount) stopped, but held ranges lapse instead of being released
// (kExitLapsed, agent/lifecycle.h); 6 (where) a key's slot is served by
// nobody now; (inspect) the tenant is not served by this agent now.
//
// Thread-safety: runs on the calling thread.
#pragma once

#include <ostream>

namespace fleetfs::agent {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitHeld = 3;
inline constexpr int kExitLost = 4;
// Not 5: that is kExitLapsed (agent/lifecycle.h).
inline constexpr int kExitUnserved = 6;
// 7: kExitHandoffTimedOut (agent/handoff_cli.h).

// Runs `fleetfs argv...`, writing results to `out` and errors to `err`.
int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace fleetfs::agent
