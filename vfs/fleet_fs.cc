#define FUSE_USE_VERSION 314

#include "vfs/fleet_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"
#include "vfs/control_files.h"
#include "vfs/fence.h"
#include "vfs/inode_table.h"
#include "vfs/negative_names.h"

namespace fleetfs::vfs {
namespace {

// The kernel may cache entries and attributes this long; a fence tells it to
// forget them at once, so the timeout only bounds staleness of attributes.
constexpr double kEntryTimeout = 1.0;

// Negative entries remembered at most; beyond, absent names are not cached.
constexpr std::size_t kMaxNegativeNames = 100'000;

std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

struct FileHandle {
  UniqueFd fd;
  std::shared_ptr<FileInode> inode;
  ServingToken token;
  std::shared_ptr<TenantWatch> watch;  // replication's, for main, -wal and -journal
};

// DoLookupFile handed the request to the replicator; the reply comes later.
constexpr int kDeferred = -1;

struct VirtualHandle {
  std::string content;
};

struct DirHandle {
  bool listed = false;
  std::vector<ControlFiles::Entry> entries;
};

// The fence's way to the kernel: the session's notifications.
class SessionNotifier final : public KernelNotifier {
 public:
  explicit SessionNotifier(fuse_session** session) : session_(session) {}
  void InvalEntry(std::uint64_t parent, std::string_view name) override {
    fuse_lowlevel_notify_inval_entry(*session_, parent, name.data(), name.size());
  }
  void InvalInode(std::uint64_t ino) override {
    fuse_lowlevel_notify_inval_inode(*session_, ino, 0, 0);
  }
  void Store(std::uint64_t ino, std::uint64_t offset, std::string_view data) override {
    fuse_bufvec buf = FUSE_BUFVEC_INIT(data.size());
    buf.buf[0].mem = const_cast<char*>(data.data());
    fuse_lowlevel_notify_store(*session_, ino, static_cast<off_t>(offset), &buf,
                               static_cast<fuse_buf_copy_flags>(0));
  }

 private:
  fuse_session** session_;  // the mount's; set before the fence thread starts
};

}  // namespace

class FleetFs::Impl final : public FencedFiles {
 public:
  explicit Impl(MountOptions options)
      : options_(std::move(options)),
        control_(options_.status_json, options_.ranges_text),
        negative_(kMaxNegativeNames,
                  std::chrono::duration_cast<MonoTime::duration>(
                      std::chrono::duration<double>(kEntryTimeout))),
        notifier_(&session_),
        fence_(notifier_, *this, *options_.clock, stats_) {}
  ~Impl() override { Stop(); }

  Status Start(std::shared_ptr<const ServingView> initial);
  void Publish(std::shared_ptr<const ServingView> view);
  void WaitForFences() { fence_.Wait(); }
  void Stop();

  const VfsStats& stats() const { return stats_; }
  std::size_t OpenHandles() const {
    std::lock_guard lock(handles_mu_);
    return handles_.size();
  }
  std::size_t OpenHandlesIn(Slot first, Slot last) override {
    std::lock_guard lock(handles_mu_);
    std::size_t n = 0;
    for (const FileHandle* h : handles_) {
      if (h->inode->file.slot >= first && h->inode->file.slot <= last) ++n;
    }
    return n;
  }

  // FencedFiles, for the fence thread.
  std::vector<FenceTarget> FilesIn(const std::vector<ServedRange>& ranges) override;
  std::vector<EntryName> ForgetAbsentIn(const std::vector<ServedRange>& claimed) override {
    std::lock_guard lock(negative_mu_);
    return negative_.ForgetIn(claimed, Now());
  }

