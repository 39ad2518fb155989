#include "agent/systemd_notify.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

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
  // Phase serving is reached only with the mount up, after the first refresh
  // round answered and its claims were put in the view.
  if (!ready_sent_ && state.mounted && state.phase == Phase::kServing) {
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
                                                 std::uint64_t refreshes_ended) {
  if (!renews || refreshes_ended != refreshes_seen_) {
    refreshes_seen_ = refreshes_ended;
    last_progress_ = now;
    return std::nullopt;
  }
  if (now - last_progress_ <= overdue_after()) return std::nullopt;
  return "no refresh round has ended for " +
         std::to_string(std::chrono::duration_cast<Millis>(now - last_progress_).count()) +
         " ms (a round ends at least every 2/3 ttl; " +
         std::to_string(overdue_after().count()) + " ms means it is wedged)";
}

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  active_ = socket != nullptr && *socket != '\0';
  std::uint64_t usec = 0;
  if (active_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    watchdog_ = std::chrono::duration_cast<Millis>(std::chrono::microseconds(usec));
    if (*watchdog_ < Millis(1)) watchdog_ = Millis(1);
  }
}

void SystemdNotifier::Send(const std::string& message) {
  if (!active_) return;
  const int r = sd_notify(0, message.c_str());
  if (r < 0 && !send_failed_) {
    send_failed_ = true;
    spdlog::warn("could not tell the service manager '{}' through NOTIFY_SOCKET: {}", message,
                 std::strerror(-r));
  }
}

}  // namespace fleetfs::agent
