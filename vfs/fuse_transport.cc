#include "vfs/fuse_transport.h"

#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <system_error>

namespace fleetfs::vfs {
namespace {

// FUSE over io_uring's ABI (linux/fuse.h of 6.14 and later; Debian 12's
// header is 6.1's). The kernel checks the header buffer's size against this
// layout, so a mismatch is refused at registration, not misread.
constexpr std::size_t kUringHeaderBytes = 128;
struct UringEntInOut {
  std::uint64_t flags;
  std::uint64_t commit_id;  // the request's unique
  std::uint32_t payload_sz;
  std::uint32_t padding;
  std::uint64_t reserved;
};
struct UringReqHeader {
  char in_out[kUringHeaderBytes];  // fuse_in_header in, fuse_out_header out
  char op_in[kUringHeaderBytes];   // the op's header (its first argument)
  UringEntInOut ent_in_out;
};
struct UringCmdReq {
  std::uint64_t flags;
  std::uint64_t commit_id;
  std::uint16_t qid;
  std::uint8_t padding[6];
};
static_assert(sizeof(UringReqHeader) == 288);
static_assert(sizeof(UringCmdReq) == 24);
constexpr std::uint32_t kCmdRegister = 1;
constexpr std::uint32_t kCmdCommitAndFetch = 2;

// Room in front of each payload for the request's headers, so that the
// whole request is contiguous for fuse_session_process_buf.
constexpr std::size_t kFront = 4096;
constexpr std::uint64_t kWakeTag = 1;  // user_data of the inbox eventfd's read
// How entries, threads and the kernel's queue fit (dev_uring.c of 6.18):
// the kernel hands a request to the newest entry waiting on the requesting
// CPU's queue; with none waiting it queues the request, and a queued
// request is taken only by a later COMMIT_AND_FETCH (a REGISTER takes none,
// and there is no commit without a fetch). An entry waiting on a thread
// busy in a slow handler (an fsync) would make its request wait for that
// handler, so every ring (one thread each) has at most one entry that is
// not held: waiting while the thread is free, none while it works.
//
// An answer held for long (a lookup behind a restore) keeps its entry. A
// queue keeps threads_per_queue entries that are not held (`nonheld`): the
// ring that held registers another while the queue has fewer, else it
// becomes a spare, with no entry. When the held answer comes, its commit
// (which leaves the entry waiting) is made on a spare ring, or on a new one
// while the queue has made fewer than threads_per_queue (Adopt): so held
// answers do not pile entries onto one thread, whose requests would wait
// behind each other (seen: lookups held one after another all land on one
// thread, the newest entry going first). A made ring is a thread for good
// (an entry cannot be given back); past that bound an answer goes to the
// ring with the fewest entries not held.
//
// After every hold a nudger of that CPU makes one request of its own
// (after any registration has been submitted), answered at once; its
// commit takes one request the kernel queued while no entry waited, which
// is answered (a commit again) or held (a nudge again). So every request
// taken leads to a commit on its queue, its own or a nudge's, and a
// queue's queued requests are taken while its threads are free (a burst
// behind held lookups waited for a restore to end without this: CI). One
// request per nudge, not one for several: each commit takes one request,
// and a chain of them may stop at a slow call (seen: lookups behind slow
// writes waited while threads were free). Each nudge runs on a thread of
// its own (at most kMaxNudgersPerQueue), which ends after: a nudger whose
// request the kernel queued is blocked until a commit. A nudge must run on
// the queue's CPU, so io_uring is used only when the agent may run on every
// online CPU (its cpuset).
//
// Held answers are bounded per queue (MayHold): past kMaxHeldPerQueue a
// handler answers at once (EAGAIN). That bounds a queue's entries too.
constexpr std::size_t kIdleEntries = 1;
constexpr std::size_t kMaxHeldPerQueue = 128;

// Nudgers blocked at once per queue; past it an asked nudge waits for one of
// them to come back. Each blocked nudge is a request the kernel queued,
// which a commit takes, and there is no more than one per held answer.
constexpr std::size_t kMaxNudgersPerQueue = kMaxHeldPerQueue;

// Where an entry's request is (Entry::state).
enum EntryState : int {
  kInKernel = 0,   // waiting for a request, or on its way to the ring
  kInProcess = 1,  // its ring's thread is handling the request
  kHeld = 2,       // the handler returned without answering
  kAnswered = 3,   // answered: committed or about to be
};

thread_local SessionTransport::Ring* tls_ring = nullptr;

// A CPU list as /sys/devices/system/cpu/ writes it ("0-3,6").
std::vector<int> CpuList(const char* path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  std::vector<int> cpus;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t comma = text.find(',', at);
    std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::size_t dash = part.find('-');
    int lo = std::atoi(part.c_str());
    int hi = dash == std::string::npos ? lo : std::atoi(part.c_str() + dash + 1);
    for (int c = lo; c <= hi && c - lo < 65536; ++c) cpus.push_back(c);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return cpus;
}

// Possible CPUs as the kernel counts its queues (num_possible_cpus).
int PossibleCpus() {
  const std::size_t count = CpuList("/sys/devices/system/cpu/possible").size();
  return count > 0 ? static_cast<int>(count) : static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
}

// Online CPUs this process's threads may not be moved to (its cpuset), as
// "0,3"; empty when it may run on each.
std::string UnreachableCpus() {
  std::string unreachable;
  std::thread([&] {
    for (int c : CpuList("/sys/devices/system/cpu/online")) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        unreachable += (unreachable.empty() ? "" : ",") + std::to_string(c);
      }
    }
  }).join();
  return unreachable;
}

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