  // FUSE handlers; each sends exactly one reply.
  static void Init(void* userdata, fuse_conn_info* conn);
  static void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  static void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
  static void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets);
  static void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                      fuse_file_info* fi);
  static void Mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t);
  static void Mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t);
  static void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  static void Rmdir(fuse_req_t req, fuse_ino_t, const char*);
  static void Symlink(fuse_req_t req, const char*, fuse_ino_t, const char*);
  static void Rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                     unsigned int);
  static void Link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*);
  static void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                     fuse_file_info* fi);
  static void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  static void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
                    fuse_file_info* fi);
  static void Flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
  static void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      fuse_file_info* fi);
  static void Releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  static void Fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
  static void Statfs(fuse_req_t req, fuse_ino_t ino);
  static void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
                        fuse_file_info* fi);

 private:
  static Impl& Self(fuse_req_t req) { return *static_cast<Impl*>(fuse_req_userdata(req)); }

  std::shared_ptr<const ServingView> View() const {
    return view_.load(std::memory_order_acquire);
  }
  MonoTime Now() const { return options_.clock->Now(); }

  // Counts the operation, and the error when `err` is not 0; true when the
  // caller should send the error reply.
  bool Failed(fuse_req_t req, Op op, int err) {
    stats_.Count(op);
    if (err == 0) return false;
    stats_.CountError(op, err);
    if (err == ESTALE) stats_.fenced.fetch_add(1, std::memory_order_relaxed);
    fuse_reply_err(req, err);
    return true;
  }

  // The handle of an open fleet file, or ESTALE when its range is no longer
  // served under the token it was opened with (ServingView's admission
  // rule). `view` must stay held until the operation has reached the backing
  // file.
  static FileHandle* HandleOf(fuse_file_info* fi) {
    return reinterpret_cast<FileHandle*>(static_cast<uintptr_t>(fi->fh));
  }
  int CheckHandle(const ServingView& view, const FileHandle& h) const {
    return view.Admits(h.inode->file.slot, h.inode->file.role, h.token, Now()) ? 0 : ESTALE;
  }

  int BucketFd(int bucket);
  int EnsureBucket(int bucket);
  int StatBucket(int bucket, struct stat* st);
  void RootAttr(struct stat* st) const;

  int DoLookup(fuse_req_t req, const ServingView& view, fuse_ino_t parent, const char* name,
               fuse_entry_param* e, bool prepared);
  int DoLookupFile(fuse_req_t req, const ServingView& view, int bucket, std::string_view name,
                   fuse_entry_param* e, bool prepared);
  // A main file needs the replicator before it is exposed under `epoch`.
  bool NeedsPrepare(const FileInode* inode, std::uint64_t epoch) const;
  void Defer(fuse_req_t req, fuse_ino_t parent, std::string name, const FleetFile& file,
             std::uint64_t epoch);
  std::shared_ptr<TenantWatch> WatchOf(const FileInode& inode, std::uint64_t epoch) {
    return options_.hooks ? options_.hooks->Watch(inode.file, epoch) : nullptr;
  }
  // Records a negative entry; false when too many are remembered to cache more.
  bool RememberNegative(fuse_ino_t parent, std::string_view name, Slot slot) {
    std::lock_guard lock(negative_mu_);
    return negative_.Remember(parent, name, slot, Now());
  }
  int DoCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi, fuse_entry_param* e);
  int DoSetattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi,
                struct stat* out);
  int DoUnlink(fuse_ino_t parent, const char* name);
  int ListDir(fuse_ino_t ino, DirHandle& dir);

  // Virtual-file and directory handles, kept so Stop can free what the
  // kernel never releases.
  template <typename H>
  void Keep(std::unordered_set<H*>& set, H* h) {
    std::lock_guard lock(other_handles_mu_);
    set.insert(h);
  }
  template <typename H>
  void Discard(std::unordered_set<H*>& set, H* h) {
    {
      std::lock_guard lock(other_handles_mu_);
      set.erase(h);
    }
    delete h;
  }

  void AddHandle(FileHandle* h) {
    std::lock_guard lock(handles_mu_);
    handles_.insert(h);
  }
  void RemoveHandle(FileHandle* h) {
    std::lock_guard lock(handles_mu_);
    handles_.erase(h);
  }

  MountOptions options_;
  ControlFiles control_;
  UniqueFd root_fd_;
  struct stat root_stat_ {};
  std::array<std::atomic<int>, kBucketCount> bucket_fds_{};
  VfsStats stats_;

  // What every operation checks. Publish swaps it in one atomic exchange (the
  // atomic's internal lock is held for that swap only, never across a store
  // call); operations hold the loaded view until their backing call returns.
  std::atomic<std::shared_ptr<const ServingView>> view_;

  InodeTable inodes_;

  std::mutex negative_mu_;  // guards negative_; taken alone
  NegativeNames negative_;

  mutable std::mutex handles_mu_;  // guards handles_; taken alone
  std::unordered_set<FileHandle*> handles_;
  // Handles the kernel never releases when the session ends with them open.
  std::mutex other_handles_mu_;  // guards the two sets below; taken alone
  std::unordered_set<VirtualHandle*> virtual_handles_;
  std::unordered_set<DirHandle*> dir_handles_;

  fuse_session* session_ = nullptr;
  SessionNotifier notifier_;
  Fence fence_;  // after everything it reaches: destroyed (stopped) first
  std::thread loop_thread_;
  bool mounted_ = false;
  std::atomic<bool> stopping_{false};  // Stop has begun: the session's end is expected
};

// ---- start and stop ----

