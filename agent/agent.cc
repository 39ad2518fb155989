#include "agent/agent.h"

#include <signal.h>
#include <sys/resource.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <future>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "agent/admin_server.h"
#include "agent/backing_watch.h"
#include "agent/handoff.h"
#include "agent/journal_log.h"
#include "agent/lifecycle.h"
#include "agent/report.h"
#include "agent/stale_mount.h"
#include "agent/systemd_notify.h"
#include "agent/volume_lock.h"
#include "fleet/clock.h"
#include "fleet/layout.h"
#include "fleet/replica/counting_destination.h"
#include "fleet/replica/destination.h"
#include "fleet/replicator.h"
#include "lease/host_ownership.h"
#include "lease/lease_ttl.h"
#include "lease/refresher.h"
#include "lease/store_url.h"
#include "lease/timed_store.h"
#include "vfs/fleet_fs.h"
#include "vfs/serving_view.h"

namespace fleetfs::agent {
namespace {

using lease::Epoch;
using lease::SlotRange;

// Beyond the bounds of a phase, for the unmount and the exit (EXTEND_TIMEOUT_USEC=).
constexpr Millis kNotifyMargin{30000};

// Every inode the kernel caches holds a descriptor in the mount: the soft
// limit (often 1024) would run out long before the hard one.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("could not raise the open-file limit from {} to {}: {}", before, limit.rlim_max,
                 std::strerror(errno));
    return;
  }
  spdlog::info("raised the open-file limit from {} to {} (the hard limit)", before,
               limit.rlim_max);
}

// How often the loop reads the mount's error counters: relaxed atomic loads,
// cheap enough to do often, so a failing volume is acted on within a second.
constexpr Millis kBackingCheck{200};

// How often a host that does not hold one of its ranges looks for an offer
// to itself (a handoff's target): one cheap read of those ranges' rows.
constexpr Millis kOfferPoll{150};
// How long a request on .fleetfs/control waits for the loop to answer.
constexpr Millis kControlAnswer{5000};

int ExitCodeFor(const Status& status) {
  return status.code() == Code::kInvalidArgument ? 2 : 1;
}

class Agent {
 public:
  explicit Agent(const AgentConfig& config)
      : config_(config),
        lifecycle_(LifecycleOptions{config.ttl, config.shutdown_grace}),
        backing_watch_(BackingWatchOptions{config.backing}),
        handoffs_(HandoffOptions{config.shutdown_grace, config.ttl * 2 / 3, config.ttl}),
        offer_watch_(kOfferPoll) {}
  int Run(std::ostream& err);

 private:
  struct Work {
    uv_work_t req{};
    lease::Refresher::Task task;
    Agent* agent = nullptr;
  };
  // The fences and the final flush, on the pool: both wait on locks that
  // I/O holds, and the loop must keep renewing meanwhile.
  struct StopWork {
    uv_work_t req{};
    Agent* agent = nullptr;
    Millis flush_limit{0};
    bool all_shipped = true;  // written on the pool, read after it
  };
  // A probe of the backing volume: blocking I/O, on the pool.
  struct ProbeWork {
    uv_work_t req{};
    Agent* agent = nullptr;
    ProbeResult result;  // written on the pool, read after it
  };

  // The fences and the final flush of one range being handed off.
  struct RangeStopWork {
    uv_work_t req{};
    Agent* agent = nullptr;
    SlotRange range = SlotRange::All();
    // Set when queued: a busy pool must not start the limit late.
    MonoTime flush_deadline{};
    bool all_shipped = true;  // written on the pool, read after it
  };

  void Post(lease::Refresher::Task task);  // any thread
  // Runs `task` on the loop thread (any thread may call it).
  void OnLoop(std::function<void()> task);
  // A request written to .fleetfs/control, on a FUSE thread: answered by
  // the loop within kControlAnswer.
  vfs::MountOptions::ControlReply Control(std::string_view text);
  vfs::MountOptions::ControlReply HandleControl(const ControlRequest& request);
  // The handoffs' part of a step: their timers, the releases, offers seen.
  void StepHandoffs(MonoTime now);
  void ApplyHandoff(HandoffActions actions);
  void StartRangeStopWork(SlotRange range);
  void SendHandoffRelease(SlotRange range);
  void StartOfferRead();
  void RunPosted();
  void Step();
  // Carries out what the lifecycle decided, then arms the timer.
  void Apply(Actions actions);
  Observed Observe() const;
  void Arm(MonoTime wake);
  std::shared_ptr<const vfs::ServingView> BuildView();
  void Publish();
  Status MountNow();
  void StartStopWork();
  // The backing volume: the mount's counters read on the loop, a probe on
  // the pool, and the lifecycle told when the probe confirms a failure.
  void CheckBacking();
  void StartProbe();
  void BackingProbed(const ProbeResult& result);
  void LogBacking(const std::vector<BackingWatch::LogLine>& log) const;
  void MirrorBacking();
  void Finish();
  void CloseLoopHandles();
  AgentSnapshot Snapshot() const;
  // systemd (agent/systemd_notify): READY, STATUS and the watchdog's pings.
  void Announce();
  void WatchdogTick();
  // STOPPING=1 and EXTEND_TIMEOUT_USEC= for what is left of a stop in `phase`.
  void StopAnnounce(Phase phase);
  HttpResponse Serve(const std::string& method, const std::string& path) const;

  const AgentConfig& config_;
  SystemMonotonicClock mono_;
  SystemWallClock wall_;

  uv_loop_t loop_{};
  uv_timer_t wake_{};
  uv_timer_t backing_timer_{};
  uv_async_t posted_async_{};
  uv_signal_t sigterm_{};
  uv_signal_t sigint_{};
  uv_timer_t notify_timer_{};    // STATUS refreshes; runs only under a service manager
  uv_timer_t watchdog_timer_{};  // runs only when systemd asked for pings

