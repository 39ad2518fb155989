#include "agent/systemd_notify.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

namespace fleetfs::agent {
namespace {

using Messages = std::vector<std::string>;

constexpr Millis kTtl{30000};

ServiceState Serving(std::size_t serving, std::size_t ranges, std::size_t open_files) {
  ServiceState s;
  s.phase = Phase::kServing;
  s.mounted = true;
  s.serving = serving;
  s.ranges = ranges;
  s.open_files = open_files;
  return s;
}

TEST(StatusLineTest, serving_names_the_ranges_the_open_files_and_the_lag) {
  ServiceState s = Serving(2, 3, 14);
  s.lag_s = 0.43;
  EXPECT_EQ(StatusLine(s), "serving 2 of 3 ranges, 14 open files, lag 0.4s");
}

TEST(StatusLineTest, without_replication_there_is_no_lag_and_one_is_singular) {
  EXPECT_EQ(StatusLine(Serving(1, 1, 1)), "serving 1 of 1 range, 1 open file");
}

TEST(StatusLineTest, other_phases_lead_with_their_name_and_a_failure_says_why) {
  ServiceState s = Serving(0, 3, 2);
  s.phase = Phase::kDraining;
  EXPECT_EQ(StatusLine(s), "draining: serving 0 of 3 ranges, 2 open files");
  s.phase = Phase::kFailed;
  s.failure = "the backing volume is read-only";
  s.open_files = 0;
  EXPECT_EQ(StatusLine(s),
            "failed (the backing volume is read-only): serving 0 of 3 ranges, 0 open files");
}

TEST(ServiceAnnouncerTest, ready_waits_for_the_mount_and_phase_serving_and_is_sent_once) {
  ServiceAnnouncer a;
  ServiceState starting;
  starting.ranges = 3;
  EXPECT_EQ(a.Update(starting), (Messages{"STATUS=starting: serving 0 of 3 ranges, 0 open files"}));

  ServiceState claimed_not_mounted = Serving(2, 3, 0);
  claimed_not_mounted.mounted = false;
  claimed_not_mounted.phase = Phase::kStarting;
  for (const std::string& m : a.Update(claimed_not_mounted)) EXPECT_NE(m, "READY=1");

  EXPECT_EQ(a.Update(Serving(2, 3, 0)), (Messages{"READY=1", "STATUS=serving 2 of 3 ranges, 0 open files"}));
  EXPECT_EQ(a.Update(Serving(3, 3, 0)), (Messages{"STATUS=serving 3 of 3 ranges, 0 open files"}));
}

TEST(ServiceAnnouncerTest, a_range_held_elsewhere_does_not_delay_ready) {
  ServiceAnnouncer a;
  ServiceState standby = Serving(0, 1, 0);
  standby.answered = 1;  // the store answered: another owner holds it
  EXPECT_EQ(a.Update(standby), (Messages{"READY=1", "STATUS=serving 0 of 1 range, 0 open files"}));
}

TEST(ServiceAnnouncerTest, an_unchanged_status_sends_nothing) {
  ServiceAnnouncer a;
  a.Update(Serving(1, 1, 4));
  EXPECT_EQ(a.Update(Serving(1, 1, 4)), Messages{});
}

TEST(ServiceAnnouncerTest, stopping_is_sent_once) {
  ServiceAnnouncer a;
  EXPECT_EQ(a.Stopping(), "STOPPING=1");
  EXPECT_EQ(a.Stopping(), std::nullopt);
}

class WatchdogHealthTest : public ::testing::Test {
 protected:
  MonoTime now_{std::chrono::seconds(1000)};
  WatchdogHealth health_{kTtl, now_};
};

TEST_F(WatchdogHealthTest, refresh_rounds_that_end_keep_the_loop_healthy) {
  std::uint64_t rounds = 0;
  for (int i = 0; i < 100; ++i) {
    now_ += kTtl * 2 / 3;  // the slowest a round may end: started every ttl/3, limit ttl/3
    EXPECT_EQ(health_.Check(now_, true, ++rounds), std::nullopt) << "tick " << i;
  }
}

TEST_F(WatchdogHealthTest, no_round_ending_for_a_ttl_past_the_interval_withholds_the_ping) {
  EXPECT_EQ(health_.Check(now_, true, 1), std::nullopt);
  now_ += kTtl / 3 + kTtl;
  EXPECT_EQ(health_.Check(now_, true, 1), std::nullopt) << "exactly at the bound is still on time";
  now_ += Millis(1);
  std::optional<std::string> why = health_.Check(now_, true, 1);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "no store call has answered for 40001 ms (a call answers or times out within "
            "ttl/3, and one starts every ttl/3; 40000 ms means it is wedged)");
  now_ += Millis(1);
  EXPECT_EQ(health_.Check(now_, true, 2), std::nullopt) << "a round ended: healthy again";
}

TEST_F(WatchdogHealthTest, a_wedge_is_seen_from_the_start_when_the_first_round_never_ends) {
  now_ += kTtl * 2;
  EXPECT_TRUE(health_.Check(now_, true, 0).has_value());
}

TEST_F(WatchdogHealthTest, while_not_renewing_rounds_are_not_expected) {
  now_ += kTtl * 10;
  EXPECT_EQ(health_.Check(now_, false, 0), std::nullopt);
  now_ += kTtl;
  EXPECT_EQ(health_.Check(now_, true, 0), std::nullopt)
      << "renewing again: the wait starts over, not from the last round long ago";
}

TEST(ServiceAnnouncerTest, not_ready_until_a_range_serves_or_the_store_answered_every_range) {
  ServiceAnnouncer a;
  ServiceState s = Serving(0, 2, 0);  // phase serving after a failed first round
  EXPECT_EQ(a.Update(s), Messages{"STATUS=serving 0 of 2 ranges, 0 open files"})
      << "the store has not answered: not ready";
  s.answered = 1;
  EXPECT_EQ(a.Update(s), Messages{}) << "one of two answered";
  s.answered = 2;  // both held by another owner: a standby
  EXPECT_EQ(a.Update(s), Messages{"READY=1"});
  ServiceAnnouncer b;
  EXPECT_EQ(b.Update(Serving(1, 2, 0))[0], "READY=1") << "one range served is enough";
}

TEST(SystemdNotifierTest, without_notify_socket_it_is_inactive_and_sends_nothing) {
  ::unsetenv("NOTIFY_SOCKET");
  ::setenv("WATCHDOG_USEC", "30000000", 1);
  SystemdNotifier n;
  EXPECT_FALSE(n.active());
  EXPECT_EQ(n.watchdog_interval(), std::nullopt);
  n.Send("READY=1");  // a no-op: nothing to reach, nothing logged
  ::unsetenv("WATCHDOG_USEC");
}

TEST(SystemdNotifierTest, the_watchdog_interval_is_systemds_when_it_asked_this_process) {
  ::setenv("NOTIFY_SOCKET", "/nonexistent/notify", 1);
  ::setenv("WATCHDOG_USEC", "30000000", 1);
  ::unsetenv("WATCHDOG_PID");
  SystemdNotifier asked;
  EXPECT_TRUE(asked.active());
  EXPECT_EQ(asked.watchdog_interval(), Millis(30000));
  ::setenv("WATCHDOG_PID", "1", 1);  // another process's watchdog
  SystemdNotifier other;
  EXPECT_EQ(other.watchdog_interval(), std::nullopt);
  ::unsetenv("WATCHDOG_PID");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("NOTIFY_SOCKET");
}

// A datagram socket bound where the notifier sends, read by the test as
// systemd reads NOTIFY_SOCKET.
class FakeManager {
 public:
  FakeManager() {
    path_ = "/tmp/fleetfs-notify-test-" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ~FakeManager() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  // Fills the queue from another socket until the kernel says it is full.
  void Fill() {
    int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    while (::sendto(s, "X=1", 3, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&addr), sizeof addr) ==
           3) {
    }
    ::close(s);
  }
  // Everything queued, filler left out.
  Messages Drain() {
    Messages out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) return out;
      std::string m(buf, static_cast<std::size_t>(n));
      if (m != "X=1") out.push_back(m);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(SystemdNotifierTest, sends_without_blocking_and_a_full_socket_keeps_only_what_must_arrive) {
  FakeManager manager;
  SystemdNotifier n(manager.path());
  ASSERT_TRUE(n.active());
  EXPECT_TRUE(n.Send("STATUS=starting"));
  EXPECT_EQ(manager.Drain(), Messages{"STATUS=starting"});

  manager.Fill();
  // libsystemd's sd_notify would block here, and with it the agent's loop.
  EXPECT_FALSE(n.Send("READY=1"));
  EXPECT_FALSE(n.Send("STATUS=serving"));
  EXPECT_FALSE(n.Send("WATCHDOG=1"));
  EXPECT_FALSE(n.Send(ExtendTimeout(Millis(1000))));
  EXPECT_FALSE(n.Send("STOPPING=1"));
  EXPECT_FALSE(n.Send(ExtendTimeout(Millis(2000))));  // the latest extension wins
  EXPECT_EQ(n.pending(), (Messages{"READY=1", "STOPPING=1", "EXTEND_TIMEOUT_USEC=2000000"}));
  n.Flush();  // still full: nothing lost, nothing blocks
  EXPECT_EQ(n.pending().size(), 3u);

  EXPECT_EQ(manager.Drain(), Messages{});
  n.Flush();
  EXPECT_TRUE(n.pending().empty());
  EXPECT_EQ(manager.Drain(), (Messages{"READY=1", "STOPPING=1", "EXTEND_TIMEOUT_USEC=2000000"}));
}

TEST(StopTimeBoundTest, covers_grace_a_ttl_to_ship_and_two_thirds_of_one_to_release) {
  const Millis ttl(120000), grace(5000), margin(30000);
  EXPECT_EQ(StopTimeBound(Phase::kServing, ttl, grace, margin),
            Millis(5000 + 120000 + 40000 + 40000 + 30000));
  EXPECT_EQ(StopTimeBound(Phase::kDraining, ttl, grace, margin),
            Millis(5000 + 120000 + 40000 + 40000 + 30000));
  EXPECT_EQ(StopTimeBound(Phase::kStopping, ttl, grace, margin),
            Millis(120000 + 40000 + 40000 + 30000));
  EXPECT_EQ(StartTimeBound(ttl, margin), Millis(40000 + 40000 + 30000));
  EXPECT_EQ(ExtendTimeout(Millis(1500)), "EXTEND_TIMEOUT_USEC=1500000");
}

}  // namespace
}  // namespace fleetfs::agent
