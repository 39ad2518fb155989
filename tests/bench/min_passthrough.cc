// A minimal write-through FUSE low-level passthrough: the floor fleetfs is
// measured against in the same benchmark run. No filtering, no fences, no
// statistics beyond per-opcode request counts: lookups, attributes,
// open/create, read, write, fsync, unlink and directory listing over a
// backing directory, with the same kernel settings as fleetfs (no writeback
// cache, no lock operations, 10 threads) unless an option says otherwise.
//
// Not part of fleetfs. Usage (runs until unmounted):
//   min_passthrough [OPTIONS] BACKING MOUNTPOINT
// Options (the /dev/fuse transport's switches, issue 14):
//   --threads N     fuse_loop_cfg_set_max_threads (default 10, as fleetfs)
//   --max-idle N    fuse_loop_cfg_set_idle_threads (default: libfuse's, which
//                   never ends an idle thread)
//   --clone-fd      one cloned /dev/fuse fd per worker thread
//   --single        fuse_session_loop: the main thread serves alone
//   --splice        want FUSE_CAP_SPLICE_READ and _WRITE, and serve writes
//                   with write_buf and reads with fuse_reply_data from the
//                   backing fd, so the spliced data is never copied here
//   --no-splice     clear the three splice capabilities
//   --count         count requests per opcode; print the counts to stderr
//                   on SIGUSR1 and at exit, one line "counts op=N ..."
// Without --splice/--no-splice, libfuse 3.14 decides, and it wants no splice
// here: SPLICE_READ is a default only when the ops have write_buf, and
// SPLICE_WRITE/MOVE are never defaults (do_init in lib/fuse_lowlevel.c).
#define FUSE_USE_VERSION 314

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <future>

#include "vfs/fuse_transport.h"

namespace {

// What the command line asks for. Kept apart from the session and the loop so
// that another transport (io_uring) is one more field and one more case.
struct Options {
  std::string backing;
  std::string mountpoint;
  enum class Loop { kMultiThreaded, kSingle } loop = Loop::kMultiThreaded;
  unsigned threads = 10;              // as fleetfs's default fuse_threads
  std::optional<unsigned> max_idle;   // unset: libfuse's default (-1, never)
  bool clone_fd = false;
  enum class Splice { kLibfuseDefault, kOn, kOff } splice = Splice::kLibfuseDefault;
  bool count = false;
  // --transport io_uring: fleetfs's SessionTransport (vfs/fuse_transport.h),
  // asked for strictly; --uring-threads per queue.
  bool uring = false;
  int uring_threads = 16;
  bool uring_pin = true;
};

constexpr char kUsage[] =
    "usage: min_passthrough [--threads N] [--max-idle N] [--clone-fd] [--single]\n"
    "                       [--splice|--no-splice] [--count]\n"
    "                       [--transport io_uring [--uring-threads N]\n"
    "                        [--no-pin]] BACKING MOUNTPOINT\n";

std::optional<unsigned> ParseCount(const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v > 100000) return std::nullopt;
  return static_cast<unsigned>(v);
}