  // Set once in Run before any reader starts; for ToWallMs of the display.
  std::shared_ptr<const lease::OwnershipStore> store_;
  // The same store, timing its calls for /metrics; set with store_.
  std::shared_ptr<const lease::TimedStore> timed_store_;
  std::unique_ptr<lease::Refresher> refresher_;
  std::unique_ptr<replica::Replicator> replicator_;  // null when replication is off
  // The destination the replicator ships through, counting its requests for
  // the reports; set before any thread reads it, null when replication is off.
  std::shared_ptr<replica::CountingDestination> destination_;
  std::unique_ptr<vfs::FleetFs> fs_;
  std::atomic<vfs::FleetFs*> fs_for_readers_{nullptr};  // set once mounted; read by any thread
  // fs_'s TransportName() and TransportWhy(), written once before
  // fs_for_readers_ is set; read only by those that loaded it non-null.
  std::string transport_name_, transport_why_;
  // The view the mount has now (set after it took it): a range is reported
  // serving only once its files can be looked up, never from the claim's
  // answer alone (a client that waits for "serving" and opens at once must
  // find its file). Read by any thread.
  mutable std::mutex published_mu_;
  std::shared_ptr<const vfs::ServingView> published_;
  std::unique_ptr<AdminServer> admin_;

  std::mutex posted_mu_;  // guards posted_ and on_loop_; never held across I/O
  std::vector<lease::Refresher::Task> posted_;
  std::vector<std::function<void()>> on_loop_;

  // Loop thread only.
  Lifecycle lifecycle_;
  ServingPlan plan_;
  BackingWatch backing_watch_;
  int work_in_flight_ = 0;
  bool stop_work_running_ = false;
  MonoTime next_refresh_{};
  Handoffs handoffs_;
  OfferWatch offer_watch_;
  MonoTime handoff_wake_ = MonoTime::max();
  bool claim_now_ = false;  // an offer to this host was seen: refresh at once
  SystemdNotifier notifier_;
  ServiceAnnouncer announcer_;
  std::optional<WatchdogHealth> watchdog_health_;
  bool watchdog_withheld_ = false;  // the last tick withheld the ping (logged once)
  Phase extended_for_ = Phase::kStarting;  // the stop phase EXTEND_TIMEOUT_USEC was last sent for

  // Mirrors of loop-thread state for readers on other threads (the status
  // files are made on FUSE threads).
  std::atomic<Phase> phase_{Phase::kStarting};
  std::atomic<bool> session_ended_{false};  // set by the FUSE session's thread
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Outcome::kCount)> outcomes_{};
  std::atomic<std::uint64_t> refreshes_{0};
  mutable std::mutex backing_mu_;  // guards the two below; never held across I/O
  BackingReport backing_report_;
  std::string failure_;  // the lifecycle's failure(): why the agent stood down
  std::vector<HandoffStatus> handoff_status_;  // guarded by backing_mu_: handoffs_.Report()
  std::mutex failures_mu_;  // guards last_failures_; never held across I/O
  std::map<SlotRange, std::string> last_failures_;
};

// ---- store calls on the thread pool ----

void Agent::Post(lease::Refresher::Task task) {
  {
    std::lock_guard lock(posted_mu_);
    posted_.push_back(std::move(task));
  }
  uv_async_send(&posted_async_);
}

void Agent::RunPosted() {
  if (session_ended_.exchange(false)) {
    spdlog::error("the mount at {} is gone", config_.mountpoint);
    Apply(lifecycle_.SessionEnded(mono_.Now(), Observe()));
    if (lifecycle_.phase() == Phase::kStopped) return;
  }
  std::vector<lease::Refresher::Task> tasks;
  std::vector<std::function<void()>> on_loop;
  {
    std::lock_guard lock(posted_mu_);
    tasks.swap(posted_);
    on_loop.swap(on_loop_);
  }
  for (auto& task : on_loop) task();
  if (lifecycle_.phase() == Phase::kStopped) return;
  if (!on_loop.empty()) Step();  // what they changed may change what is served
  for (auto& task : tasks) {
    auto* work = new Work;
    work->task = std::move(task);
    work->agent = this;
    work->req.data = work;
    ++work_in_flight_;
    uv_queue_work(
        &loop_, &work->req, [](uv_work_t* req) { static_cast<Work*>(req->data)->task(); },
        [](uv_work_t* req, int) {
          std::unique_ptr<Work> work(static_cast<Work*>(req->data));
          Agent* agent = work->agent;
          --agent->work_in_flight_;
          // An answer may change what is served.
          if (agent->lifecycle_.phase() != Phase::kStopped) agent->Step();
        });
  }
}

// ---- the serving view ----

std::shared_ptr<const vfs::ServingView> Agent::BuildView() {
  const MonoTime now = mono_.Now();
  ServingChange change = plan_.Update(refresher_->Status(), lifecycle_.serves(), now,
                                      handoffs_.draining(), handoffs_.withheld());
  for (const PlannedRange& p : change.started) {
    spdlog::info("serving range {} at epoch {} (local lease {} left)", p.range.ToString(),
                 p.epoch.value(),
                 lease::FormatDuration(std::chrono::duration_cast<Millis>(p.valid_until - now)));
  }
  if (replicator_) {
    // A new epoch: the range's tenants that are missing or stale here come
    // back from the replica in the background.
    for (const PlannedRange& p : change.warm) {
      replicator_->Warm(p.range.first(), p.range.last(), p.epoch.value());
    }
  }
  for (const WithdrawnRange& w : change.withdrawn) {
    spdlog::warn("stopped serving range {} at epoch {}: {}; hiding it and fencing its handles",
                 w.range.ToString(), w.epoch.value(), w.why);
  }
  std::vector<vfs::ServedRange> served;
  for (const PlannedRange& p : change.served) {
    served.push_back(vfs::ServedRange{p.range.first(), p.range.last(),
                                      vfs::ServingToken{p.epoch.value(), p.period},
                                      p.valid_until, p.accepting});
  }
  auto view = vfs::ServingView::Make(std::move(served), lifecycle_.admits_new_opens());
  if (!view.ok()) {
    // Configured ranges never overlap, so this is a broken invariant: serve nothing.
    spdlog::error("serving view refused: {}", view.status().message());
    return std::make_shared<const vfs::ServingView>();
  }
  return std::make_shared<const vfs::ServingView>(std::move(*view));
}

void Agent::Publish() {
  auto view = BuildView();
  if (fs_) fs_->Publish(view);
  std::lock_guard lock(published_mu_);
  published_ = fs_ ? std::move(view) : nullptr;
}

// ---- time ----

Observed Agent::Observe() const {
  Observed seen;
  seen.refreshes_ended = refreshes_.load();
  seen.store_call_running = refresher_->Unsettled();
  for (const lease::RangeStatus& st : refresher_->Status()) seen.held_ranges += st.epoch ? 1 : 0;
  seen.open_handles = fs_ ? fs_->OpenHandles() : 0;
  seen.released = static_cast<std::size_t>(std::max(0, refresher_->released()));
  return seen;
}