Status FleetFs::Impl::Start(std::shared_ptr<const ServingView> initial) {
  for (auto& fd : bucket_fds_) fd.store(-1);
  root_fd_ = UniqueFd(::open(options_.backing.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd_.valid()) return ErrnoStatus("backing directory " + options_.backing, errno);
  if (::fstat(root_fd_.get(), &root_stat_) != 0) {
    return ErrnoStatus("backing directory " + options_.backing, errno);
  }
  view_.store(std::move(initial));

  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = Init;
    o.lookup = Lookup;
    o.forget = Forget;
    o.forget_multi = ForgetMulti;
    o.getattr = Getattr;
    o.setattr = Setattr;
    o.mknod = Mknod;
    o.mkdir = Mkdir;
    o.unlink = Unlink;
    o.rmdir = Rmdir;
    o.symlink = Symlink;
    o.rename = Rename;
    o.link = Link;
    o.open = Open;
    o.create = Create;
    o.read = Read;
    o.write = Write;
    o.flush = Flush;
    o.release = Release;
    o.fsync = Fsync;
    o.opendir = Opendir;
    o.readdir = Readdir;
    o.releasedir = Releasedir;
    o.fsyncdir = Fsyncdir;
    o.statfs = Statfs;
    o.fallocate = Fallocate;
    return o;
  }();

  // allow_other + default_permissions: applications run as other users, and
  // the kernel checks the backing files' owner and mode for them.
  std::vector<std::string> arg_strings = {
      "fleetfs", "-o", "allow_other,default_permissions,fsname=fleetfs,subtype=fleetfs"};
  std::vector<char*> argv;
  for (auto& s : arg_strings) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  session_ = fuse_session_new(&args, &ops, sizeof(ops), this);
  fuse_opt_free_args(&args);
  if (session_ == nullptr) return Internal("the FUSE session could not be created");
  if (fuse_session_mount(session_, options_.mountpoint.c_str()) != 0) {
    fuse_session_destroy(session_);
    session_ = nullptr;
    return Unavailable("the kernel refused to mount " + options_.mountpoint +
                       " (is /dev/fuse there, and are we root?)");
  }
  mounted_ = true;
  fence_.Start();
  loop_thread_ = std::thread([this] {
    fuse_loop_config* config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(options_.max_threads));
    fuse_loop_cfg_set_clone_fd(config, 0);
    int rc = fuse_session_loop_mt(session_, config);
    fuse_loop_cfg_destroy(config);
    if (!stopping_.load()) {
      spdlog::error("vfs: the FUSE session at {} ended without the agent ({}): unmounted by "
                    "someone else?", options_.mountpoint, rc);
      if (options_.on_session_end) options_.on_session_end();
    }
  });
  return Status::Ok();
}

void FleetFs::Impl::Stop() {
  // Fences still queued are run first: they need the session.
  fence_.Stop();
  stopping_ = true;
  if (mounted_) {
    fuse_session_exit(session_);
    // A worker blocked reading /dev/fuse sees the exit flag only after one
    // more request: send one, from a thread of its own.
    std::thread waker([path = options_.mountpoint + "/" + std::string(kControlDirName) +
                              "/wake-" + std::to_string(::getpid())] {
      struct stat st;
      ::stat(path.c_str(), &st);
    });
    if (loop_thread_.joinable()) loop_thread_.join();
    fuse_session_unmount(session_);
    waker.join();
    fuse_session_destroy(session_);
    session_ = nullptr;
    mounted_ = false;
  }
  // The session is gone: the kernel will not release what is still open.
  {
    std::lock_guard lock(handles_mu_);
    for (FileHandle* h : handles_) delete h;
    handles_.clear();
  }
  {
    std::lock_guard lock(other_handles_mu_);
    for (VirtualHandle* h : virtual_handles_) delete h;
    for (DirHandle* h : dir_handles_) delete h;
    virtual_handles_.clear();
    dir_handles_.clear();
  }
  for (auto& fd : bucket_fds_) {
    int old = fd.exchange(-1);
    if (old >= 0) ::close(old);
  }
}