std::string UringParameter() {
  std::ifstream in("/sys/module/fuse/parameters/enable_uring");
  std::string v;
  if (!(in >> v)) return "absent (no CONFIG_FUSE_IO_URING)";
  return v;
}

}  // namespace

int UringOpHeaderSize(std::uint32_t opcode, bool setxattr_ext) {
  switch (opcode) {
    case FUSE_LOOKUP: case FUSE_READLINK: case FUSE_SYMLINK: case FUSE_UNLINK:
    case FUSE_RMDIR: case FUSE_STATFS: case FUSE_REMOVEXATTR: case FUSE_DESTROY:
      return 0;
    case FUSE_GETATTR: return sizeof(fuse_getattr_in);
    case FUSE_SETATTR: return sizeof(fuse_setattr_in);
    case FUSE_MKNOD: return sizeof(fuse_mknod_in);
    case FUSE_MKDIR: return sizeof(fuse_mkdir_in);
    case FUSE_RENAME: return sizeof(fuse_rename_in);
    case FUSE_RENAME2: return sizeof(fuse_rename2_in);
    case FUSE_LINK: return sizeof(fuse_link_in);
    case FUSE_OPEN: case FUSE_OPENDIR: return sizeof(fuse_open_in);
    case FUSE_READ: case FUSE_READDIR: case FUSE_READDIRPLUS: return sizeof(fuse_read_in);
    case FUSE_WRITE: return sizeof(fuse_write_in);
    case FUSE_RELEASE: case FUSE_RELEASEDIR: return sizeof(fuse_release_in);
    case FUSE_FSYNC: case FUSE_FSYNCDIR: return sizeof(fuse_fsync_in);
    case FUSE_SETXATTR: return setxattr_ext ? sizeof(fuse_setxattr_in) : FUSE_COMPAT_SETXATTR_IN_SIZE;
    case FUSE_GETXATTR: case FUSE_LISTXATTR: return sizeof(fuse_getxattr_in);
    case FUSE_FLUSH: return sizeof(fuse_flush_in);
    case FUSE_GETLK: case FUSE_SETLK: case FUSE_SETLKW: return sizeof(fuse_lk_in);
    case FUSE_ACCESS: return sizeof(fuse_access_in);
    case FUSE_CREATE: case FUSE_TMPFILE: return sizeof(fuse_create_in);
    case FUSE_BMAP: return sizeof(fuse_bmap_in);
    case FUSE_IOCTL: return sizeof(fuse_ioctl_in);
    case FUSE_POLL: return sizeof(fuse_poll_in);
    case FUSE_FALLOCATE: return sizeof(fuse_fallocate_in);
    case FUSE_LSEEK: return sizeof(fuse_lseek_in);
    case FUSE_COPY_FILE_RANGE: return sizeof(fuse_copy_file_range_in);
    case FUSE_SYNCFS: return sizeof(fuse_syncfs_in);
    case 52:  // FUSE_STATX: fuse_statx_in, after Debian 12's header
      return 24;
    default:
      // FORGET, BATCH_FORGET, INTERRUPT, INIT: /dev/fuse only. NOTIFY_REPLY
      // (a notify_retrieve's data, which fleetfs never asks for) too: libfuse
      // answers it with fuse_reply_none, which would hold its entry forever.
      return -1;
  }
}

struct SessionTransport::Entry {
  UringReqHeader header{};
  struct iovec iov[2]{};
  char* mem = nullptr;  // kFront bytes, then the payload
  char* payload = nullptr;
  std::size_t payload_size = 0;
  // The ring its requests come on: changed by Adopt, before the commit that
  // moves it there (the next request's handling happens after).
  Ring* ring = nullptr;
  std::uint64_t commit_id = 0;
  std::atomic<int> state{kInKernel};
  bool dead = false;
  ~Entry() { std::free(mem); }
};

struct SessionTransport::Ring {
  int qid = 0;
  Queue* queue = nullptr;
  io_uring ring{};
  bool ring_ok = false;
  bool spare_born = false;  // made by Adopt: no entries of its own at first
  int wake_fd = -1;
  std::uint64_t wake_buf = 0;
  // Grows on the ring's thread only (NewEntry); read by others only before
  // the thread registers. Owns its entries' memory even after Adopt moved
  // them: every ring lives until the transport does.
  std::vector<std::unique_ptr<Entry>> entries;
  std::atomic<std::size_t> live{0};  // entries whose requests come here, not ended
  std::size_t own = 0;               // of those, not held (queue->mu guards it)
  std::atomic<bool> busy{false};     // its thread is in a handler
  std::atomic<bool> stopped{false};  // its thread has ended: it takes no answer
  std::size_t payload_size = 0;
  std::thread thread;

  std::mutex mu;  // guards the six below
  std::condition_variable cv;
  enum class Phase { kCreating, kCreated, kGo, kRegistered, kFailed, kStop } phase = Phase::kCreating;
  std::string error;
  std::vector<Entry*> inbox;    // its own, answered on other threads, to commit here
  std::vector<Entry*> adopted;  // held elsewhere, answered, to commit here
  bool closed = false;          // the ring is gone: answers are dropped