void Agent::Step() {
  if (lifecycle_.phase() == Phase::kStopped) return;
  const MonoTime now = mono_.Now();
  refresher_->Tick();  // ends a refresh past its time limit; the listener counts it
  StepHandoffs(now);
  if (lifecycle_.renews() && !refresher_->refresh_open() && (now >= next_refresh_ || claim_now_)) {
    if (refresher_->Start()) {
      next_refresh_ = now + config_.ttl / 3;
      claim_now_ = false;
    }
  }
  Apply(lifecycle_.Step(mono_.Now(), Observe()));
}

void Agent::Apply(Actions actions) {
  phase_ = lifecycle_.phase();
  for (const LogLine& line : actions.log) {
    switch (line.level) {
      case LogLine::Level::kInfo: spdlog::info("{}", line.text); break;
      case LogLine::Level::kWarn: spdlog::warn("{}", line.text); break;
      case LogLine::Level::kError: spdlog::error("{}", line.text); break;
    }
  }
  if (actions.mount) {
    Status mounted = MountNow();
    Apply(lifecycle_.Mounted(mono_.Now(), mounted, Observe()));
    return;
  }
  if (actions.publish) Publish();
  if (actions.stop_work) StartStopWork();
  if (actions.release) {
    lease::ReleasePlan plan = refresher_->StartRelease(actions.release->release);
    Apply(lifecycle_.ReleaseSent(mono_.Now(), plan.calls.size(), Observe()));
    return;
  }
  if (actions.finish) {
    Finish();
    return;
  }
  phase_ = lifecycle_.phase();
  Announce();
  Arm(actions.wake);
}

void Agent::Arm(MonoTime wake) {
  if (lifecycle_.phase() == Phase::kStopped) return;
  MonoTime next = wake;
  if (lifecycle_.renews()) {
    next = std::min({next, refresher_->NextWake(), next_refresh_, handoff_wake_});
    if (lifecycle_.phase() == Phase::kServing) {
      next = std::min(next, offer_watch_.next(refresher_->UnheldRanges()));
    }
  } else if (refresher_->refresh_open()) {
    next = std::min(next, refresher_->NextWake());  // to end it at its time limit
  }
  if (next == MonoTime::max()) {
    uv_timer_stop(&wake_);
    return;
  }
  const MonoTime now = mono_.Now();
  auto delay = std::chrono::ceil<Millis>(next - now).count();
  // libuv's clock has millisecond steps; waking 1 ms late beats waking early.
  uv_timer_start(&wake_, [](uv_timer_t* t) { static_cast<Agent*>(t->data)->Step(); },
                 static_cast<std::uint64_t>(std::max<std::int64_t>(delay, 0)) + 1, 0);
}

// ---- planned handovers ----

void Agent::OnLoop(std::function<void()> task) {
  {
    std::lock_guard lock(posted_mu_);
    on_loop_.push_back(std::move(task));
  }
  uv_async_send(&posted_async_);
}

vfs::MountOptions::ControlReply Agent::Control(std::string_view text) {
  auto parsed = ParseControlRequest(text);
  if (!parsed.ok()) {
    spdlog::warn("control: refused a request: {}", parsed.status().message());
    return {false, "error: " + parsed.status().message() + "\n"};
  }
  auto answer = std::make_shared<std::promise<vfs::MountOptions::ControlReply>>();
  std::future<vfs::MountOptions::ControlReply> future = answer->get_future();
  // 0 queued, 1 taken by the loop, 2 given up by the caller: a request the
  // caller was told to try again never runs later; one the loop has taken
  // is waited for, so the reply says what happened.
  auto state = std::make_shared<std::atomic<int>>(0);
  OnLoop([this, request = *parsed, answer, state] {
    int queued = 0;
    if (!state->compare_exchange_strong(queued, 1)) return;
    answer->set_value(HandleControl(request));
  });
  if (future.wait_for(kControlAnswer) != std::future_status::ready) {
    int queued = 0;
    if (state->compare_exchange_strong(queued, 2)) {
      return {false, "error: the agent's loop did not answer within " +
                         lease::FormatDuration(kControlAnswer) +
                         "; the request was dropped, nothing started: try again\n"};
    }
  }
  return future.get();
}

vfs::MountOptions::ControlReply Agent::HandleControl(const ControlRequest& request) {
  const std::string what = lease::Printable(FormatControlRequest(request));
  auto refuse = [&](const std::string& why) {
    spdlog::warn("control: refused '{}': {}", what.substr(0, what.size() - 1), why);
    return vfs::MountOptions::ControlReply{false, "error: " + why + "\n"};
  };
  if (lifecycle_.phase() != Phase::kServing) {
    return refuse("the agent is " + std::string(PhaseName(lifecycle_.phase())) +
                  "; handoffs and drains run only while it serves");
  }
  const MonoTime now = mono_.Now();
  const auto status = refresher_->Status();
  std::vector<SlotRange> started;
  switch (request.verb) {
    case ControlRequest::Verb::kUndo: {
      std::vector<SlotRange> undone = handoffs_.Undo();
      for (SlotRange r : undone) refresher_->Unpark(r);
      // Ranges parked by a drain with nothing held have no handoff entry.
      for (const auto& st : status) refresher_->Unpark(st.range);
      claim_now_ = true;
      spdlog::info("control: drain undone; claiming the configured ranges again");
      Step();
      return {true, "ok: the configured ranges are claimed again\n"};
    }
    case ControlRequest::Verb::kHandoff:
    case ControlRequest::Verb::kDrain: {
      if (const Status ok = CheckControl(request, refresher_->store().keeps_offers(),
                                         replicator_ != nullptr);
          !ok.ok()) {
        return refuse(ok.message() + " (store " + refresher_->store().url() + ")");
      }
      if (request.verb == ControlRequest::Verb::kHandoff) {
        const Status ok = handoffs_.Request(now, *request.range, request.to, status,
                                            refresher_->owner());
        if (!ok.ok()) return refuse(ok.message());
        started.push_back(*request.range);
      } else {
        // Everything is checked before anything starts: a refused drain
        // leaves no range handing off.
        auto plan = handoffs_.PlanDrain(request.to, status, refresher_->owner());
        if (!plan.ok()) return refuse(plan.status().message());
        std::vector<SlotRange> parked_now;
        for (SlotRange range : plan->park) {
          // Not held here: parked, so it is not claimed until undone. Only
          // if still not held and no call is out (an answer may have come).
          if (refresher_->parked(range)) continue;
          if (!refresher_->ParkUnheld(range)) {
            for (SlotRange r : parked_now) refresher_->Unpark(r);
            return refuse("range " + range.ToString() +
                          " changed while the drain started (a store call answered); nothing "
                          "was started: try again in a moment");
          }
          parked_now.push_back(range);
        }
        const Status ok = handoffs_.Drain(now, *plan, request.to, status, refresher_->owner());
        if (!ok.ok()) return refuse(ok.message());  // checked by PlanDrain: not reached
        started = plan->hand_off;
      }
      std::string ranges;
      for (SlotRange r : started) ranges += (ranges.empty() ? "" : ",") + r.ToString();
      const std::string to = request.to ? "to '" + request.to->str() + "'" : "(released)";
      spdlog::info("control: handing off range(s) {} {}: no new opens; open handles get up to {} "
                   "to close",
                   ranges.empty() ? "(none served)" : ranges, to,
                   lease::FormatDuration(config_.shutdown_grace));
      Publish();
      Step();
      return {true, "ok: handing off " + (ranges.empty() ? std::string("no range") : ranges) +
                        " " + to + "\n"};
    }
  }
  return refuse("unknown request");
}