void FleetFs::Impl::Init(void* userdata, fuse_conn_info* conn) {
  (void)userdata;
  // A writeback cache would accept writes after a lapse and drop them later.
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  // No lock operations: the kernel keeps POSIX and BSD locks itself.
  conn->want &= ~(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
}

// ---- the serving view and fences ----

void FleetFs::Impl::Publish(std::shared_ptr<const ServingView> view) {
  MonoTime now = Now();
  std::shared_ptr<const ServingView> old = view_.exchange(view, std::memory_order_acq_rel);
  fence_.Replaced(std::move(old), *view, now);
}

std::vector<FenceTarget> FleetFs::Impl::FilesIn(const std::vector<ServedRange>& ranges) {
  std::vector<FenceTarget> targets;
  for (const auto& inode : inodes_.In(ranges)) {
    FenceTarget t{inode->ino, EntryName{BucketIno(inode->bucket), inode->name}, inode->file.role,
                  std::nullopt};
    struct stat st;
    if (t.role == FileRole::kShm && ::fstat(inode->path_fd.get(), &st) == 0) {
      t.size = static_cast<std::uint64_t>(st.st_size);
    }
    targets.push_back(std::move(t));
  }
  return targets;
}

// ---- inodes and attributes ----

int FleetFs::Impl::BucketFd(int bucket) {
  int fd = bucket_fds_[bucket].load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  std::string name = BucketName(bucket);
  fd = ::openat(root_fd_.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;  // not made yet: no file in it
  int expected = -1;
  if (!bucket_fds_[bucket].compare_exchange_strong(expected, fd)) {
    ::close(fd);
    return expected;
  }
  return fd;
}

// The backing bucket directory is made with the first file in it (see
// OpenOrMakeBucket: the root's owner and mode, so whoever may create in the
// root may create in every bucket).
int FleetFs::Impl::EnsureBucket(int bucket) {
  int fd = BucketFd(bucket);
  if (fd >= 0) return fd;
  auto made = OpenOrMakeBucket(root_fd_.get(), bucket);
  if (!made.ok()) {
    spdlog::warn("vfs: {}", made.status().message());
    return -EIO;
  }
  made->Reset();
  fd = BucketFd(bucket);
  return fd >= 0 ? fd : -EIO;
}

void FleetFs::Impl::RootAttr(struct stat* st) const {
  *st = root_stat_;
  st->st_ino = kRootIno;
}

int FleetFs::Impl::StatBucket(int bucket, struct stat* st) {
  int fd = BucketFd(bucket);
  if (fd < 0 || ::fstat(fd, st) != 0) {
    // Not made yet: it looks like the root, empty.
    *st = root_stat_;
    st->st_nlink = 2;
  }
  st->st_ino = BucketIno(bucket);
  return 0;
}

// ---- lookup ----

// An absent fleet name in a served slot is answered with a negative entry,
// which the kernel caches: SQLite checks for a journal that is not there
// before every transaction. The names are remembered, and a claim makes the
// kernel forget those of its ranges, so no cached absence outlives the claim.
// Names in unserved slots are answered with an error, which is never cached.
int FleetFs::Impl::DoLookupFile(fuse_req_t req, const ServingView& view, int bucket,
                                std::string_view name, fuse_entry_param* e, bool prepared) {
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return ENOENT;  // not a fleet file: hidden
  const ServedRange* served = view.accepting() ? view.Find(file->slot, Now()) : nullptr;
  if (served == nullptr) return ENOENT;
  const std::uint64_t epoch = served->token.epoch;
  const fuse_ino_t parent = BucketIno(bucket);
  const bool main = file->role == FileRole::kMain && options_.hooks != nullptr;
  auto absent = [&] {
    if (main && !prepared) {
      // Missing here: the replica may hold it. Restored before it is exposed.
      Defer(req, parent, std::string(name), *file, epoch);
      return kDeferred;
    }
    if (!RememberNegative(parent, name, file->slot)) return ENOENT;
    e->ino = 0;  // a negative entry, cached for entry_timeout
    return 0;
  };
  int bfd = BucketFd(bucket);
  if (bfd < 0) return absent();
  std::string n(name);
  UniqueFd fd(::openat(bfd, n.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return errno == ENOENT ? absent() : errno;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return ENOENT;  // a symlink or device is no fleet file
  auto inode = inodes_.Remember(bucket, name, *file, std::move(fd), st);
  if (main && !prepared && NeedsPrepare(inode.get(), epoch)) {
    inodes_.Forget(inode->ino, 1);  // the deferred lookup counts its own
    Defer(req, parent, std::move(n), *file, epoch);
    return kDeferred;
  }
  if (main && inode->exposed_epoch.load() < epoch) inode->exposed_epoch.store(epoch);
  st.st_ino = inode->ino;
  e->ino = inode->ino;
  e->attr = st;
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  return 0;
}

bool FleetFs::Impl::NeedsPrepare(const FileInode* inode, std::uint64_t epoch) const {
  if (inode->exposed_epoch.load() >= epoch) return false;
  // The stamp is read here, on the FUSE thread: a local call, and the common
  // answer ("already stamped for this epoch") needs nothing more.
  return ReadEpochStamp(inode->path_fd.get()).value_or(0) < epoch;
}

void FleetFs::Impl::Defer(fuse_req_t req, fuse_ino_t parent, std::string name,
                          const FleetFile& file, std::uint64_t epoch) {
  stats_.Count(Op::kLookup);
  // The reply comes from the replicator's thread: no FUSE worker waits.
  options_.hooks->Prepare(file, epoch, [this, req, parent, name = std::move(name)](int err) {
    if (err != 0) {
      stats_.CountError(Op::kLookup, err);
      fuse_reply_err(req, err);
      return;
    }
    auto view = View();
    fuse_entry_param e{};
    int rc = DoLookup(req, *view, parent, name.c_str(), &e, /*prepared=*/true);
    if (rc != 0) {
      stats_.CountError(Op::kLookup, rc);
      fuse_reply_err(req, rc);
      return;
    }
    if (e.ino == 0) stats_.CountError(Op::kLookup, ENOENT);
    fuse_reply_entry(req, &e);
  });
}

int FleetFs::Impl::DoLookup(fuse_req_t req, const ServingView& view, fuse_ino_t parent,
                            const char* name, fuse_entry_param* e, bool prepared) {
  std::string_view n(name);
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  if (parent == kRootIno) {
    if (ControlFiles::Lookup(parent, n) == kControlDirIno) {
      e->ino = kControlDirIno;
      e->attr = ControlFiles::Attr(kControlDirIno, root_stat_.st_mtim);
      return 0;
    }
    std::optional<int> bucket = ParseBucketName(n);
    if (!bucket) return ENOENT;
    e->ino = BucketIno(*bucket);
    return StatBucket(*bucket, &e->attr);
  }
  if (parent == kControlDirIno) {
    fuse_ino_t ino = ControlFiles::Lookup(parent, n);
    if (ino == 0) return ENOENT;
    e->ino = ino;
    e->attr = ControlFiles::Attr(ino, root_stat_.st_mtim);
    // Never cached: each open makes the content anew.
    e->attr_timeout = 0;
    return 0;
  }
  if (IsBucketIno(parent)) return DoLookupFile(req, view, BucketOfIno(parent), n, e, prepared);
  return ENOENT;
}

void FleetFs::Impl::Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Impl& self = Self(req);
  // Held until the kernel has the answer: a claim's fence runs after every
  // lookup under an older view has answered, so it sees their negative entries.
  auto view = self.View();
  fuse_entry_param e{};
  int err = self.DoLookup(req, *view, parent, name, &e, /*prepared=*/false);
  if (err == kDeferred) return;
  if (self.Failed(req, Op::kLookup, err)) return;
  if (e.ino == 0) self.stats_.CountError(Op::kLookup, ENOENT);
  fuse_reply_entry(req, &e);
}

void FleetFs::Impl::Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Self(req).inodes_.Forget(ino, nlookup);
  fuse_reply_none(req);
}

void FleetFs::Impl::ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Self(req).inodes_.Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

// ---- attributes ----

void FleetFs::Impl::Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  struct stat st {};
  int err = 0;
  if (ino == kRootIno) {
    self.RootAttr(&st);
  } else if (IsBucketIno(ino)) {
    err = self.StatBucket(BucketOfIno(ino), &st);
  } else if (ControlFiles::Is(ino)) {
    st = ControlFiles::Attr(ino, self.root_stat_.st_mtim);
  } else {
    auto view = self.View();
    auto inode = self.inodes_.Find(ino);
    if (fi != nullptr) {
      FileHandle* h = HandleOf(fi);
      err = self.CheckHandle(*view, *h);
      if (err == 0 && ::fstat(h->fd.get(), &st) != 0) err = errno;
    } else if (inode == nullptr || view->Find(inode->file.slot, self.Now()) == nullptr) {
      err = ESTALE;
    } else if (::fstat(inode->path_fd.get(), &st) != 0) {
      err = errno;
    }
    st.st_ino = ino;
  }
  if (self.Failed(req, Op::kGetattr, err)) return;
  fuse_reply_attr(req, &st, kEntryTimeout);
}

int FleetFs::Impl::DoSetattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi,
                             struct stat* out) {
  if (ino < kFirstFileIno) return EPERM;  // the layout's directories are fixed
  auto view = View();  // held until the change reached the backing file
  auto inode = inodes_.Find(ino);
  FileHandle* h = fi != nullptr ? HandleOf(fi) : nullptr;
  if (h != nullptr) {
    if (int err = CheckHandle(*view, *h); err != 0) return err;
    inode = h->inode;
  } else if (inode == nullptr || view->Find(inode->file.slot, Now()) == nullptr) {
    return ESTALE;
  }
  std::string proc = ProcPath(inode->path_fd.get());
  if (to_set & FUSE_SET_ATTR_MODE) {
    if (::chmod(proc.c_str(), attr->st_mode & 07777) != 0) return errno;
  }
  if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    if (::fchownat(inode->path_fd.get(), "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
      return errno;
    }
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    std::shared_ptr<TenantWatch> watch =
        h != nullptr ? h->watch
                     : WatchOf(*inode, view->Find(inode->file.slot, Now())->token.epoch);
    WriteGuard guard;
    if (watch) guard = watch->BeforeTruncate(inode->file.role, static_cast<std::uint64_t>(attr->st_size));
    int rc = h != nullptr ? ::ftruncate(h->fd.get(), attr->st_size)
                          : ::truncate(proc.c_str(), attr->st_size);
    if (rc != 0) return errno;
  }
  if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
    struct timespec tv[2];
    tv[0].tv_nsec = UTIME_OMIT;
    tv[1].tv_nsec = UTIME_OMIT;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    if (::utimensat(AT_FDCWD, proc.c_str(), tv, 0) != 0) return errno;
  }
  if (::fstat(inode->path_fd.get(), out) != 0) return errno;
  out->st_ino = ino;
  return 0;
}