  ~Ring() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

struct SessionTransport::Nudger {
  std::mutex mu;  // guards all below
  std::condition_variable cv;  // the destructor waits on it for running == 0
  std::uint64_t owed = 0;   // nudges asked for and not begun: one request each
  std::size_t running = 0;  // nudger threads (detached; the destructor waits for none)
  bool stop = false;
  bool warned = false;      // a nudger could not reach its CPU: said once
};

// One per possible CPU, as the kernel's queues.
struct SessionTransport::Queue {
  int qid = 0;
  std::atomic<std::size_t> out{0};  // requests its entries hold (handled or held)
  std::mutex mu;                    // guards the five below
  std::size_t nonheld = 0;          // entries not held: waiting, or being handled
  std::size_t entries = 0;          // entries registered and not ended
  std::vector<Ring*> rings;         // all, Start's and Adopt's
  std::vector<Ring*> spares;        // serving rings with no entry that is not held
  std::vector<std::unique_ptr<Ring>> spawned;  // rings made by Adopt
  std::size_t making = 0;           // of threads_per_queue, made or being made
  bool closed = false;              // Stop: no more rings
  Nudger nudger;
};

namespace {

void SetPhase(SessionTransport::Ring* r, SessionTransport::Ring::Phase phase, std::string error = {}) {
  std::lock_guard lock(r->mu);
  r->phase = phase;
  r->error = std::move(error);
  r->cv.notify_all();
}

// The submission queue has room for every entry and the wake read; a full
// one is submitted to make room.
[[gnu::returns_nonnull]] io_uring_sqe* Sqe(io_uring* ring) {
  for (;;) {
    if (io_uring_sqe* sqe = io_uring_get_sqe(ring)) return sqe;
    io_uring_submit(ring);
  }
}

void PrepCmd(io_uring_sqe* sqe, int fd, std::uint32_t op, SessionTransport::Entry* e, int qid) {
  // An SQE128 slot: the command's 80 bytes follow the common 48.
  std::memset(static_cast<void*>(reinterpret_cast<char*>(sqe)), 0, 128);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = fd;
  sqe->cmd_op = op;
  if (op == kCmdRegister) {
    sqe->addr = reinterpret_cast<std::uint64_t>(e->iov);
    sqe->len = 2;
  }
  UringCmdReq req{};
  req.qid = static_cast<std::uint16_t>(qid);
  req.commit_id = e->commit_id;
  std::memcpy(sqe->cmd, &req, sizeof(req));
  io_uring_sqe_set_data(sqe, e);
}

}  // namespace

bool SessionTransport::MayHold() {
  // `out` counts the request being handled too.
  return tls_ring == nullptr || tls_ring->queue->out.load() <= kMaxHeldPerQueue;
}

SessionTransport::SessionTransport(TransportOptions options) : options_(std::move(options)) {}

SessionTransport::~SessionTransport() {
  Stop();
  if (waker_.joinable()) waker_.join();
  // After the unmount: it ends the nudges still queued in the kernel.
  for (auto& q : queues_) {
    std::unique_lock lock(q->nudger.mu);
    q->nudger.cv.wait(lock, [&] { return q->nudger.running == 0; });
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

std::string SessionTransport::name() const { return uring_.load() ? "io_uring" : "/dev/fuse"; }
std::string SessionTransport::why() const { return why_; }
int SessionTransport::queues() const { return uring_.load() ? nqueues_ : 0; }

ssize_t SessionTransport::Read(int fd, void* buf, std::size_t len) {
  ssize_t n = ::read(fd, buf, len);
  if (n > 0) init_.SawRequest(buf, static_cast<std::size_t>(n));
  return n;
}

ssize_t SessionTransport::Writev(int fd, struct iovec* iov, int count) {
  if (rings_go_.load(std::memory_order_acquire) && count >= 1 &&
      iov[0].iov_len == sizeof(fuse_out_header)) {
    fuse_out_header out;
    std::memcpy(&out, iov[0].iov_base, sizeof(out));
    Entry* e = nullptr;
    if (out.unique != 0) {
      std::lock_guard lock(owed_mu_);
      if (auto it = owed_.find(out.unique); it != owed_.end()) {
        e = it->second;
        owed_.erase(it);
      }
    }
    if (e != nullptr) {
      std::size_t total = 0;
      for (int i = 1; i < count; ++i) total += iov[i].iov_len;
      if (total > e->payload_size) {
        out.error = -EIO;  // cannot happen: answers are bounded by max_write
        total = 0;
      } else {
        std::size_t at = 0;
        for (int i = 1; i < count; ++i) {
          // memmove: an answer may echo bytes of its own request's payload.
          std::memmove(e->payload + at, iov[i].iov_base, iov[i].iov_len);
          at += iov[i].iov_len;
        }
      }
      out.len = static_cast<std::uint32_t>(sizeof(out) + total);
      std::memcpy(e->header.in_out, &out, sizeof(out));
      e->header.ent_in_out.payload_sz = static_cast<std::uint32_t>(total);
      Ring* r = e->ring;
      const int was = e->state.exchange(kAnswered);
      if (was == kHeld) {
        Adopt(e, fd);
      } else if (tls_ring == r) {
        PrepCmd(Sqe(&r->ring), fd, kCmdCommitAndFetch, e, r->qid);
        r->queue->out.fetch_sub(1);
      } else {
        // Answered while its handler still runs: committed when it returns.
        Deliver(r, &Ring::inbox, e, nullptr);
      }
      return static_cast<ssize_t>(sizeof(out) + total);
    }
  }
  std::string patched;
  if (init_.Patch(iov, count, &patched)) {
    return ::write(fd, patched.data(), patched.size());
  }
  return ::writev(fd, iov, count);
}

bool SessionTransport::Start(fuse_session* se, OfUserdata of_userdata, std::string* error) {
  se_ = se;
  started_ = true;
  static OfUserdata lookup = nullptr;
  lookup = of_userdata;
  static constexpr fuse_custom_io kIo = [] {
    fuse_custom_io io{};
    // Without a transport (reset while a late answer is on its way) the
    // bytes go to /dev/fuse, as libfuse would send them.
    io.read = [](int fd, void* buf, size_t len, void* userdata) -> ssize_t {
      SessionTransport* t = lookup(userdata);
      return t != nullptr ? t->Read(fd, buf, len) : ::read(fd, buf, len);
    };
    io.writev = [](int fd, struct iovec* iov, int count, void* userdata) -> ssize_t {
      SessionTransport* t = lookup(userdata);
      return t != nullptr ? t->Writev(fd, iov, count) : ::writev(fd, iov, count);
    };
    return io;
  }();
  if (int rc = fuse_session_custom_io(se, &kIo, fuse_session_fd(se)); rc != 0) {
    *error = std::string("the session's I/O could not be taken over: ") + std::strerror(-rc);
    return false;
  }
  const bool want_uring = options_.transport != Transport::kDevFuse;
  if (want_uring) {
    // Rings first: INIT may announce io_uring only when every queue can
    // register, because the kernel then holds every request until they have.
    std::string ring_error;
    if (std::string cpus = options_.nudge ? UnreachableCpus() : ""; !cpus.empty()) {
      why_ = "the agent may not run on CPU " + cpus +
             " (its cpuset), and each CPU's queue needs a thread on that CPU to take requests "
             "queued behind lookups waiting for a restore";
    } else if (!StartUring(&ring_error)) {
      why_ = "io_uring rings could not be made: " + ring_error;
      JoinStartRings();
      rings_.clear();
    }
    init_.AskForUring(!rings_.empty());
  }
  // INIT, here and now, so that the transport is known before any loop runs.
  fuse_buf buf{};
  int res;
  do {
    res = fuse_session_receive_buf(se, &buf);
  } while (res == -EINTR);
  if (res <= 0) {
    std::free(buf.mem);
    JoinStartRings();  // they wait for a go that will not come
    rings_.clear();
    *error = std::string("reading INIT from the kernel failed: ") + std::strerror(res == 0 ? ENODEV : -res);
    return false;
  }
  fuse_session_process_buf(se, &buf);
  std::free(buf.mem);
  if (!rings_.empty()) {
    if (!init_.uring_announced()) {
      why_ = init_.uring_offered()
                 ? "INIT was not answered"
                 : "the kernel does not offer FUSE over io_uring (fuse parameter enable_uring: " +
                       UringParameter() + ")";
    } else {
      // Registration: every ring's thread registers its entries.
      payload_size_ = init_.uring_payload_size();
      for (auto& r : rings_) {
        r->payload_size = payload_size_;
        for (std::size_t i = 0; i < kIdleEntries; ++i) NewEntry(r.get());
        r->own = kIdleEntries;
        r->queue->nonheld += kIdleEntries;
        r->queue->entries += kIdleEntries;
      }
      // Answers are matched to entries from now on: a ring may take its
      // first request as soon as every queue has registered, before this
      // thread hears back (an answer sent to /dev/fuse instead is lost, and
      // its request waits forever: seen in the mount tests).
      rings_go_.store(true, std::memory_order_release);
      for (auto& r : rings_) SetPhase(r.get(), Ring::Phase::kGo);
      std::string failed;
      for (auto& r : rings_) {
        std::unique_lock lock(r->mu);
        r->cv.wait(lock, [&] { return r->phase == Ring::Phase::kRegistered || r->phase == Ring::Phase::kFailed; });
        if (r->phase == Ring::Phase::kFailed && failed.empty()) failed = r->error;
      }
      if (failed.empty() && options_.serving_before_start_returns) {
        options_.serving_before_start_returns();
      }
      if (failed.empty()) {
        uring_.store(true, std::memory_order_release);
      } else {
        // The kernel went back to /dev/fuse at the refusal (fc->io_uring=0).
        why_ = "the kernel refused to register an io_uring queue: " + failed;
      }
    }
    if (!uring_.load()) JoinStartRings();
  }
  if (options_.transport == Transport::kIoUring && !uring_.load()) {
    *error = "transport io_uring: " + why_;
    return false;
  }
  if (uring_.load()) {
    StartDevReaders();
  } else {
    rings_.clear();
    StartDevLoop();
  }
  return true;
}

void SessionTransport::JoinStartRings() {
  for (auto& r : rings_) SetPhase(r.get(), Ring::Phase::kStop);
  for (auto& r : rings_) {
    if (r->ring_ok) eventfd_write(r->wake_fd, 1);
    if (r->thread.joinable()) r->thread.join();
  }
}

bool SessionTransport::StartUring(std::string* error) {
  nqueues_ = PossibleCpus();
  const int fd = fuse_session_fd(se_);
  for (int q = 0; q < nqueues_; ++q) {
    queues_.push_back(std::make_unique<Queue>());
    Queue* queue = queues_.back().get();
    queue->qid = q;
    for (int t = 0; t < options_.threads_per_queue; ++t) {
      auto r = std::make_unique<Ring>();
      r->qid = q;
      r->queue = queue;
      Ring* rp = r.get();
      rings_.push_back(std::move(r));
      queue->rings.push_back(rp);
      rp->thread = std::thread([this, rp, fd] { RingMain(rp, fd); });
    }
  }
  std::string failed;
  for (auto& r : rings_) {
    std::unique_lock lock(r->mu);
    r->cv.wait(lock, [&] { return r->phase != Ring::Phase::kCreating; });
    if (r->phase == Ring::Phase::kFailed && failed.empty()) failed = r->error;
  }
  if (!failed.empty()) {
    *error = failed;
    return false;
  }
  return true;
}

void SessionTransport::RingMain(Ring* rp, int fd) {
  if (options_.pin_threads) PinTo(rp->qid);  // best effort: a CPU may be offline
  const unsigned depth = static_cast<unsigned>(kIdleEntries) + 2;
  io_uring_params params{};
  // Not IORING_SETUP_COOP_TASKRUN: the kernel completes an entry by
  // task work on this thread, and with that hint it only flags the
  // task (TWA_SIGNAL_NO_IPI) without waking it from io_uring_enter:
  // requests sat unanswered until a signal came (seen in mount tests).
  params.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER;
  int rc = io_uring_queue_init_params(depth, &rp->ring, &params);
  if (rc == -EINVAL) {  // a kernel without SINGLE_ISSUER
    params = io_uring_params{};
    params.flags = IORING_SETUP_SQE128;
    rc = io_uring_queue_init_params(depth, &rp->ring, &params);
  }
  rp->wake_fd = rc == 0 ? eventfd(0, EFD_CLOEXEC) : -1;
  if (rc != 0 || rp->wake_fd < 0) {
    if (rc == 0) io_uring_queue_exit(&rp->ring);
    std::lock_guard lock(rp->mu);
    rp->closed = true;
    rp->stopped = true;
    if (rp->phase != Ring::Phase::kStop) rp->phase = Ring::Phase::kFailed;
    rp->error = std::string("io_uring_queue_init: ") + std::strerror(rc != 0 ? -rc : errno);
    rp->cv.notify_all();
    return;
  }
  tls_ring = rp;
  {
    std::unique_lock lock(rp->mu);
    rp->ring_ok = true;
    if (rp->phase != Ring::Phase::kStop) {
      rp->phase = Ring::Phase::kCreated;
      rp->cv.notify_all();
    }
    // A spare has nothing to register: it serves as soon as it is made.
    if (!rp->spare_born) {
      rp->cv.wait(lock, [&] { return rp->phase == Ring::Phase::kGo || rp->phase == Ring::Phase::kStop; });
    }
    if (rp->phase == Ring::Phase::kStop) {
      rp->closed = true;
      rp->stopped = true;
      lock.unlock();
      io_uring_queue_exit(&rp->ring);
      return;
    }
  }
  for (auto& e : rp->entries) PrepCmd(Sqe(&rp->ring), fd, kCmdRegister, e.get(), rp->qid);
  rp->live = rp->entries.size();
  io_uring_sqe* wake = Sqe(&rp->ring);
  io_uring_prep_read(wake, rp->wake_fd, &rp->wake_buf, sizeof(rp->wake_buf), 0);
  io_uring_sqe_set_data64(wake, kWakeTag);
  io_uring_submit(&rp->ring);
  if (!rp->spare_born) {
    // A refused registration completes at once; an accepted one only
    // when a request comes.
    io_uring_cqe* cqe = nullptr;
    std::string refused;
    while (io_uring_peek_cqe(&rp->ring, &cqe) == 0) {
      if (cqe->user_data != kWakeTag && cqe->res < 0 && refused.empty()) {
        refused = std::strerror(-cqe->res);
        static_cast<Entry*>(io_uring_cqe_get_data(cqe))->dead = true;
      }
      if (cqe->res >= 0 && cqe->user_data != kWakeTag) break;  // a request: the loop's
      io_uring_cqe_seen(&rp->ring, cqe);
    }
    SetPhase(rp, refused.empty() ? Ring::Phase::kRegistered : Ring::Phase::kFailed, refused);
    if (!refused.empty()) {
      {
        std::lock_guard lock(rp->mu);
        rp->closed = true;
        rp->stopped = true;
      }
      io_uring_queue_exit(&rp->ring);
      return;
    }
  }
  RunRing(rp, fd);
}

SessionTransport::Entry* SessionTransport::NewEntry(Ring* r) {
  auto e = std::make_unique<Entry>();
  e->ring = r;
  e->payload_size = r->payload_size;
  // Pages are touched only as requests fill them: an entry that only ever
  // carries lookups costs a few of its payload's pages.
  // aligned_alloc wants a whole number of alignments.
  const std::size_t bytes = (kFront + r->payload_size + 4095) / 4096 * 4096;
  e->mem = static_cast<char*>(std::aligned_alloc(4096, bytes));
  if (e->mem == nullptr) throw std::bad_alloc();
  e->payload = e->mem + kFront;
  e->iov[0] = {&e->header, sizeof(e->header)};
  e->iov[1] = {e->payload, r->payload_size};
  r->entries.push_back(std::move(e));
  return r->entries.back().get();
}

void SessionTransport::RunRing(Ring* r, int fd) {
  for (auto& e : r->entries) r->live -= e->dead ? 1 : 0;
  bool stop = false;
  while (!stop) {
    int rc = io_uring_submit_and_wait(&r->ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      spdlog::error("vfs: io_uring queue {} stopped: {}", r->qid, std::strerror(-rc));
      break;
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&r->ring, &cqe) == 0) {
      const std::uint64_t tag = cqe->user_data;
      const int res = cqe->res;
      io_uring_cqe_seen(&r->ring, cqe);
      if (tag == kWakeTag) {
        std::vector<Entry*> inbox, adopted;
        {
          std::lock_guard lock(r->mu);
          inbox.swap(r->inbox);
          adopted.swap(r->adopted);
          stop = stop || r->phase == Ring::Phase::kStop;
        }
        r->live += adopted.size();
        for (Entry* e : inbox) PrepCmd(Sqe(&r->ring), fd, kCmdCommitAndFetch, e, r->qid);
        for (Entry* e : adopted) PrepCmd(Sqe(&r->ring), fd, kCmdCommitAndFetch, e, r->qid);
        r->queue->out -= inbox.size() + adopted.size();
        io_uring_sqe* wake = Sqe(&r->ring);
        io_uring_prep_read(wake, r->wake_fd, &r->wake_buf, sizeof(r->wake_buf), 0);
        io_uring_sqe_set_data64(wake, kWakeTag);
        continue;
      }
      auto* e = static_cast<Entry*>(reinterpret_cast<void*>(tag));
      if (res < 0) {
        // The connection ended (-ENOTCONN) or the ring is going: this entry
        // takes no more requests.
        e->dead = true;
        // A refused commit, the connection still up: another entry keeps
        // this thread serving.
        const bool lost = !stopping_.load() && res != -ENOTCONN;
        bool add = false;
        {
          std::lock_guard lock(r->queue->mu);
          --r->queue->nonheld;
          --r->queue->entries;
          --r->own;
          add = lost && ReserveEntry(r);
        }
        if (lost) spdlog::warn("vfs: io_uring queue {} lost an entry: {}", r->qid, std::strerror(-res));
        if (add) RegisterEntry(r, fd);
        if (r->live.fetch_sub(1) == 1) stop = true;
        continue;
      }
      e->state.store(kInProcess);
      r->queue->out.fetch_add(1);
      r->busy.store(true, std::memory_order_relaxed);
      Process(e, fd);
      r->busy.store(false, std::memory_order_relaxed);
      int handled = kInProcess;
      if (e->state.compare_exchange_strong(handled, kHeld)) Held(r, fd);
    }
  }
  {
    std::lock_guard lock(r->mu);
    r->closed = true;
  }
  {
    std::lock_guard lock(r->queue->mu);
    r->stopped = true;
    std::erase(r->queue->spares, r);
  }
  // Answers committed since the last submission still reach the kernel.
  io_uring_submit(&r->ring);
  io_uring_queue_exit(&r->ring);
}

bool SessionTransport::ReserveEntry(Ring* r) const {
  Queue* q = r->queue;
  const std::size_t base = static_cast<std::size_t>(options_.threads_per_queue) * kIdleEntries;
  if (q->closed || q->nonheld >= base || q->entries >= base + kMaxHeldPerQueue + 1) return false;
  ++q->nonheld;
  ++q->entries;
  ++r->own;
  return true;
}

void SessionTransport::RegisterEntry(Ring* r, int fd) {
  PrepCmd(Sqe(&r->ring), fd, kCmdRegister, NewEntry(r), r->qid);
  ++r->live;
  // The new entry waits in the kernel before a nudge's request comes.
  io_uring_submit(&r->ring);
}

void SessionTransport::Held(Ring* r, int fd) {
  Queue* q = r->queue;
  bool add;
  {
    std::lock_guard lock(q->mu);
    --q->nonheld;
    --r->own;
    add = ReserveEntry(r);
    if (!add && r->own == 0) q->spares.push_back(r);
  }
  if (add) RegisterEntry(r, fd);
  Nudge(q);
}

SessionTransport::Ring* SessionTransport::PickLocked(Queue* q) {
  Ring* to = nullptr;
  while (to == nullptr && !q->spares.empty()) {
    to = q->spares.back();
    q->spares.pop_back();
    if (to->stopped.load()) to = nullptr;
  }
  if (to == nullptr) {
    // A thread in a handler would commit the answer only after it, and
    // its other entry's request would wait for it too: a free one first.
    auto load = [](const Ring* r) { return std::pair(r->busy.load(std::memory_order_relaxed), r->own); };
    for (Ring* r : q->rings) {
      if (!r->stopped.load() && (to == nullptr || load(r) < load(to))) to = r;
    }
  }
  if (to != nullptr) ++to->own;
  return to;
}

void SessionTransport::Adopt(Entry* e, int fd) {
  Ring* from = e->ring;
  Queue* q = from->queue;
  Ring* to = nullptr;
  bool spawn = false;
  {
    std::lock_guard lock(q->mu);
    ++q->nonheld;
    // A spare first; else a new ring while the queue has made fewer than
    // it has threads (each is a thread for good: its entry cannot be given
    // back); else the ring with the fewest entries not held, where a
    // request may wait for that ring's slow call.
    spawn = q->spares.empty() && !q->closed &&
            q->making < static_cast<std::size_t>(options_.threads_per_queue);
    if (spawn) {
      ++q->making;
    } else {
      to = PickLocked(q);
    }
  }
  if (spawn) {
    to = Spawn(q, fd);
    if (to == nullptr) {
      std::lock_guard lock(q->mu);
      --q->making;
      to = PickLocked(q);
    }
  }
  if (to != nullptr && to != from) {
    if (Deliver(to, &Ring::adopted, e, from)) return;
    spdlog::warn("vfs: io_uring queue {}: a ring had stopped; an answer goes back to its own", q->qid);
    std::lock_guard lock(q->mu);
    --to->own;
    ++from->own;
    std::erase(q->spares, from);
  } else if (to == nullptr) {
    std::lock_guard lock(q->mu);
    ++from->own;
    std::erase(q->spares, from);
  }
  if (!Deliver(from, &Ring::inbox, e, nullptr) && !stopping_.load()) {
    spdlog::error("vfs: io_uring queue {}: an answer was dropped, its ring had stopped", q->qid);
  }
}

SessionTransport::Ring* SessionTransport::Spawn(Queue* q, int fd) {
  Ring* rp = nullptr;
  {
    std::lock_guard lock(q->mu);
    if (q->closed) return nullptr;
    auto r = std::make_unique<Ring>();
    r->qid = q->qid;
    r->queue = q;
    r->spare_born = true;
    r->payload_size = payload_size_;
    rp = r.get();
    try {
      rp->thread = std::thread([this, rp, fd] { RingMain(rp, fd); });
    } catch (const std::system_error& err) {
      spdlog::warn("vfs: io_uring queue {} could not start a ring thread: {}", q->qid, err.what());
      return nullptr;
    }
    rp->own = 1;  // the entry it is made for: no other answer is sent there first
    q->spawned.push_back(std::move(r));
    q->rings.push_back(rp);
  }
  std::unique_lock lock(rp->mu);
  rp->cv.wait(lock, [&] { return rp->phase != Ring::Phase::kCreating; });
  if (rp->phase != Ring::Phase::kCreated) {
    if (rp->phase == Ring::Phase::kFailed) {
      spdlog::warn("vfs: io_uring queue {} could not make a ring: {}", q->qid, rp->error);
    }
    return nullptr;
  }
  return rp;
}

bool SessionTransport::Deliver(Ring* r, std::vector<Entry*> Ring::*box, Entry* e, Ring* from) {
  bool wake = false;
  {
    std::lock_guard lock(r->mu);
    if (r->closed) return false;
    if (from != nullptr) {
      // Moved before the ring can see it: its next request comes there.
      --from->live;
      e->ring = r;
    }
    wake = r->inbox.empty() && r->adopted.empty();
    (r->*box).push_back(e);
  }
  if (wake) eventfd_write(r->wake_fd, 1);
  return true;
}

void SessionTransport::Process(Entry* e, int fd) {
  const UringReqHeader& h = e->header;
  fuse_in_header in;
  std::memcpy(&in, h.in_out, sizeof(in));
  e->commit_id = h.ent_in_out.commit_id;
  const std::uint32_t payload = h.ent_in_out.payload_sz;
  const int op = UringOpHeaderSize(in.opcode, init_.setxattr_ext());
  {
    // Owed before the handler runs: it may answer before it returns.
    std::lock_guard lock(owed_mu_);
    owed_[in.unique] = e;
  }
  if (op < 0 || op > static_cast<int>(kUringHeaderBytes) || payload > e->payload_size) {
    fuse_out_header out{sizeof(out), -ENOSYS, in.unique};
    struct iovec iov{&out, sizeof(out)};
    Writev(fd, &iov, 1);
    return;
  }
  // The request as /dev/fuse delivers it: its headers right in front of its
  // payload, so the payload is not copied.
  char* start = e->payload - sizeof(in) - static_cast<std::size_t>(op);
  in.len = static_cast<std::uint32_t>(sizeof(in) + static_cast<std::size_t>(op) + payload);
  std::memcpy(start, &in, sizeof(in));
  std::memcpy(start + sizeof(in), h.op_in, static_cast<std::size_t>(op));
  fuse_buf buf{};
  buf.size = in.len;
  buf.mem = start;
  fuse_session_process_buf(se_, &buf);
}

void SessionTransport::Nudge(Queue* q) {
  if (!options_.nudge) return;
  Nudger* n = &q->nudger;
  {
    std::lock_guard lock(n->mu);
    if (n->stop) return;
    // One request per nudge: each commit takes one queued request. Each on
    // a thread of its own while few run: a nudger whose request the kernel
    // queued is blocked until a commit, which a later nudge may have to make.
    ++n->owed;
    if (n->running >= kMaxNudgersPerQueue) return;  // a running one takes it
    ++n->running;
  }
  try {
    std::thread([this, q] { RunNudger(q); }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard lock(n->mu);
    --n->running;
    n->cv.notify_all();
    spdlog::warn("vfs: io_uring queue {} could not start a nudger: {}", q->qid, e.what());
  }
}

void SessionTransport::RunNudger(Queue* q) {
  Nudger* n = &q->nudger;
  // The kernel queues a request on the queue of the CPU it was made on.
  const bool pinned = PinTo(q->qid);
  std::unique_lock lock(n->mu);
  if (!pinned && !n->warned) {
    n->warned = true;
    spdlog::warn("vfs: io_uring queue {}: a nudger may not run on CPU {} (offline, or a cpuset "
                 "changed since the mount): requests queued there behind held lookups wait for "
                 "a restore to end", q->qid, q->qid);
  }
  while (n->owed > 0 && !n->stop) {
    --n->owed;
    lock.unlock();
    options_.nudge();
    lock.lock();
  }
  --n->running;
  n->cv.notify_all();
}

void SessionTransport::StartDevLoop() {
  dev_threads_.emplace_back([this] {
    fuse_loop_config* config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(options_.dev_threads));
    fuse_loop_cfg_set_clone_fd(config, options_.clone_fd ? 1 : 0);
    if (options_.max_idle_threads >= 0) {
      fuse_loop_cfg_set_idle_threads(config, static_cast<unsigned>(options_.max_idle_threads));
    }
    fuse_session_loop_mt(se_, config);
    fuse_loop_cfg_destroy(config);
    if (!stopping_.load()) SessionEnded();
  });
}

void SessionTransport::StartDevReaders() {
  const int fd = fuse_session_fd(se_);
  // Non-blocking, so that a reader waits in epoll, where a stop reaches it.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  // Forgets and interrupts only: two readers are plenty.
  for (int i = 0; i < 2; ++i) dev_threads_.emplace_back([this] { DevReader(stop_fd_); });
}

void SessionTransport::DevReader(int stop_fd) {
  const int fd = fuse_session_fd(se_);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event dev{};
  dev.events = EPOLLIN | EPOLLEXCLUSIVE;  // one reader woken per message
  dev.data.u32 = 0;
  epoll_event stop{};
  stop.events = EPOLLIN;
  stop.data.u32 = 1;
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &dev) != 0 ||
      epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd, &stop) != 0) {
    spdlog::error("vfs: a /dev/fuse reader could not start: {}", std::strerror(errno));
    if (ep >= 0) ::close(ep);
    return;
  }
  fuse_buf buf{};
  bool stopped = false;
  while (!stopped && !fuse_session_exited(se_)) {
    const int res = fuse_session_receive_buf(se_, &buf);
    if (res == -EAGAIN) {
      epoll_event got[2];
      const int n = epoll_wait(ep, got, 2, -1);
      for (int i = 0; i < n; ++i) stopped = stopped || got[i].data.u32 == 1;
      continue;
    }
    if (res == -EINTR || res == -ENOENT) continue;
    if (res <= 0) break;
    fuse_session_process_buf(se_, &buf);
  }
  std::free(buf.mem);
  ::close(ep);
  if (!stopping_.load()) SessionEnded();
}