// Returns nullopt (after saying why on stderr) when the command line is wrong.
std::optional<Options> ParseArgs(int argc, char** argv) {
  Options o;
  std::vector<std::string_view> positional;
  bool mt_option = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto number = [&]() -> std::optional<unsigned> {
      if (i + 1 >= argc) return std::nullopt;
      return ParseCount(argv[++i]);
    };
    if (a == "--threads" || a == "--max-idle") {
      std::optional<unsigned> n = number();
      if (!n || (a == "--threads" && *n == 0)) {
        std::fprintf(stderr, "min_passthrough: %s needs a number (threads >= 1)\n", argv[i - 1]);
        return std::nullopt;
      }
      if (a == "--threads") o.threads = *n;
      else o.max_idle = *n;
      mt_option = true;
    } else if (a == "--clone-fd") {
      o.clone_fd = true;
      mt_option = true;
    } else if (a == "--single") {
      o.loop = Options::Loop::kSingle;
    } else if (a == "--splice") {
      o.splice = Options::Splice::kOn;
    } else if (a == "--no-splice") {
      o.splice = Options::Splice::kOff;
    } else if (a == "--count") {
      o.count = true;
    } else if (a == "--transport") {
      if (i + 1 >= argc || std::string_view(argv[i + 1]) != "io_uring") {
        std::fprintf(stderr, "min_passthrough: --transport takes io_uring (/dev/fuse is the default)\n");
        return std::nullopt;
      }
      ++i;
      o.uring = true;
    } else if (a == "--uring-threads") {
      std::optional<unsigned> n = number();
      if (!n || *n == 0) {
        std::fprintf(stderr, "min_passthrough: %s needs a number >= 1\n", argv[i - 1]);
        return std::nullopt;
      }
      o.uring_threads = static_cast<int>(*n);
    } else if (a == "--no-pin") {
      o.uring_pin = false;
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "min_passthrough: unknown option %s\n%s", argv[i], kUsage);
      return std::nullopt;
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) {
    std::fputs(kUsage, stderr);
    return std::nullopt;
  }
  if (o.loop == Options::Loop::kSingle && mt_option) {
    std::fprintf(stderr, "min_passthrough: --single has no threads to configure\n");
    return std::nullopt;
  }
  o.backing = positional[0];
  o.mountpoint = positional[1];
  return o;
}

// One counter per handler, so a benchmark can check that an operation costs
// the requests it thinks (a batch forget counts once, as one request).
enum class Op {
  kLookup, kForget, kGetattr, kSetattr, kOpen, kCreate, kRead, kWrite, kFlush,
  kRelease, kFsync, kUnlink, kOpendir, kReaddir, kReleasedir, kFsyncdir, kStatfs,
  kNumOps
};
constexpr std::array<const char*, static_cast<size_t>(Op::kNumOps)> kOpNames = {
    "lookup", "forget", "getattr", "setattr", "open", "create", "read", "write", "flush",
    "release", "fsync", "unlink", "opendir", "readdir", "releasedir", "fsyncdir", "statfs"};

struct Inode {
  int fd = -1;  // O_PATH
  uint64_t nlookup = 0;
  ~Inode() {
    if (fd >= 0) close(fd);
  }
};

struct Fs {
  int root_fd = -1;
  bool splice = false;  // serve data through fds (write_buf, fuse_reply_data)
  Options::Splice splice_want = Options::Splice::kLibfuseDefault;
  bool report_init = false;
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Op::kNumOps)> counts{};
  std::mutex mu;  // guards inodes and by_key
  std::map<fuse_ino_t, std::unique_ptr<Inode>> inodes;
  std::map<std::pair<dev_t, ino_t>, fuse_ino_t> by_key;
  fuse_ino_t next = 2;
  fleetfs::vfs::SessionTransport* transport = nullptr;  // --transport io_uring
};

Fs& Self(fuse_req_t req) { return *static_cast<Fs*>(fuse_req_userdata(req)); }