void FleetFs::Impl::Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                            fuse_file_info* fi) {
  Impl& self = Self(req);
  struct stat st {};
  int err = self.DoSetattr(ino, attr, to_set, fi, &st);
  if (self.Failed(req, Op::kSetattr, err)) return;
  fuse_reply_attr(req, &st, kEntryTimeout);
}

// ---- what the layout refuses ----

void FleetFs::Impl::Mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Rmdir(fuse_req_t req, fuse_ino_t, const char*) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Symlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                           unsigned int) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
  Self(req).Failed(req, Op::kRefused, EPERM);
}

// ---- unlink ----

int FleetFs::Impl::DoUnlink(fuse_ino_t parent, const char* name) {
  if (!IsBucketIno(parent)) return parent == kRootIno ? EPERM : EACCES;
  int bucket = BucketOfIno(parent);
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return ENOENT;
  auto view = View();
  const ServedRange* served = view->accepting() ? view->Find(file->slot, Now()) : nullptr;
  if (served == nullptr) return ENOENT;
  int bfd = BucketFd(bucket);
  if (bfd < 0) return ENOENT;
  // Only regular files are fleet files; anything else stays hidden.
  struct stat st;
  if (::fstatat(bfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return ENOENT;
  {
    // Deleting a WAL is the last moment to capture its commits; finishing a
    // journal is a commit.
    std::shared_ptr<TenantWatch> watch;
    if (options_.hooks && file->role != FileRole::kMain) {
      watch = options_.hooks->Watch(*file, served->token.epoch);
    }
    WriteGuard guard;
    if (watch) guard = watch->BeforeUnlink(file->role);
    if (::unlinkat(bfd, name, 0) != 0) return errno;
  }
  if (file->role == FileRole::kMain && options_.hooks) {
    options_.hooks->Deleted(*file, served->token.epoch);  // a tombstone: not restored behind the user
  }
  if (file->role == FileRole::kMain) {
    // Deleting the main file deletes the tenant: its sidecars go with it.
    FenceJob forget;
    for (std::string_view suffix : kSidecarSuffixes) {
      std::string sidecar = std::string(name) + std::string(suffix);
      if (::unlinkat(bfd, sidecar.c_str(), 0) == 0) forget.entries.push_back(EntryName{parent, sidecar});
    }
    spdlog::info("vfs: deleted tenant {}/{} (slot {}) and {} sidecars", BucketName(bucket), name,
                 file->slot, forget.entries.size());
    // The kernel may still hold the sidecars' names; they are forgotten from
    // the fence thread, since this thread is answering a request.
    if (!forget.entries.empty()) fence_.Queue(std::move(forget));
  }
  return 0;
}

void FleetFs::Impl::Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Impl& self = Self(req);
  int err = self.DoUnlink(parent, name);
  if (self.Failed(req, Op::kUnlink, err)) return;
  fuse_reply_err(req, 0);
}

// ---- open, create, release ----

void FleetFs::Impl::Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  if (ControlFiles::IsFile(ino)) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
      self.Failed(req, Op::kOpen, EACCES);
      return;
    }
    auto h = std::make_unique<VirtualHandle>();
    h->content = self.control_.Contents(ino);
    self.Keep(self.virtual_handles_, h.get());
    fi->fh = reinterpret_cast<uintptr_t>(h.release());
    fi->direct_io = 1;
    self.stats_.Count(Op::kOpen);
    if (fuse_reply_open(req, fi) != 0) {  // interrupted: no release will come
      self.Discard(self.virtual_handles_,
                   reinterpret_cast<VirtualHandle*>(static_cast<uintptr_t>(fi->fh)));
    }
    return;
  }
  auto view = self.View();
  auto inode = self.inodes_.Find(ino);
  int err = 0;
  const ServedRange* served = nullptr;
  if (inode == nullptr) {
    err = ino < kFirstFileIno ? EISDIR : ESTALE;
  } else if (served = view->Find(inode->file.slot, self.Now());
             served == nullptr || !view->accepting()) {
    err = ESTALE;
  }
  auto h = std::make_unique<FileHandle>();
  if (err == 0) {
    // The descriptor is reopened through /proc, which is a symlink: O_NOFOLLOW
    // was already honoured by the lookup (only regular files are visible).
    int flags = (fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_NOFOLLOW)) | O_CLOEXEC;
    h->fd = UniqueFd(::open(ProcPath(inode->path_fd.get()).c_str(), flags));
    if (!h->fd.valid()) err = errno;
  }
  if (self.Failed(req, Op::kOpen, err)) return;
  h->inode = inode;
  h->token = served->token;
  h->watch = self.WatchOf(*inode, served->token.epoch);
  // Every process goes through this mount, so cached pages stay true; a
  // fence drops them.
  fi->keep_cache = 1;
  self.AddHandle(h.get());
  fi->fh = reinterpret_cast<uintptr_t>(h.release());
  if (fuse_reply_open(req, fi) != 0) {
    // The opener was interrupted: the kernel will not release this handle.
    FileHandle* lost = HandleOf(fi);
    self.RemoveHandle(lost);
    delete lost;
  }
}

