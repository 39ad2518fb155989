// `fleetfs handoff` and `fleetfs drain`: send a request to the local agent
// through MOUNT/.fleetfs/control (accepted only from root or the agent's own
// user), then watch the ownership store until the target owner holds the
// range at a new epoch, and say how long the range was not served.
//
// Exit codes: 0 done (the target holds the range; a drain: every range
// released or taken); 1 the agent is not running, refused the caller, or
// abandoned the handoff (commits could not all be shipped in time; it
// serves the range again); 2 bad input (a range that is not exactly one of
// the agent's configured and served ranges, a bad owner id); 7 the target
// did not claim within --timeout (the range stays offered to it for one
// ttl, then anyone may claim it).
#pragma once

#include <ostream>
#include <string>

#include "fleet/clock.h"

namespace fleetfs::agent {

inline constexpr int kExitHandoffTimedOut = 7;

int RunHandoff(const std::string& range, const std::string& to, const std::string& mount,
               Millis timeout, std::ostream& out, std::ostream& err);
// `to` empty: release the ranges. `undo`: let them be claimed again.
int RunDrain(const std::string& to, bool undo, const std::string& mount, Millis timeout,
             std::ostream& out, std::ostream& err);

}  // namespace fleetfs::agent
