// SessionTransport: how FUSE requests travel between the kernel and the
// handlers of a libfuse 3.14 session: /dev/fuse (libfuse's own loop), or FUSE
// over io_uring, which libfuse 3.14 does not speak.
//
// Why io_uring: a request over /dev/fuse costs a read and a write of the
// device on a thread woken on whichever CPU, about 25 us here, and a WAL
// NORMAL transaction is three of them (docs/BENCHMARKS.md). Over io_uring a
// request lands in a buffer registered by a thread of the requesting CPU's
// queue, and one io_uring_enter both commits an answer and waits for the next
// request. The writeback cache and kernel passthrough would save more but
// accept writes after a lapse (DESIGN 3); this keeps every request in front
// of the handlers, so fencing is unchanged.
//
// How it sits under libfuse: the session's I/O is taken over
// (fuse_session_custom_io). INIT is read and answered here before any loop
// runs, and InitReplyPatch adds FUSE_OVER_IO_URING to the answer when the
// kernel offers it and io_uring rings could be made. Each thread of each
// queue then registers its entries (a header and a payload buffer each,
// the payload sized for the mount's max_write); a request's bytes are laid
// out as /dev/fuse would deliver them, right in front of its payload, and
// handed to fuse_session_process_buf. An answer (libfuse's writev, from any
// thread, even long after: lookups that wait for a restore) is matched to
// its entry by the request's id and committed on the ring that entry came
// from: at once on that ring's own thread, else through its inbox and an
// eventfd. Forgets, interrupts and notifications stay on /dev/fuse, read by
// a few threads that a stop can wake (epoll on the device and an eventfd).
//
// Fallback: when the kernel does not offer io_uring (its `enable_uring`
// parameter off, or no CONFIG_FUSE_IO_URING), rings cannot be made, or the
// kernel refuses a registration (it then goes back to /dev/fuse itself),
// requests are served from /dev/fuse and why() says why. Transport::kIoUring
// turns each of those into a failed Start.
//
// Held answers and the kernel's queue: an answer held for long (a lookup
// behind a restore) keeps its entry, and the kernel hands out a queued
// request only with a commit. So a ring that holds registers another entry
// (while its queue has fewer than threads_per_queue not held) or becomes a
// spare; the held answer is committed on a spare ring (at most
// threads_per_queue are made per queue), so that a thread seldom has two
// entries waiting; and a nudger thread of that CPU makes one request answered
// at once (options.nudge), whose commit takes the next queued request. The
// agent must be able to run on every online CPU for that (else /dev/fuse).
// The .cc says why each is needed.
//
// Thread-safety: Start and Stop from one thread; name(), why() and queues()
// after Start from any thread; the I/O hooks from libfuse's threads.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vfs/init_reply.h"

struct fuse_session;

namespace fleetfs::vfs {

// How FUSE requests reach the agent.
enum class Transport {
  kAuto,     // io_uring when the kernel allows it, else /dev/fuse
  kIoUring,  // io_uring or no mount: Start fails when the kernel refuses it
  kDevFuse,  // read and write /dev/fuse, as libfuse does
};

struct TransportOptions {
  Transport transport = Transport::kAuto;
  // /dev/fuse: libfuse's loop (all requests), or the readers beside io_uring
  // (forgets and interrupts; every request again if the kernel falls back).
  int dev_threads = 10;
  bool clone_fd = false;
  int max_idle_threads = -1;  // -1: libfuse's default
  // io_uring: threads per queue (one queue per possible CPU), each with one
  // entry waiting while it is free: how many requests of one CPU are taken
  // at once (more wait in the kernel, as on /dev/fuse with every thread
  // busy). Idle threads cost a stack and a ring each, and a request wakes
  // only the thread whose entry it landed on.
  int threads_per_queue = 16;
  bool pin_threads = true;  // each queue's threads on its CPU
  // Wakes libfuse's /dev/fuse readers for a stop: makes one request.
  std::function<void()> wake;
  // io_uring: makes one request that is answered at once (a statfs of the
  // mount) from the calling thread, which runs on the queue's CPU. Called
  // after an answer is held (see Nudger in the .cc); without it, requests
  // the kernel queued behind held answers wait for one of them to go.
  std::function<void()> nudge;
  // Called once, from a transport thread, when the session ends without Stop.
  std::function<void()> on_session_end;
  // Tests: called in Start when io_uring was announced and every ring has
  // registered (requests may be served), before Start has settled the rest.
  std::function<void()> serving_before_start_returns;
};

// The op header's size of each opcode as the kernel puts it in an io_uring
// entry (its first argument; 0 where it has none), or -1 for an opcode that
// never comes over io_uring or is unknown.
int UringOpHeaderSize(std::uint32_t opcode, bool setxattr_ext);

class SessionTransport {
 public:
  // Finds the transport of a session from the session's userdata: libfuse
  // hands the I/O hooks only that.
  using OfUserdata = SessionTransport* (*)(void* userdata);