int FleetFs::Impl::DoCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                            fuse_file_info* fi, fuse_entry_param* e) {
  if (!IsBucketIno(parent)) return EPERM;
  int bucket = BucketOfIno(parent);
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return EPERM;  // not a fleet file: no such file may exist here
  auto view = View();  // held until the file exists with its stamp
  const ServedRange* served = view->Find(file->slot, Now());
  if (served == nullptr || !view->accepting()) return EREMOTE;  // another host's slot
  if (!options_.allow_create && file->role == FileRole::kMain) {
    struct stat st;
    int bfd = BucketFd(bucket);
    if (bfd < 0 || ::fstatat(bfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return EPERM;
  }
  int bfd = EnsureBucket(bucket);
  if (bfd < 0) return -bfd;
  // O_EXCL first, to know whether this call made the file.
  int flags = (fi->flags & ~(O_NOCTTY | O_CREAT | O_EXCL)) | O_NOFOLLOW | O_CLOEXEC;
  UniqueFd fd(::openat(bfd, name, flags | O_CREAT | O_EXCL, mode & 07777));
  bool created = fd.valid();
  if (!created && errno == EEXIST && !(fi->flags & O_EXCL)) {
    fd = UniqueFd(::openat(bfd, name, flags));
  }
  if (!fd.valid()) return errno;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return EPERM;
  if (created) {
    // A file an application creates belongs to that application's user and
    // group, as on a local file system (the agent itself runs as root).
    const fuse_ctx* ctx = fuse_req_ctx(req);
    if (::fchown(fd.get(), ctx->uid, ctx->gid) != 0) return errno;
  }
  if (created && file->role == FileRole::kMain) {
    spdlog::info("vfs: created tenant {}/{} (slot {}, epoch {}) for uid {}", BucketName(bucket),
                 name, file->slot, served->token.epoch, fuse_req_ctx(req)->uid);
    // The stamp: the epoch this file was made under, and whose file it is.
    if (Status stamped = WriteStamps(fd.get(), served->token.epoch, file->key, file->main_path);
        !stamped.ok()) {
      spdlog::warn("vfs: {}", stamped.message());
    }
  }
  UniqueFd path_fd(::openat(bfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!path_fd.valid()) return errno;
  if (::fstat(fd.get(), &st) != 0) return errno;
  auto inode = inodes_.Remember(bucket, name, *file, std::move(path_fd), st);
  if (created && file->role == FileRole::kMain) inode->exposed_epoch.store(served->token.epoch);
  auto h = std::make_unique<FileHandle>();
  h->fd = std::move(fd);
  h->inode = inode;
  h->token = served->token;
  h->watch = WatchOf(*inode, served->token.epoch);
  st.st_ino = inode->ino;
  e->ino = inode->ino;
  e->attr = st;
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  fi->keep_cache = 1;
  AddHandle(h.get());
  fi->fh = reinterpret_cast<uintptr_t>(h.release());
  return 0;
}

void FleetFs::Impl::Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                           fuse_file_info* fi) {
  Impl& self = Self(req);
  fuse_entry_param e{};
  int err = self.DoCreate(req, parent, name, mode, fi, &e);
  if (self.Failed(req, Op::kCreate, err)) return;
  if (fuse_reply_create(req, &e, fi) != 0) {
    FileHandle* lost = HandleOf(fi);
    self.RemoveHandle(lost);
    delete lost;
  }
}

void FleetFs::Impl::Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  self.stats_.Count(Op::kRelease);
  if (ControlFiles::IsFile(ino)) {
    self.Discard(self.virtual_handles_,
                 reinterpret_cast<VirtualHandle*>(static_cast<uintptr_t>(fi->fh)));
  } else {
    FileHandle* h = HandleOf(fi);
    self.RemoveHandle(h);
    delete h;  // closes the backing descriptor; no write happens on close
  }
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
  // Nothing is buffered here, and the kernel keeps the locks.
  Self(req).stats_.Count(Op::kFlush);
  fuse_reply_err(req, 0);
}

// ---- the hot path: read, write, fsync, fallocate ----

void FleetFs::Impl::Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                         fuse_file_info* fi) {
  Impl& self = Self(req);
  if (ControlFiles::IsFile(ino)) {
    const std::string& c = reinterpret_cast<VirtualHandle*>(static_cast<uintptr_t>(fi->fh))->content;
    size_t start = std::min(static_cast<size_t>(off), c.size());
    // The reply is sent from a copy: once the kernel has it, the reader may
    // close the file and its release may free the handle while this thread
    // is still returning from the write to /dev/fuse.
    thread_local std::string chunk;
    chunk.assign(c, start, std::min(size, c.size() - start));
    self.stats_.Count(Op::kRead);
    fuse_reply_buf(req, chunk.data(), chunk.size());
    return;
  }
  FileHandle* h = HandleOf(fi);
  auto view = self.View();
  int err = self.CheckHandle(*view, *h);
  thread_local std::vector<char> buffer;
  ssize_t n = 0;
  if (err == 0) {
    if (buffer.size() < size) buffer.resize(size);
    n = ::pread(h->fd.get(), buffer.data(), size, off);
    if (n < 0) err = errno;
  }
  if (self.Failed(req, Op::kRead, err)) return;
  fuse_reply_buf(req, buffer.data(), static_cast<size_t>(n));
}