void Agent::StepHandoffs(MonoTime now) {
  handoff_wake_ = MonoTime::max();
  if (lifecycle_.phase() == Phase::kServing) {
    ApplyHandoff(handoffs_.Step(now, [this](SlotRange r) {
      return fs_ ? fs_->OpenHandlesIn(r.first(), r.last()) : std::size_t{0};
    }));
    if (offer_watch_.Due(now, refresher_->UnheldRanges())) StartOfferRead();
  }
  std::lock_guard lock(backing_mu_);
  handoff_status_ = handoffs_.Report();
}

void Agent::ApplyHandoff(HandoffActions actions) {
  for (const LogLine& line : actions.log) {
    switch (line.level) {
      case LogLine::Level::kInfo: spdlog::info("{}", line.text); break;
      case LogLine::Level::kWarn: spdlog::warn("{}", line.text); break;
      case LogLine::Level::kError: spdlog::error("{}", line.text); break;
    }
  }
  if (actions.publish) Publish();
  for (SlotRange r : actions.stop_work) StartRangeStopWork(r);
  for (SlotRange r : actions.release) SendHandoffRelease(r);
  for (SlotRange r : actions.claim) refresher_->Unpark(r);
  if (!actions.claim.empty()) claim_now_ = true;
  handoff_wake_ = std::min(handoff_wake_, actions.wake);
  std::lock_guard lock(backing_mu_);
  handoff_status_ = handoffs_.Report();
}

void Agent::StartRangeStopWork(SlotRange range) {
  // The view that withdraws the range was published just before: after the
  // fence, nothing reaches its backing files. The lease is renewed meanwhile,
  // and HostOwnership still counts the range served, so the shipper may
  // still snapshot its tenants.
  auto* work = new RangeStopWork;
  work->agent = this;
  work->range = range;
  work->req.data = work;
  work->flush_deadline = mono_.Now() + config_.ttl * 2 / 3;
  ++work_in_flight_;
  uv_queue_work(
      &loop_, &work->req,
      [](uv_work_t* req) {
        auto* w = static_cast<RangeStopWork*>(req->data);
        Agent* agent = w->agent;
        if (agent->fs_) agent->fs_->WaitForFences();
        if (agent->replicator_) {
          w->all_shipped = agent->replicator_->FlushRange(w->flush_deadline, w->range.first(),
                                                          w->range.last());
        }
      },
      [](uv_work_t* req, int) {
        std::unique_ptr<RangeStopWork> w(static_cast<RangeStopWork*>(req->data));
        Agent* agent = w->agent;
        --agent->work_in_flight_;
        if (agent->lifecycle_.phase() == Phase::kStopped) return;
        // Once the shutdown's own stop work ended it starts no store call
        // (Lifecycle::renews): no offer starts then, its release takes the range.
        agent->ApplyHandoff(agent->handoffs_.StopWorkDone(agent->mono_.Now(), w->range,
                                                          w->all_shipped,
                                                          agent->lifecycle_.renews()));
        // A full step, not Arm(max): Arm alone would drop the lifecycle's
        // own wake (a stop's settle or release deadline) when it renews no more.
        agent->Step();
      });
}

void Agent::SendHandoffRelease(SlotRange range) {
  std::optional<lease::OwnerId> to;
  for (const HandoffStatus& h : handoffs_.Report()) {
    if (h.range == range && !h.to.empty()) to = *lease::OwnerId::Make(h.to);
  }
  auto sent = refresher_->StartHandoff(range, to, [this, range](Result<bool> answer) {
    OnLoop([this, range, answer = std::move(answer)] {
      ApplyHandoff(handoffs_.Released(mono_.Now(), range, true, answer));
      Publish();
      Arm(MonoTime::max());
    });
  });
  if (!sent.ok()) {
    ApplyHandoff(handoffs_.Released(mono_.Now(), range, true, sent.status()));
    return;
  }
  switch (*sent) {
    case lease::Refresher::HandoffSend::kWait:
      ApplyHandoff(handoffs_.ReleaseWaits(mono_.Now(), range));
      break;
    case lease::Refresher::HandoffSend::kNothingHeld:
      ApplyHandoff(handoffs_.Released(mono_.Now(), range, false, true));
      break;
    case lease::Refresher::HandoffSend::kSent: break;
  }
}