void SessionTransport::SessionEnded() {
  if (ended_.exchange(true)) return;
  // Wake every other transport thread: the session is over for them too.
  if (stop_fd_ >= 0) eventfd_write(stop_fd_, 1);
  if (options_.on_session_end) options_.on_session_end();
}

void SessionTransport::Stop() {
  if (!started_) return;
  started_ = false;
  stopping_ = true;
  if (se_ != nullptr) fuse_session_exit(se_);
  // Every ring: those made at Start and the spares made since (no more
  // are made once a queue is closed).
  std::vector<Ring*> rings;
  for (auto& r : rings_) rings.push_back(r.get());
  for (auto& q : queues_) {
    {
      std::lock_guard lock(q->mu);
      q->closed = true;
      for (auto& r : q->spawned) rings.push_back(r.get());
    }
    std::lock_guard lock(q->nudger.mu);
    q->nudger.stop = true;
    q->nudger.cv.notify_all();
  }
  if (uring_.load()) {
    eventfd_write(stop_fd_, 1);
    for (Ring* r : rings) {
      bool running;
      {
        std::lock_guard lock(r->mu);
        running = !r->closed && r->ring_ok;
        if (r->phase != Ring::Phase::kFailed) r->phase = Ring::Phase::kStop;
        r->cv.notify_all();
      }
      if (running) eventfd_write(r->wake_fd, 1);
    }
    for (Ring* r : rings) if (r->thread.joinable()) r->thread.join();
    for (auto& t : dev_threads_) if (t.joinable()) t.join();
  } else if (!dev_threads_.empty()) {
    // libfuse's readers block in read(): one more request wakes one, which
    // ends the loop. The waker is joined after the unmount (destructor): its
    // request may be answered only by the unmount.
    if (options_.wake) waker_ = std::thread(options_.wake);
    for (auto& t : dev_threads_) if (t.joinable()) t.join();
  }
  dev_threads_.clear();
}

}  // namespace fleetfs::vfs