void FleetFs::Impl::Write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
                          fuse_file_info* fi) {
  Impl& self = Self(req);
  FileHandle* h = HandleOf(fi);
  auto view = self.View();  // a fence waits until this write is done
  int err = self.CheckHandle(*view, *h);
  ssize_t n = 0;
  if (err == 0) {
    if (self.options_.before_backing_write) self.options_.before_backing_write();
    // Replication sees the change first; a WAL restart waits here until the
    // old log's commits are captured.
    WriteGuard guard;
    if (h->watch) {
      guard = h->watch->BeforeWrite(h->inode->file.role, static_cast<std::uint64_t>(off), buf, size);
    }
    n = ::pwrite(h->fd.get(), buf, size, off);
    if (n < 0) err = errno;
  }
  if (self.Failed(req, Op::kWrite, err)) return;
  fuse_reply_write(req, static_cast<size_t>(n));
}

void FleetFs::Impl::Fsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  Impl& self = Self(req);
  FileHandle* h = HandleOf(fi);
  auto view = self.View();
  int err = self.CheckHandle(*view, *h);
  if (err == 0 && (datasync ? ::fdatasync(h->fd.get()) : ::fsync(h->fd.get())) != 0) err = errno;
  if (self.Failed(req, Op::kFsync, err)) return;
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len,
                              fuse_file_info* fi) {
  Impl& self = Self(req);
  FileHandle* h = HandleOf(fi);
  auto view = self.View();
  int err = self.CheckHandle(*view, *h);
  if (err == 0 && ::fallocate(h->fd.get(), mode, off, len) != 0) err = errno;
  if (self.Failed(req, Op::kFallocate, err)) return;
  fuse_reply_err(req, 0);
}