Fs& Counted(fuse_req_t req, Op op) {
  Fs& fs = Self(req);
  fs.counts[static_cast<size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  return fs;
}

void PrintCounts(const Fs& fs) {
  std::string line = "counts";
  for (size_t i = 0; i < fs.counts.size(); ++i) {
    uint64_t n = fs.counts[i].load(std::memory_order_relaxed);
    if (n != 0) line += " " + std::string(kOpNames[i]) + "=" + std::to_string(n);
  }
  line += "\n";
  // One write, so a reader of the pipe gets the line whole.
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

int FdOf(Fs& fs, fuse_ino_t ino) {
  if (ino == FUSE_ROOT_ID) return fs.root_fd;
  std::lock_guard lock(fs.mu);
  auto it = fs.inodes.find(ino);
  return it == fs.inodes.end() ? -1 : it->second->fd;
}

std::string Proc(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

int DoLookup(Fs& fs, fuse_ino_t parent, const char* name, fuse_entry_param* e) {
  int pfd = FdOf(fs, parent);
  int fd = openat(pfd, name, O_PATH | O_NOFOLLOW);
  if (fd < 0) return errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  std::lock_guard lock(fs.mu);
  auto key = std::make_pair(st.st_dev, st.st_ino);
  fuse_ino_t ino;
  if (auto it = fs.by_key.find(key); it != fs.by_key.end()) {
    ino = it->second;
    close(fd);
  } else {
    ino = fs.next++;
    auto inode = std::make_unique<Inode>();
    inode->fd = fd;
    fs.inodes[ino] = std::move(inode);
    fs.by_key[key] = ino;
  }
  fs.inodes[ino]->nlookup++;
  e->ino = ino;
  e->attr = st;
  e->attr.st_ino = ino;
  e->attr_timeout = 1.0;
  e->entry_timeout = 1.0;
  return 0;
}

void Init(void* userdata, fuse_conn_info* conn) {
  Fs& fs = *static_cast<Fs*>(userdata);
  conn->want &= ~(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
  constexpr unsigned kSplice = FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE;
  if (fs.splice_want == Options::Splice::kOn) conn->want |= conn->capable & kSplice;
  if (fs.splice_want == Options::Splice::kOff) conn->want &= ~(kSplice | FUSE_CAP_SPLICE_MOVE);
  if (fs.report_init) {
    std::fprintf(stderr, "init splice_read=%d splice_write=%d splice_move=%d\n",
                 (conn->want & FUSE_CAP_SPLICE_READ) != 0, (conn->want & FUSE_CAP_SPLICE_WRITE) != 0,
                 (conn->want & FUSE_CAP_SPLICE_MOVE) != 0);
  }
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_entry_param e{};
  int err = DoLookup(Counted(req, Op::kLookup), parent, name, &e);
  if (err) fuse_reply_err(req, err);
  else fuse_reply_entry(req, &e);
}

void ForgetOne(Fs& fs, fuse_ino_t ino, uint64_t n) {
  std::lock_guard lock(fs.mu);
  auto it = fs.inodes.find(ino);
  if (it == fs.inodes.end()) return;
  it->second->nlookup -= std::min(n, it->second->nlookup);
  if (it->second->nlookup == 0) {
    struct stat st;
    if (fstat(it->second->fd, &st) == 0) fs.by_key.erase({st.st_dev, st.st_ino});
    fs.inodes.erase(it);
  }
}

void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  ForgetOne(Counted(req, Op::kForget), ino, n);
  fuse_reply_none(req);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* f) {
  Counted(req, Op::kForget);
  for (size_t i = 0; i < count; ++i) ForgetOne(Self(req), f[i].ino, f[i].nlookup);
  fuse_reply_none(req);
}

void ReplyAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  struct stat st;
  int fd = fi ? static_cast<int>(fi->fh) : FdOf(Self(req), ino);
  if (fstat(fd, &st) != 0) return (void)fuse_reply_err(req, errno);
  st.st_ino = ino;
  fuse_reply_attr(req, &st, 1.0);
}

void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  int pfd = FdOf(Counted(req, Op::kSetattr), ino);
  if (to_set & FUSE_SET_ATTR_SIZE) {
    int rc = fi ? ftruncate(static_cast<int>(fi->fh), attr->st_size)
                : truncate(Proc(pfd).c_str(), attr->st_size);
    if (rc != 0) return (void)fuse_reply_err(req, errno);
  }
  if (to_set & FUSE_SET_ATTR_MODE) chmod(Proc(pfd).c_str(), attr->st_mode);
  ReplyAttr(req, ino, fi);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Counted(req, Op::kGetattr);
  ReplyAttr(req, ino, fi);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int fd = open(Proc(FdOf(Counted(req, Op::kOpen), ino)).c_str(), fi->flags & ~(O_NOFOLLOW | O_CREAT));
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  fi->fh = static_cast<uint64_t>(fd);
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
            fuse_file_info* fi) {
  Fs& fs = Counted(req, Op::kCreate);
  int fd = openat(FdOf(fs, parent), name, (fi->flags | O_CREAT) & ~O_NOFOLLOW, mode);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  fuse_entry_param e{};
  if (int err = DoLookup(fs, parent, name, &e); err != 0) {
    close(fd);
    return (void)fuse_reply_err(req, err);
  }
  fi->fh = static_cast<uint64_t>(fd);
  fi->keep_cache = 1;
  fuse_reply_create(req, &e, fi);
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  if (Counted(req, Op::kRead).splice) {
    // libfuse splices from the backing fd into the device when the reply is
    // two pages or more and SPLICE_WRITE is wanted; else it reads it here.
    fuse_bufvec data = FUSE_BUFVEC_INIT(size);
    data.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    data.buf[0].fd = static_cast<int>(fi->fh);
    data.buf[0].pos = off;
    fuse_reply_data(req, &data, FUSE_BUF_SPLICE_MOVE);
    return;
  }
  thread_local std::vector<char> buf;
  if (buf.size() < size) buf.resize(size);
  ssize_t n = pread(static_cast<int>(fi->fh), buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void Write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
           fuse_file_info* fi) {
  Counted(req, Op::kWrite);
  ssize_t n = pwrite(static_cast<int>(fi->fh), buf, size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_write(req, static_cast<size_t>(n));
}

// Only with --splice: the data may still be in libfuse's pipe (a request of
// a page or more), and goes from there into the backing file uncopied.
void WriteBuf(fuse_req_t req, fuse_ino_t, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  Counted(req, Op::kWrite);
  fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
  out.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  out.buf[0].fd = static_cast<int>(fi->fh);
  out.buf[0].pos = off;
  ssize_t n = fuse_buf_copy(&out, in, static_cast<fuse_buf_copy_flags>(0));
  if (n < 0) return (void)fuse_reply_err(req, static_cast<int>(-n));
  fuse_reply_write(req, static_cast<size_t>(n));
}

void Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
  Counted(req, Op::kFlush);
  fuse_reply_err(req, 0);
}

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Counted(req, Op::kRelease);
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void Fsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  Counted(req, Op::kFsync);
  int fd = static_cast<int>(fi->fh);
  fuse_reply_err(req, (datasync ? fdatasync(fd) : fsync(fd)) == 0 ? 0 : errno);
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, unlinkat(FdOf(Counted(req, Op::kUnlink), parent), name, 0) == 0 ? 0 : errno);
}