void Agent::StartOfferRead() {
  const std::vector<SlotRange> unheld = refresher_->UnheldRanges();
  std::vector<Slot> slots;
  for (SlotRange r : unheld) {
    slots.push_back(r.first());
    slots.push_back(r.last());
  }
  // The poll runs ~7 times a second on every standby host: it reads only
  // the offers (on etcd, not every row) unless a handoff's offer window
  // ended and OffersNotTaken must see the rows of its range.
  const bool rows = handoffs_.AwaitsOfferEnd(mono_.Now());
  Post([this, unheld, slots, rows] {
    lease::OwnershipStore& store = refresher_->store();
    Result<lease::OwnershipTable> table = rows ? store.ReadSlots(slots) : store.ReadOffers();
    const std::int64_t store_now = store.NowMs();
    OnLoop([this, unheld, table = std::move(table), store_now, rows] {
      const std::vector<SlotRange> offered =
          offer_watch_.Answered(table, unheld, refresher_->owner(), store_now);
      for (SlotRange r : offered) {
        if (refresher_->parked(r)) {
          if (handoffs_.drained(r)) {
            spdlog::warn("range {} is offered to this agent, which is drained: not claiming it "
                         "(the offer ends with its window; 'fleetfs drain --undo' claims again)",
                         r.ToString());
            continue;
          }
          if (!handoffs_.Forget(r)) continue;  // still handing it off
          refresher_->Unpark(r);
        }
        spdlog::info("range {} is offered to this agent: claiming it now", r.ToString());
        claim_now_ = true;
      }
      if (table.ok() && rows) {
        std::vector<LogLine> log;
        const std::vector<SlotRange> back =
            handoffs_.OffersNotTaken(mono_.Now(), *table, refresher_->owner(), store_now, log);
        HandoffActions actions;
        actions.log = std::move(log);
        actions.publish = !back.empty();
        for (SlotRange r : back) refresher_->Unpark(r);
        if (!back.empty()) claim_now_ = true;
        ApplyHandoff(std::move(actions));
      }
    });
  });
}

// ---- start and stop ----

Status Agent::MountNow() {
  vfs::MountOptions options;
  options.backing = config_.backing;
  options.mountpoint = config_.mountpoint;
  options.mode = config_.mode;
  options.allow_create = config_.allow_create;
  options.max_threads = config_.fuse_threads;
  options.transport = config_.transport;
  options.clock = &mono_;
  options.status_json = [this] { return DumpJson(StatusJson(Snapshot())) + "\n"; };
  options.ranges_text = [this] { return RangesText(Snapshot()); };
  // The live state of the active tenants only: `fleetfs ls` reads the files
  // themselves from the backing directory.
  // Its work follows the active tenants and those with open handles, and
  // it names none of a range no longer served.
  options.tenants_live = [this] {
    vfs::FleetFs* fs = fs_for_readers_.load();
    auto open = fs ? fs->OpenHandlesByTenant() : std::vector<std::pair<std::string, std::size_t>>{};
    std::vector<std::string> also;
    also.reserve(open.size());
    for (const auto& [path, n] : open) also.push_back(path);
    auto replication = replicator_ ? replicator_->TenantStates(also)
                                   : std::vector<replica::TenantReplication>{};
    std::shared_ptr<const vfs::ServingView> view;
    {
      std::lock_guard lock(published_mu_);
      view = published_;
    }
    const MonoTime now = mono_.Now();
    const FleetMode mode = config_.mode;
    return TenantsLiveJsonl(open, replication, [&](std::string_view path) {
      const auto file = ParseFleetPath(mode, path);
      return view && file && view->Find(file->slot, now) != nullptr;
    });
  };
  options.hooks = replicator_.get();
  options.control = [this](std::string_view text) { return Control(text); };
  options.on_session_end = [this] {
    session_ended_ = true;
    uv_async_send(&posted_async_);
  };
  auto fs = vfs::FleetFs::Mount(std::move(options), BuildView());
  if (!fs.ok()) return fs.status().WithContext("mounting " + config_.mountpoint);
  fs_ = std::move(*fs);
  transport_name_ = fs_->TransportName();
  transport_why_ = fs_->TransportWhy();
  fs_for_readers_ = fs_.get();
  spdlog::info("mounted {} over {} ({} mode, transport {}{})", config_.mountpoint,
               config_.backing, ModeName(config_.mode), transport_name_,
               config_.allow_create ? "" : ", creating tenants refused");
  return Status::Ok();
}

void Agent::StartStopWork() {
  // The view that withdraws everything was published just before: the
  // fence waits for writes in flight, so after it nothing reaches a backing
  // file. Every commit ships before the release; a range whose commits
  // cannot ship in time lapses instead, so no other host restores an older
  // state while this one still holds newer commits. The loop goes on
  // renewing meanwhile.
  auto* work = new StopWork;
  work->agent = this;
  work->req.data = work;
  work->flush_limit = lifecycle_.flush_limit();
  ++work_in_flight_;
  stop_work_running_ = true;
  uv_queue_work(
      &loop_, &work->req,
      [](uv_work_t* req) {
        auto* w = static_cast<StopWork*>(req->data);
        Agent* agent = w->agent;
        if (agent->fs_) agent->fs_->WaitForFences();
        if (agent->replicator_) {
          w->all_shipped =
              agent->replicator_->Flush(agent->mono_.Now() + w->flush_limit);
        }
      },
      [](uv_work_t* req, int) {
        std::unique_ptr<StopWork> w(static_cast<StopWork*>(req->data));
        Agent* agent = w->agent;
        --agent->work_in_flight_;
        agent->stop_work_running_ = false;
        if (agent->lifecycle_.phase() == Phase::kStopped) return;
        if (agent->replicator_) {
          if (w->all_shipped) {
            spdlog::info("every commit is shipped to {}", agent->config_.replica);
          } else {
            spdlog::warn("some commits could not be shipped to {} in time", agent->config_.replica);
          }
        }
        agent->Apply(agent->lifecycle_.StopWorkDone(agent->mono_.Now(), w->all_shipped,
                                                     agent->Observe()));
      });
}

// ---- the backing volume ----

void Agent::CheckBacking() {
  if (!fs_ || lifecycle_.phase() == Phase::kStopped) return;
  BackingWatch::Decision d = backing_watch_.Observe(mono_.Now(), BackingErrorsOf(fs_->stats()));
  LogBacking(d.log);
  MirrorBacking();
  if (d.probe) StartProbe();
}

void Agent::StartProbe() {
  auto* work = new ProbeWork;
  work->agent = this;
  work->req.data = work;
  ++work_in_flight_;
  uv_queue_work(
      &loop_, &work->req,
      [](uv_work_t* req) {
        auto* w = static_cast<ProbeWork*>(req->data);
        w->result = ProbeBacking(w->agent->config_.backing);
      },
      [](uv_work_t* req, int) {
        std::unique_ptr<ProbeWork> w(static_cast<ProbeWork*>(req->data));
        Agent* agent = w->agent;
        --agent->work_in_flight_;
        if (agent->lifecycle_.phase() == Phase::kStopped) return;
        agent->BackingProbed(w->result);
      });
}