// ---- directories ----

void FleetFs::Impl::Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  if (ino != kRootIno && ino != kControlDirIno && !IsBucketIno(ino)) {
    self.Failed(req, Op::kOpendir, ENOTDIR);
    return;
  }
  // The listing is made at the first readdir: SQLite opens a directory only
  // to fsync it, once per new journal, and that must stay cheap.
  auto* dir = new DirHandle();
  self.Keep(self.dir_handles_, dir);
  fi->fh = reinterpret_cast<uintptr_t>(dir);
  self.stats_.Count(Op::kOpendir);
  if (fuse_reply_open(req, fi) != 0) self.Discard(self.dir_handles_, dir);  // interrupted
}

int FleetFs::Impl::ListDir(fuse_ino_t ino, DirHandle& dir) {
  dir.entries.push_back({".", ino, S_IFDIR});
  dir.entries.push_back({"..", kRootIno, S_IFDIR});
  if (ino == kRootIno) {
    for (int b = 0; b < kBucketCount; ++b) {
      dir.entries.push_back({BucketName(b), BucketIno(b), S_IFDIR});
    }
    dir.entries.push_back({std::string(kControlDirName), kControlDirIno, S_IFDIR});
    return 0;
  }
  if (ino == kControlDirIno) {
    for (auto& entry : ControlFiles::List()) dir.entries.push_back(std::move(entry));
    return 0;
  }
  int bucket = BucketOfIno(ino);
  int bfd = BucketFd(bucket);
  if (bfd < 0) return 0;
  int dup = ::openat(bfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return errno;
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return errno;
  }
  auto view = View();
  MonoTime now = Now();
  while (dirent* ent = ::readdir(d)) {
    std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, ent->d_name);
    if (!file || !view->accepting() || view->Find(file->slot, now) == nullptr) continue;
    if (ent->d_type != DT_REG && ent->d_type != DT_UNKNOWN) continue;
    // The number is only reported to readdir callers; a lookup assigns the
    // inode the kernel uses.
    dir.entries.push_back({ent->d_name, static_cast<fuse_ino_t>(ent->d_ino), S_IFREG});
  }
  ::closedir(d);
  return 0;
}

void FleetFs::Impl::Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                            fuse_file_info* fi) {
  Impl& self = Self(req);
  auto* dir = reinterpret_cast<DirHandle*>(static_cast<uintptr_t>(fi->fh));
  int err = 0;
  if (off == 0 || !dir->listed) {
    dir->entries.clear();
    err = self.ListDir(ino, *dir);
    dir->listed = true;
  }
  if (self.Failed(req, Op::kReaddir, err)) return;
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < dir->entries.size(); ++i) {
    const auto& entry = dir->entries[i];
    struct stat st {};
    st.st_ino = entry.ino;
    st.st_mode = entry.type;
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, entry.name.c_str(), &st,
                                    static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void FleetFs::Impl::Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Impl& self = Self(req);
  self.Discard(self.dir_handles_, reinterpret_cast<DirHandle*>(static_cast<uintptr_t>(fi->fh)));
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  Impl& self = Self(req);
  int fd = ino == kRootIno ? self.root_fd_.get()
           : IsBucketIno(ino) ? self.BucketFd(BucketOfIno(ino))
                              : -1;
  int err = 0;
  // SQLite syncs the directory after creating a journal, so its name is durable.
  if (fd >= 0 && (datasync ? ::fdatasync(fd) : ::fsync(fd)) != 0) err = errno;
  if (self.Failed(req, Op::kFsync, err)) return;
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Statfs(fuse_req_t req, fuse_ino_t) {
  Impl& self = Self(req);
  struct statvfs st {};
  int err = ::fstatvfs(self.root_fd_.get(), &st) == 0 ? 0 : errno;
  if (self.Failed(req, Op::kStatfs, err)) return;
  fuse_reply_statfs(req, &st);
}

// ---- the public face ----

FleetFs::FleetFs(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FleetFs::~FleetFs() = default;

Result<std::unique_ptr<FleetFs>> FleetFs::Mount(MountOptions options,
                                                std::shared_ptr<const ServingView> initial) {
  if (options.clock == nullptr) return InvalidArgument("vfs: a mount needs a monotonic clock");
  auto impl = std::make_unique<Impl>(std::move(options));
  FLEETFS_RETURN_IF_ERROR(impl->Start(std::move(initial)));
  return std::unique_ptr<FleetFs>(new FleetFs(std::move(impl)));
}

void FleetFs::Publish(std::shared_ptr<const ServingView> view) { impl_->Publish(std::move(view)); }
void FleetFs::WaitForFences() { impl_->WaitForFences(); }
void FleetFs::Unmount() { impl_->Stop(); }
const VfsStats& FleetFs::stats() const { return impl_->stats(); }
std::size_t FleetFs::OpenHandles() const { return impl_->OpenHandles(); }
std::size_t FleetFs::OpenHandlesIn(Slot first, Slot last) const {
  return impl_->OpenHandlesIn(first, last);
}

}  // namespace fleetfs::vfs