  explicit SessionTransport(TransportOptions options);
  ~SessionTransport();  // Stop
  SessionTransport(const SessionTransport&) = delete;
  SessionTransport& operator=(const SessionTransport&) = delete;

  // `se` is mounted and not yet served; of_userdata(its userdata) must
  // return this. Reads and answers INIT, then serves. False with `error`
  // set when the session cannot be served (INIT failed, or io_uring was
  // required and not possible).
  bool Start(fuse_session* se, OfUserdata of_userdata, std::string* error);
  // Ends serving: every transport thread is joined (on /dev/fuse, after
  // options.wake made one request). The session stays mounted; requests
  // still coming wait until it is destroyed. Destroy this after the session.
  void Stop();

  // Whether the request being handled on this thread may be answered later
  // from another thread: on an io_uring thread, false once its queue holds
  // its bound of requests (each keeps a ring entry); true elsewhere.
  static bool MayHold();

  std::string name() const;  // "io_uring" or "/dev/fuse"
  std::string why() const;   // why not io_uring, under kAuto; else empty
  int queues() const;        // io_uring queues (0 on /dev/fuse)
  const InitReplyPatch& init() const { return init_; }

  // The session's I/O (fuse_custom_io), public for the hooks.
  ssize_t Read(int fd, void* buf, std::size_t len);
  ssize_t Writev(int fd, struct iovec* iov, int count);

  struct Ring;
  struct Entry;
  struct Nudger;
  struct Queue;

 private:
  bool StartUring(std::string* error);
  void JoinStartRings();  // Start's rings, when io_uring will not serve
  void StartDevLoop();
  void StartDevReaders();
  void DevReader(int stop_fd);
  void RingMain(Ring* r, int fd);
  void RunRing(Ring* r, int fd);
  void Process(Entry* e, int fd);
  void Held(Ring* r, int fd);
  bool ReserveEntry(Ring* r) const;  // r->queue->mu held
  static Ring* PickLocked(Queue* q);  // q->mu held
  void RegisterEntry(Ring* r, int fd);
  void Adopt(Entry* e, int fd);
  Ring* Spawn(Queue* q, int fd);
  // Queues `e` on r's `box`, moving it from `from` when not null; false
  // when r has stopped.
  static bool Deliver(Ring* r, std::vector<Entry*> Ring::*box, Entry* e, Ring* from);
  static Entry* NewEntry(Ring* r);
  void SessionEnded();
  void Nudge(Queue* q);
  void RunNudger(Queue* q);

  TransportOptions options_;
  fuse_session* se_ = nullptr;
  InitReplyPatch init_;
  std::atomic<bool> uring_{false};     // every queue registered: io_uring serves
  std::atomic<bool> rings_go_{false};  // entries may hold requests: answers are matched
  std::string why_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::mutex owed_mu_;  // guards owed_; taken alone
  std::unordered_map<std::uint64_t, Entry*> owed_;  // request unique -> its entry, until answered
  int nqueues_ = 0;
  std::size_t payload_size_ = 0;  // of every entry's payload
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<std::thread> dev_threads_;
  std::thread waker_;
  int stop_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ended_{false};
  bool started_ = false;
};

}  // namespace fleetfs::vfs
