#include "agent/systemd_notify.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fleetfs::agent {

std::string StatusLine(const ServiceState& state) {
  std::string line;
  if (state.phase == Phase::kFailed && !state.failure.empty()) {
    line = "failed (" + state.failure + "): ";
  } else if (state.phase != Phase::kServing) {
    line = std::string(PhaseName(state.phase)) + ": ";
  }
  line += "serving " + std::to_string(state.serving) + " of " + std::to_string(state.ranges) +
          (state.ranges == 1 ? " range, " : " ranges, ") + std::to_string(state.open_files) +
          (state.open_files == 1 ? " open file" : " open files");
  if (state.lag_s) {
    char lag[32];
    std::snprintf(lag, sizeof lag, ", lag %.1fs", *state.lag_s);
    line += lag;
  }
  return line;
}

std::vector<std::string> ServiceAnnouncer::Update(const ServiceState& state) {
  std::vector<std::string> out;
  const bool store_answered_all = state.ranges > 0 && state.answered == state.ranges;
  if (!ready_sent_ && state.mounted && state.phase == Phase::kServing &&
      (state.serving > 0 || store_answered_all)) {
    ready_sent_ = true;
    out.push_back("READY=1");
  }
  std::string status = StatusLine(state);
  if (status != last_status_) {
    out.push_back("STATUS=" + status);
    last_status_ = std::move(status);
  }
  return out;
}

std::optional<std::string> ServiceAnnouncer::Stopping() {
  if (stopping_sent_) return std::nullopt;
  stopping_sent_ = true;
  return "STOPPING=1";
}

std::optional<std::string> WatchdogHealth::Check(MonoTime now, bool renews,
                                                 std::uint64_t answered) {
  if (!renews || answered != refreshes_seen_) {
    refreshes_seen_ = answered;
    last_progress_ = now;
    return std::nullopt;
  }
  if (now - last_progress_ <= overdue_after()) return std::nullopt;
  return "no store call has answered for " +
         std::to_string(std::chrono::duration_cast<Millis>(now - last_progress_).count()) +
         " ms (a call answers or times out within ttl/3, and one starts every ttl/3; " +
         std::to_string(overdue_after().count()) + " ms means it is wedged)";
}

Millis StopTimeBound(Phase phase, Millis ttl, Millis shutdown_grace, Millis margin) {
  const Millis release = ttl / 3 + ttl / 3;
  switch (phase) {
    case Phase::kStarting:
    case Phase::kServing:
    case Phase::kDraining:
      return shutdown_grace + ttl + release + margin;
    case Phase::kStopping:
      return ttl + release + margin;
    case Phase::kStopped:
    case Phase::kFailed:
      return margin;
  }
  return shutdown_grace + ttl + release + margin;
}

Millis StartTimeBound(Millis ttl, Millis margin) { return ttl / 3 + ttl / 3 + margin; }

std::string ExtendTimeout(Millis bound) {
  return "EXTEND_TIMEOUT_USEC=" +
         std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(bound).count());
}

namespace {

bool MustArrive(const std::string& message) {
  return message == "READY=1" || message == "STOPPING=1" ||
         message.rfind("EXTEND_TIMEOUT_USEC=", 0) == 0;
}

}  // namespace

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || *socket == '\0') return;
  Open(socket);
  std::uint64_t usec = 0;
  if (active_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    watchdog_ = std::chrono::duration_cast<Millis>(std::chrono::microseconds(usec));
    if (*watchdog_ < Millis(1)) watchdog_ = Millis(1);
  }
}

SystemdNotifier::SystemdNotifier(const std::string& path) { Open(path); }

SystemdNotifier::~SystemdNotifier() {
  if (fd_ >= 0) ::close(fd_);
}

void SystemdNotifier::Open(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() < 2 || (path[0] != '/' && path[0] != '@') || path.size() >= sizeof addr.sun_path) {
    spdlog::warn("NOTIFY_SOCKET '{}' is not an AF_UNIX socket path (absolute or '@abstract'): "
                 "not telling the service manager anything",
                 path);
    return;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const std::size_t len = offsetof(sockaddr_un, sun_path) + path.size() + (path[0] == '/' ? 1 : 0);
  address_.assign(reinterpret_cast<const char*>(&addr), len);
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) {
    spdlog::warn("could not make a socket for NOTIFY_SOCKET '{}': {}", path, std::strerror(errno));
    return;
  }
  active_ = true;
}

int SystemdNotifier::TrySend(const std::string& message) {
  for (;;) {
    const ssize_t n =
        ::sendto(fd_, message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(address_.data()),
                 static_cast<socklen_t>(address_.size()));
    if (n >= 0) return 1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (!send_failed_) {
      send_failed_ = true;
      spdlog::warn("could not tell the service manager '{}' through NOTIFY_SOCKET: {}", message,
                   std::strerror(errno));
    }
    return -1;
  }
}

void SystemdNotifier::Keep(const std::string& message) {
  if (message.rfind("EXTEND_TIMEOUT_USEC=", 0) == 0) {
    // Latest wins: an older extension is counted from when it arrives, too late to matter.
    std::erase_if(pending_,
                  [](const std::string& m) { return m.rfind("EXTEND_TIMEOUT_USEC=", 0) == 0; });
  } else if (std::find(pending_.begin(), pending_.end(), message) != pending_.end()) {
    return;
  }
  pending_.push_back(message);
}

bool SystemdNotifier::Send(const std::string& message) {
  if (!active_) return false;
  // What is kept goes first: READY=1 before a later STOPPING=1.
  Flush();
  if (!pending_.empty()) {
    if (MustArrive(message)) Keep(message);
    return false;
  }
  const int r = TrySend(message);
  if (r == 0 && MustArrive(message)) Keep(message);
  return r == 1;
}

void SystemdNotifier::Flush() {
  while (active_ && !pending_.empty()) {
    const int r = TrySend(pending_.front());
    if (r == 0) return;
    pending_.erase(pending_.begin());  // sent, or failed for good (logged)
  }
}

}  // namespace fleetfs::agent