void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int fd = openat(FdOf(Counted(req, Op::kOpendir), ino), ".", O_RDONLY | O_DIRECTORY);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  fi->fh = static_cast<uint64_t>(fd);
  fuse_reply_open(req, fi);
}

void Readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  Counted(req, Op::kReaddir);
  int fd = dup(static_cast<int>(fi->fh));
  DIR* d = fdopendir(fd);
  rewinddir(d);
  std::vector<char> buf(size);
  size_t used = 0;
  off_t i = 0;
  while (dirent* ent = readdir(d)) {
    if (i++ < off) continue;
    struct stat st {};
    st.st_ino = ent->d_ino;
    st.st_mode = static_cast<mode_t>(ent->d_type) << 12;
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, ent->d_name, &st, i);
    if (need > size - used) break;
    used += need;
  }
  closedir(d);
  fuse_reply_buf(req, buf.data(), used);
}

void Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Counted(req, Op::kReleasedir);
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void Fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  Counted(req, Op::kFsyncdir);
  fuse_reply_err(req, fsync(static_cast<int>(fi->fh)) == 0 ? 0 : errno);
}

void Statfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st;
  fstatvfs(Counted(req, Op::kStatfs).root_fd, &st);
  fuse_reply_statfs(req, &st);
}

// The low-level session over a mount: the same whatever loop then serves it.
fuse_session* NewSession(Fs& fs, const Options& o) {
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Lookup;
  ops.forget = Forget;
  ops.forget_multi = ForgetMulti;
  ops.getattr = Getattr;
  ops.setattr = Setattr;
  ops.open = Open;
  ops.create = Create;
  ops.read = Read;
  ops.write = Write;
  // libfuse wants SPLICE_READ by default as soon as write_buf is there: only
  // --splice sets it, so the default keeps today's copy path.
  if (o.splice == Options::Splice::kOn) ops.write_buf = WriteBuf;
  ops.flush = Flush;
  ops.release = Release;
  ops.fsync = Fsync;
  ops.unlink = Unlink;
  ops.opendir = Opendir;
  ops.readdir = Readdir;
  ops.releasedir = Releasedir;
  ops.fsyncdir = Fsyncdir;
  ops.statfs = Statfs;
  std::string opts = "allow_other,default_permissions,fsname=minpt";
  std::string argv0 = "min_passthrough";
  std::vector<char*> args_v = {argv0.data(), const_cast<char*>("-o"), opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, args_v.data());
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &fs);
  fuse_opt_free_args(&args);
  if (se == nullptr) return nullptr;
  if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return nullptr;
  }
  return se;
}