void Agent::BackingProbed(const ProbeResult& result) {
  std::vector<BackingWatch::LogLine> log;
  std::optional<std::string> why = backing_watch_.Probed(mono_.Now(), result, &log);
  LogBacking(log);
  MirrorBacking();
  if (!why) return;
  Apply(lifecycle_.BackingFailed(mono_.Now(), *why, Observe()));
  std::lock_guard lock(backing_mu_);
  failure_ = lifecycle_.failure();
}

void Agent::LogBacking(const std::vector<BackingWatch::LogLine>& log) const {
  for (const BackingWatch::LogLine& line : log) {
    if (line.warn) {
      spdlog::warn("{}", line.text);
    } else {
      spdlog::info("{}", line.text);
    }
  }
}

void Agent::MirrorBacking() {
  std::lock_guard lock(backing_mu_);
  backing_report_ = backing_watch_.report();
}

void Agent::Finish() {
  phase_ = Phase::kStopped;
  // Lookups waiting for a restore are answered while the session still runs.
  // A flush that outlived its bound still runs in the replicator: the
  // process exits without waiting for it.
  if (replicator_ && !stop_work_running_) replicator_->Stop();
  if (fs_) {
    fs_->Unmount();
    spdlog::info("unmounted {}", config_.mountpoint);
  }
  if (admin_) admin_->Close();
  uv_timer_stop(&wake_);
  uv_timer_stop(&backing_timer_);
  uv_timer_stop(&notify_timer_);
  uv_timer_stop(&watchdog_timer_);
  if (auto stopping = announcer_.Stopping()) notifier_.Send(*stopping);
  notifier_.Flush();
  CloseLoopHandles();
  // A store call that still hangs keeps its pool thread; it must not keep
  // the agent from exiting.
  if (work_in_flight_ > 0) uv_stop(&loop_);
}

void Agent::CloseLoopHandles() {
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&wake_),
                         reinterpret_cast<uv_handle_t*>(&backing_timer_),
                         reinterpret_cast<uv_handle_t*>(&notify_timer_),
                         reinterpret_cast<uv_handle_t*>(&watchdog_timer_),
                         reinterpret_cast<uv_handle_t*>(&posted_async_),
                         reinterpret_cast<uv_handle_t*>(&sigterm_),
                         reinterpret_cast<uv_handle_t*>(&sigint_)}) {
    uv_close(h, nullptr);
  }
}

// ---- what operators see ----

AgentSnapshot Agent::Snapshot() const {
  AgentSnapshot s;
  s.owner = config_.owner.str();
  s.store = config_.store;
  s.store_tls = config_.store_tls;
  s.mode = std::string(ModeName(config_.mode));
  s.backing = config_.backing;
  s.mountpoint = config_.mountpoint;
  s.admin = config_.admin ? config_.admin->ToString() : "off";
  s.phase = std::string(PhaseName(phase_));
  s.ttl = config_.ttl;
  s.pid = static_cast<int>(::getpid());
  s.now_ms = wall_.NowMs();
  s.mono_now = mono_.Now();
  // The agent's monotonic clock is CLOCK_BOOTTIME: other processes can compare with it.
  s.monotonic_now_s = std::chrono::duration<double>(s.mono_now.time_since_epoch()).count();
  vfs::FleetFs* fs = fs_for_readers_.load();
  std::shared_ptr<const vfs::ServingView> published;
  {
    std::lock_guard lock(published_mu_);
    published = published_;
  }
  for (lease::RangeStatus& st : refresher_->Status()) {
    std::size_t open = fs ? fs->OpenHandlesIn(st.range.first(), st.range.last()) : 0;
    if (st.serving) {
      const vfs::ServedRange* in = published ? published->Find(st.range.first(), s.mono_now) : nullptr;
      if (in == nullptr || !st.epoch || in->token.epoch != st.epoch->value()) st.serving = false;
    }
    const WallMs holder_until =
        st.holder && store_ ? store_->ToWallMs(st.holder->lease_expires_ms) : 0;
    s.ranges.push_back(RangeSnapshot{std::move(st), open, 0, holder_until});
  }
  for (std::size_t i = 0; i < s.outcomes.size(); ++i) s.outcomes[i] = outcomes_[i].load();
  s.refreshes = refreshes_.load();
  if (timed_store_) s.store_call_time = timed_store_->latencies();
  if (fs) {
    s.vfs = SnapshotOf(fs->stats(), fs->OpenHandles());
    s.transport = transport_name_;
    s.transport_why = transport_why_;
  }
  {
    std::lock_guard lock(backing_mu_);
    s.backing_volume = backing_report_;
    s.failure = failure_;
    s.handoffs = handoff_status_;
  }
  if (replicator_) {
    s.replica = config_.replica;
    s.replica_s3 = config_.replica_s3;
    s.replication = replicator_->Stats();
    s.replica_requests = destination_->counts();
    s.replica_request_time = destination_->latencies();
    for (RangeSnapshot& r : s.ranges) {
      r.replication_lag_s = replicator_->LagSeconds(r.status.range.first(), r.status.range.last());
    }
  }
  return s;
}

// ---- systemd ----

void Agent::Announce() {
  if (!notifier_.active()) return;
  const Phase phase = lifecycle_.phase();
  if ((phase == Phase::kDraining || phase == Phase::kStopping) && phase != extended_for_) {
    // Any stop, the agent's own too: STOPPING=1 first, then the time what is
    // left of it may take, refreshed at each phase (systemd_notify.h).
    StopAnnounce(phase);
  }
  const AgentSnapshot s = Snapshot();
  ServiceState state;
  state.phase = lifecycle_.phase();
  state.mounted = fs_ != nullptr;
  state.ranges = s.ranges.size();
  for (const RangeSnapshot& r : s.ranges) {
    if (RangeState(r.status, s.phase) == "serving") ++state.serving;
    if (replicator_) state.lag_s = std::max(state.lag_s.value_or(0), r.replication_lag_s);
  }
  if (replicator_ && !state.lag_s) state.lag_s = 0;
  state.open_files = s.vfs ? s.vfs->open_handles : 0;
  state.failure = s.failure;
  if (refresher_) {
    for (const lease::RangeStatus& r : refresher_->Status()) {
      using lease::RangeOutcome;
      if (r.last == RangeOutcome::kClaimed || r.last == RangeOutcome::kRenewed ||
          r.last == RangeOutcome::kLost || r.last == RangeOutcome::kWaiting) {
        ++state.answered;
      }
    }
  }
  for (const std::string& message : announcer_.Update(state)) notifier_.Send(message);
}

