// The agent as a systemd Type=notify service (sd_notify(3)): READY=1 once it
// serves, STATUS= with the serving summary, STOPPING=1 at the stop signal,
// and WATCHDOG=1 from the loop while the loop is healthy.
//
// READY=1 is sent once the agent is in phase serving with the mount up
// ("mounted ...") and either serves a range ("serving range ..." logged) or
// has had every configured range answered by the store in the latest round
// (claimed, renewed, lost, or held by another owner: a standby is ready, and
// claims when the holder lets go). Never while the store has not answered: a
// failed or timed-out first round reaches phase serving too, with nothing
// served. Units ordered after fleetfs.service start then, and find the mount.
//
// Healthy, for the watchdog: the ping runs on a loop timer, so a loop that
// is blocked does not ping at all; and the refresh machinery is not wedged.
// A refresh starts every ttl/3 and sends a store call per range not still
// waiting on one; a call answers (an error counts) or hangs. Rounds end at
// their time limit even when no call ran (a wedged pool), so what counts is
// store calls answered (Refresher::answered): none for ttl/3 + ttl while the
// agent renews means the calls no longer get through, and the ping is
// withheld so systemd restarts the agent (WatchdogSec later).
//
// ServiceAnnouncer and WatchdogHealth are pure (time is passed in); the
// SystemdNotifier shell sends on a non-blocking socket of its own and is a no-op when
// NOTIFY_SOCKET is unset.
//
// Thread-safety: none; the loop thread owns all three.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/lifecycle.h"
#include "fleet/clock.h"

namespace fleetfs::agent {

// What the service manager is told about.
struct ServiceState {
  Phase phase = Phase::kStarting;
  bool mounted = false;
  std::size_t serving = 0;  // ranges served now
  std::size_t ranges = 0;   // ranges configured
  std::size_t answered = 0;  // ranges the store answered in the latest round (a decision, not an error)
  std::size_t open_files = 0;
  std::optional<double> lag_s;  // the largest replication lag; nullopt with replication off
  std::string failure;          // why the agent stood down (phase failed)
};

// "serving 2 of 3 ranges, 14 open files, lag 0.4s"; other phases lead with
// their name ("draining: serving 0 of 3 ranges, 2 open files").
std::string StatusLine(const ServiceState& state);

// Which notify messages a state change calls for.
class ServiceAnnouncer {
 public:
  // "READY=1" the first time the agent is ready (the file comment), and
  // "STATUS=..." whenever the line changed; empty when nothing is new.
  std::vector<std::string> Update(const ServiceState& state);
  // "STOPPING=1" the first time; nullopt after.
  std::optional<std::string> Stopping();

 private:
  bool ready_sent_ = false;
  bool stopping_sent_ = false;
  std::string last_status_;
};

// Whether the loop may ping the watchdog (see the file comment).
class WatchdogHealth {
 public:
  WatchdogHealth(Millis ttl, MonoTime start) : ttl_(ttl), last_progress_(start) {}
  // At a watchdog tick: `renews` is the lifecycle's renews(), `answered`
  // the count of store calls answered so far. nullopt: healthy, ping; else why
  // not, for the log.
  std::optional<std::string> Check(MonoTime now, bool renews, std::uint64_t answered);
  // How long without a store call answering counts as wedged.
  Millis overdue_after() const { return ttl_ / 3 + ttl_; }

 private:
  Millis ttl_;
  MonoTime last_progress_;  // the last tick that saw a new answer, or not renewing
  std::uint64_t refreshes_seen_ = 0;
};

// How long systemd must give the agent for what is left of a stop begun in
// `phase` (EXTEND_TIMEOUT_USEC=): draining waits up to shutdown_grace for open
// files, then fencing and shipping the last commits take up to a ttl and
// releasing the slots ttl/3 to settle and ttl/3 to confirm; `margin` covers
// the unmount and the exit. The unit's TimeoutStopSec is fixed, ttl and grace
// are not (up to 3600s and 600s): a kill mid-flush loses commits.
Millis StopTimeBound(Phase phase, Millis ttl, Millis shutdown_grace, Millis margin);
// The same for the start: the first refresh round ends within ttl/3 and its
// claims within another ttl/3.
Millis StartTimeBound(Millis ttl, Millis margin);
// "EXTEND_TIMEOUT_USEC=<bound in microseconds>".
std::string ExtendTimeout(Millis bound);

// sd_notify(3)'s protocol on a socket of its own, non-blocking: libsystemd's
// sd_notify blocks in sendmsg when nobody reads NOTIFY_SOCKET (its queue holds
// few datagrams), and a blocked send on the loop stops the agent, stop signal
// included. A full socket drops STATUS= and WATCHDOG=1 (the next one follows);
// READY=1, STOPPING=1 and EXTEND_TIMEOUT_USEC= (the latest of these wins) are
// kept and sent again by Flush.
class SystemdNotifier {
 public:
  // Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (sd_watchdog_enabled).
  SystemdNotifier();
  // Sends to the socket at `path` ("@name": the abstract namespace); tests.
  explicit SystemdNotifier(const std::string& path);
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;
  // NOTIFY_SOCKET is set: the agent runs under a service manager that listens.
  bool active() const { return active_; }
  // The watchdog interval when systemd asked for pings of this process.
  std::optional<Millis> watchdog_interval() const { return watchdog_; }
  // Sends one message ("READY=1") without blocking; a failure is logged
  // once, never fatal. true: sent now.
  bool Send(const std::string& message);
  // Sends again what a full socket kept; from a loop timer.
  void Flush();
  // Kept messages not yet sent.
  const std::vector<std::string>& pending() const { return pending_; }

 private:
  void Open(const std::string& path);
  // 1: sent; 0: the socket is full (EAGAIN); -1: failed otherwise.
  int TrySend(const std::string& message);
  void Keep(const std::string& message);

  bool active_ = false;
  bool send_failed_ = false;
  int fd_ = -1;
  std::string address_;  // a sockaddr_un, as bytes
  std::vector<std::string> pending_;
  std::optional<Millis> watchdog_;
};

}  // namespace fleetfs::agent