// Serves the session over /dev/fuse until it is unmounted. Another transport
// is another function beside this one, chosen in main.
int ServeDevFuse(fuse_session* se, const Options& o) {
  if (o.loop == Options::Loop::kSingle) return fuse_session_loop(se);
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, o.threads);
  if (o.max_idle) fuse_loop_cfg_set_idle_threads(config, *o.max_idle);
  fuse_loop_cfg_set_clone_fd(config, o.clone_fd ? 1 : 0);
  int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  return rc;
}

// Serves the session over io_uring until it is unmounted: fleetfs's own
// transport, so that the floor and fleetfs are measured on the same one.
int ServeUring(fuse_session* se, Fs& fs, const Options& o) {
  std::promise<void> ended;
  fleetfs::vfs::TransportOptions t;
  t.transport = fleetfs::vfs::Transport::kIoUring;
  t.threads_per_queue = o.uring_threads;
  t.pin_threads = o.uring_pin;
  t.on_session_end = [&ended] { ended.set_value(); };
  fleetfs::vfs::SessionTransport transport(std::move(t));
  fs.transport = &transport;
  std::string error;
  if (!transport.Start(
          se, [](void* userdata) { return static_cast<Fs*>(userdata)->transport; }, &error)) {
    std::fprintf(stderr, "min_passthrough: %s\n", error.c_str());
    return 1;
  }
  std::printf("min_passthrough: transport %s, %d queues\n", transport.name().c_str(),
               transport.queues());
  ended.get_future().wait();
  transport.Stop();
  return 0;
}

// Prints the counts on each SIGUSR1 until Stop(). SIGUSR1 must be blocked in
// every thread (block it before any other thread starts).
class CountReporter {
 public:
  explicit CountReporter(const Fs& fs) : fs_(fs), thread_([this] { Run(); }) {}
  ~CountReporter() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }

 private:
  void Run() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    int sig = 0;
    while (sigwait(&set, &sig) == 0 && !stop_.load()) PrintCounts(fs_);
  }
  const Fs& fs_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> options = ParseArgs(argc, argv);
  if (!options) return 2;
  const Options& o = *options;
  Fs fs;
  fs.root_fd = open(o.backing.c_str(), O_PATH | O_DIRECTORY);
  if (fs.root_fd < 0) {
    std::perror(o.backing.c_str());
    return 1;
  }
  fs.splice = o.splice == Options::Splice::kOn;
  fs.splice_want = o.splice;
  fs.report_init = o.count;

  std::optional<CountReporter> reporter;
  if (o.count) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    reporter.emplace(fs);
  }

  fuse_session* se = NewSession(fs, o);
  if (se == nullptr) return 1;
  int rc = o.uring ? ServeUring(se, fs, o) : ServeDevFuse(se, o);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  if (reporter) {
    reporter->Stop();
    PrintCounts(fs);
  }
  return rc == 0 ? 0 : 1;
}