void Agent::StopAnnounce(Phase phase) {
  if (!notifier_.active()) return;
  if (auto stopping = announcer_.Stopping()) notifier_.Send(*stopping);
  extended_for_ = phase;
  notifier_.Send(
      ExtendTimeout(StopTimeBound(phase, config_.ttl, config_.shutdown_grace, kNotifyMargin)));
}

void Agent::WatchdogTick() {
  // Phase failed still pings: it stands by on purpose (lifecycle.h), saying
  // why on the admin port until an operator fixes the volume; a restart by
  // systemd would claim ranges again on the failed volume.
  if (lifecycle_.phase() == Phase::kStopped || !watchdog_health_) return;
  std::optional<std::string> why =
      watchdog_health_->Check(mono_.Now(), lifecycle_.renews(), refresher_ ? refresher_->answered() : 0);
  if (!why) {
    if (watchdog_withheld_) spdlog::info("the loop is healthy again: pinging the watchdog");
    watchdog_withheld_ = false;
    notifier_.Send("WATCHDOG=1");
    return;
  }
  if (!watchdog_withheld_) {
    spdlog::error("not pinging the systemd watchdog: {}; systemd restarts the agent", *why);
  }
  watchdog_withheld_ = true;
}

HttpResponse Agent::Serve(const std::string& method, const std::string& path) const {
  if (method != "GET" && method != "HEAD") {
    return {405, "text/plain; charset=utf-8", "only GET is served\n"};
  }
  if (path == "/health") return Health(Snapshot());
  if (path == "/status") return {200, "application/json", DumpJson(StatusJson(Snapshot())) + "\n"};
  if (path == "/metrics") return {200, "text/plain; version=0.0.4", MetricsText(Snapshot())};
  return {404, "text/plain; charset=utf-8", "not found; try /health, /status or /metrics\n"};
}

int Agent::Run(std::ostream& err) {
  // Written before the loop runs, so not through the logger's format: the
  // journal's priority by hand, or `journalctl -p err` misses why it failed.
  const LogTarget log_target = DetectLogTarget();
  auto fail = [&](const Status& status) {
    err << StderrLine(log_target, spdlog::level::err, "fleetfs: " + status.message());
    return ExitCodeFor(status);
  };
  auto lock = VolumeLock::Acquire(config_.backing);
  if (!lock.ok()) return fail(lock.status());

  // With the lock held no agent of this backing directory is alive: a
  // fleetfs mount that does not answer here is one it left behind.
  if (Status cleared = ClearMountPoint(config_.mountpoint); !cleared.ok()) return fail(cleared);

  auto opened = lease::OpenStore(config_.store, wall_, lease::SqliteStore::Access::kCreate,
                                 config_.store_tls);
  if (!opened.ok()) return fail(opened.status().WithContext("store"));
  auto timed = std::make_shared<lease::TimedStore>(std::move(*opened), mono_);
  std::shared_ptr<lease::OwnershipStore> store = timed;
  store_ = store;
  timed_store_ = timed;
  auto host = lease::HostOwnership::Make(config_.owner, config_.ranges, config_.ttl);
  if (!host.ok()) return fail(host.status());

  // Started once the refresher and the loop's async handle exist: its
  // shipping thread asks serving_epoch (the refresher) from its first round,
  // one sync interval after the start, and a fence posts to the loop. Started
  // before them, a start slower than that interval (a loaded host, a restart
  // with unshipped tenants) crashed on the null refresher_ (SIGSEGV).
  std::optional<replica::ReplicatorOptions> replicator_options;
  if (!config_.replica.empty()) {
    replica::DestinationOptions dest_options;
    dest_options.s3 = config_.replica_s3;
    dest_options.retry_wait_cap = config_.sync_interval;
    auto dest = replica::OpenDestination(config_.replica, dest_options);
    if (!dest.ok()) return fail(dest.status().WithContext("replica"));
    destination_ = std::make_shared<replica::CountingDestination>(std::move(*dest), &mono_);
    replica::ReplicatorOptions ro;
    ro.backing = config_.backing;
    ro.mode = config_.mode;
    ro.destination = destination_;
    ro.wall = &wall_;
    ro.mono = &mono_;
    ro.sync_interval = config_.sync_interval;
    ro.snapshot_interval = config_.snapshot_interval;
    ro.retention = config_.retention;
    ro.capture_memory_bytes = config_.capture_memory;
    ro.capture_spill_bytes = config_.capture_spill;
    ro.serving_epoch = [this](Slot slot) -> std::optional<std::uint64_t> {
      for (const auto& [range, epoch] : refresher_->Serving()) {
        if (range.Contains(slot)) return epoch.value();
      }
      return std::nullopt;
    };
    // An epoch in the replica above the store's counter is corruption, never
    // a fence: read on the shipping thread, only when an object claims one.
    ro.epoch_ceiling = [store]() -> Result<std::uint64_t> {
      // Only the counter: on etcd a full Read asks every row's lease time,
      // and one failed call among thousands would judge a real fence corrupt.
      FLEETFS_ASSIGN_OR_RETURN(lease::OwnershipTable table, store->ReadSlots({}));
      return table.last_epoch().value();
    };
    ro.on_newer_epoch = [this](Slot slot, std::uint64_t newer) {
      // Another host wrote a newer epoch: drop the range now, claim above it later.
      if (auto range = refresher_->Lose(slot, Epoch(newer))) {
        spdlog::error("dropping range {}: the replica holds epoch {} from another owner",
                      range->ToString(), newer);
      }
      Post([] {});  // wakes the loop, which publishes the view without the range
    };
    replicator_options = std::move(ro);
  }

  // Each range may keep one hung call on a pool thread; the rest must still run.
  std::size_t pool = std::min<std::size_t>(128, std::max<std::size_t>(4, config_.ranges.size() * 2 + 2));
  ::setenv("UV_THREADPOOL_SIZE", std::to_string(pool).c_str(), 1);

  uv_loop_init(&loop_);
  uv_timer_init(&loop_, &wake_);
  wake_.data = this;
  uv_timer_init(&loop_, &backing_timer_);
  backing_timer_.data = this;
  uv_timer_start(&backing_timer_,
                 [](uv_timer_t* t) { static_cast<Agent*>(t->data)->CheckBacking(); },
                 kBackingCheck.count(), kBackingCheck.count());
  uv_async_init(&loop_, &posted_async_, [](uv_async_t* a) { static_cast<Agent*>(a->data)->RunPosted(); });
  posted_async_.data = this;
  uv_signal_init(&loop_, &sigterm_);
  uv_signal_init(&loop_, &sigint_);
  uv_timer_init(&loop_, &notify_timer_);
  notify_timer_.data = this;
  uv_timer_init(&loop_, &watchdog_timer_);
  watchdog_timer_.data = this;
  if (notifier_.active()) {
    // Open files and lag change without a step: the STATUS line follows them.
    // A full NOTIFY_SOCKET kept READY=1 or STOPPING=1: sent again from here.
    uv_timer_start(&notify_timer_,
                   [](uv_timer_t* t) {
                     auto* agent = static_cast<Agent*>(t->data);
                     agent->notifier_.Flush();
                     agent->Announce();
                   },
                   1000, 1000);
    // The first round and its claims may take longer than TimeoutStartSec at a long ttl.
    notifier_.Send(ExtendTimeout(StartTimeBound(config_.ttl, kNotifyMargin)));
  }
  if (auto interval = notifier_.watchdog_interval()) {
    // Half the interval, as sd_watchdog_enabled(3) advises: one late tick is not a miss.
    const auto every = static_cast<std::uint64_t>(std::max<std::int64_t>(interval->count() / 2, 1));
    watchdog_health_.emplace(config_.ttl, mono_.Now());
    uv_timer_start(&watchdog_timer_,
                   [](uv_timer_t* t) { static_cast<Agent*>(t->data)->WatchdogTick(); }, 0, every);
    spdlog::info("pinging the systemd watchdog every {} ms while the loop is healthy", every);
  }
  sigterm_.data = this;
  sigint_.data = this;

  refresher_ = std::make_unique<lease::Refresher>(
      std::move(*host), store, mono_,
      [this](lease::Refresher::Task task) { Post(std::move(task)); });
  refresher_->SetReportListener([this](const lease::RefreshReport& report) {
    auto add = [&](Outcome o, std::size_t n) {
      outcomes_[static_cast<std::size_t>(o)].fetch_add(n);
    };
    add(Outcome::kClaimed, report.claimed.size());
    add(Outcome::kRenewed, report.renewed.size());
    add(Outcome::kLost, report.lost.size());
    add(Outcome::kWaiting, report.waiting.size());
    add(Outcome::kFailed, report.failed.size());
    refreshes_.fetch_add(1);
    for (const auto& [range, epoch] : report.claimed) {
      spdlog::info("claimed range {} at epoch {}", range.ToString(), epoch.value());
    }
    for (const auto& range : report.lost) spdlog::warn("lost range {}", range.ToString());
    // A failing store fails every refresh: say so when the reason changes.
    std::lock_guard lock(failures_mu_);
    std::map<SlotRange, std::string> failing;
    for (const auto& [range, why] : report.failed) {
      if (last_failures_[range] != why) spdlog::warn("range {}: {}", range.ToString(), why);
      failing[range] = why;
    }
    for (const auto& [range, why] : last_failures_) {
      if (!why.empty() && failing.count(range) == 0) {
        spdlog::info("range {}: the store answers again", range.ToString());
      }
    }
    last_failures_ = std::move(failing);
  });

  if (replicator_options) {
    auto replicator = replica::Replicator::Start(std::move(*replicator_options));
    if (!replicator.ok()) {
      CloseLoopHandles();
      uv_run(&loop_, UV_RUN_DEFAULT);
      uv_loop_close(&loop_);
      return fail(replicator.status().WithContext("replica " + config_.replica));
    }
    replicator_ = std::move(*replicator);
  }

  if (config_.admin) {
    auto admin = AdminServer::Start(&loop_, *config_.admin, [this](const std::string& m,
                                                                   const std::string& p) {
      return Serve(m, p);
    });
    if (!admin.ok()) {
      CloseLoopHandles();
      uv_run(&loop_, UV_RUN_DEFAULT);
      uv_loop_close(&loop_);
      return fail(admin.status());
    }
    admin_ = std::move(*admin);
  }
  auto on_signal = [](uv_signal_t* handle, int signum) {
    auto* agent = static_cast<Agent*>(handle->data);
    agent->StopAnnounce(Phase::kDraining);
    agent->Apply(agent->lifecycle_.Signal(agent->mono_.Now(),
                                          signum == SIGTERM ? "SIGTERM" : "SIGINT",
                                          agent->Observe()));
  };
  uv_signal_start(&sigterm_, on_signal, SIGTERM);
  uv_signal_start(&sigint_, on_signal, SIGINT);

  std::string ranges;
  for (const auto& r : config_.ranges) ranges += (ranges.empty() ? "" : ",") + r.ToString();
  spdlog::info("fleetfs agent pid {} starting: owner '{}', ranges {}, store {}, ttl {}, admin {}, "
               "replica {}",
               ::getpid(), config_.owner.str(), ranges, config_.store,
               lease::FormatDuration(config_.ttl),
               config_.admin ? config_.admin->ToString() : "off",
               config_.replica.empty() ? "off"
                                       : config_.replica + " every " +
                                             lease::FormatDuration(config_.sync_interval));
  Step();  // the first claim; the mount follows when it has answered
  uv_run(&loop_, UV_RUN_DEFAULT);
  const int code = lifecycle_.exit_code();
  if (code != 0) {
    // Scripts and the service manager see the code; people see why. The
    // logger writes stderr, `err` here: once, with the journal's priority.
    spdlog::error("exiting with {}: {}", code, lifecycle_.exit_reason());
  }
  if (work_in_flight_ > 0) {
    spdlog::warn("exiting with {} calls still running on the pool", work_in_flight_);
    spdlog::shutdown();
    err.flush();
    std::_Exit(code);
  }
  uv_loop_close(&loop_);
  spdlog::info("stopped");
  return code;
}

}  // namespace

int RunAgent(const AgentConfig& config, std::ostream& err) {
  static auto logger = [] {
    auto l = spdlog::stderr_logger_mt("fleetfs");
    ConfigureLogFormat(*l, DetectLogTarget());
    l->flush_on(spdlog::level::info);
    spdlog::set_default_logger(l);
    return l;
  }();
  (void)logger;
  ::signal(SIGPIPE, SIG_IGN);
  RaiseOpenFileLimit();
  Agent agent(config);
  return agent.Run(err);
}

}  // namespace fleetfs::agent
