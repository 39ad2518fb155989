#define FUSE_USE_VERSION 314

#include "vfs/fleet_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <limits>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fleet/tenant_file.h"
#include "fleet/unique_fd.h"
#include "vfs/backing_dir.h"
#include "vfs/control_files.h"
#include "vfs/init_reply.h"
#include "vfs/fence.h"
#include "vfs/handles.h"
#include "vfs/inode_table.h"
#include "vfs/negative_names.h"
#include "vfs/per_uid_limit.h"
#include "vfs/permission.h"

namespace fleetfs::vfs {
namespace {

// The kernel may cache entries and attributes this long; a fence tells it to
// forget them at once, so the timeout only bounds staleness of attributes.
constexpr double kEntryTimeout = 1.0;

// Negative entries remembered at most; beyond, absent names are not cached.
constexpr std::size_t kMaxNegativeNames = 100'000;

std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// The handle of kind H behind `fi`, or nullptr when there is none or it is
// of another kind.
template <typename H>
H* HandleAs(const fuse_file_info* fi) {
  return fi == nullptr ? nullptr : HandleOfKind<H>(fi->fh);
}

// DoLookupFile or DoOpen handed the request to the replicator; the reply
// comes later, from another thread.
constexpr int kDeferred = -1;

// Lookups and opens of one user waiting for the replicator at most; beyond,
// EAGAIN (never ENOENT: an application told a tenant is absent may create an
// empty database over the replica's). A user stat-ing random names from many
// processes queues at most this many listings ahead of other users' opens.
constexpr int kMaxDeferredPerUid = 32;
// Control files open at once per user: each handle keeps its content (made
// at open), so a user opening one in a loop would otherwise make the agent
// hold as many copies. EMFILE beyond it. A handle of .fleetfs/control keeps a
// reply and counts the same; every VirtualHandle is made after its Enter, so
// its release gives back only what its open took.
constexpr int kMaxControlOpensPerUid = 64;

// A lookup or open not prepared yet: it needs the replicator before a main
// file is exposed. One that was is prepared for the epoch it names, and is
// answered without another Prepare only while that epoch is still served.
constexpr std::uint64_t kNotPrepared = 0;

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

// An operation that reaches a backing file, from its first check to its
// answer. DESIGN section 3: nothing is written to a backing file after its
// range's local lease ends, so the operation is admitted again after
// everything it waited for (replication's write gate, a WAL capture) and
// right before the backing call, and a backing call that returned after the
// lease end is answered ESTALE, never success.
struct InFlight {
  Slot slot = 0;
  FileRole role = FileRole::kMain;
  // A handle's token; for an operation by name, the token of the range that
  // served the name at the first check (later checks need the same one).
  std::optional<ServingToken> token;
  bool by_name = false;
  bool tenant_open = true;  // by name: the tenant has open handles (ServingView::ForName)
  // Every view loaded: held until the operation is answered, so a fence
  // waits for it.
  std::vector<std::shared_ptr<const ServingView>> held;
  MonoTime lease_end{};  // of the range that admitted it last
};

}  // namespace

class FleetFs::Impl final : public FencedFiles {
 public:
  explicit Impl(MountOptions options)
      : options_(std::move(options)),
        control_(options_.status_json, options_.ranges_text, options_.tenants_live),
        backing_(*options_.clock),
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
  std::string TransportName() const { return transport_ ? transport_->name() : "/dev/fuse"; }
  std::size_t KnownInodes() const { return inodes_.size(); }
  std::string TransportWhy() const { return transport_ ? transport_->why() : ""; }

  std::size_t OpenHandles() const {
    std::lock_guard lock(handles_mu_);
    return file_handles_.size();
  }
  std::vector<std::pair<std::string, std::size_t>> OpenHandlesByTenant() const {
    std::lock_guard lock(handles_mu_);
    std::vector<std::pair<std::string, std::size_t>> out;
    out.reserve(open_tenants_.size());
    for (const auto& [path, n] : open_tenants_) out.emplace_back(path, static_cast<std::size_t>(n));
    return out;
  }
  std::size_t OpenHandlesIn(Slot first, Slot last) override {
    std::lock_guard lock(handles_mu_);
    std::size_t n = 0;
    for (const FileHandle* h : file_handles_) {
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
  // A request written to .fleetfs/control: one write is one request.
  void WriteControl(fuse_req_t req, VirtualHandle& h, std::string_view request);
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
  MonoTime LatencyNow() const {
    return (options_.latency_clock ? options_.latency_clock : options_.clock)->Now();
  }

  // Times one request by op, from its handler's start to the end of the
  // handler (the reply is sent by then). A lookup or open deferred to the
  // replicator is handed off: its reply, sent later, observes instead, from
  // the same start.
  class RequestTimer {
   public:
    RequestTimer(Impl& self, Op op) : self_(self), op_(op), started_(self.LatencyNow()) {}
    ~RequestTimer() {
      if (!handed_off_) self_.ObserveSince(op_, started_);
    }
    RequestTimer(const RequestTimer&) = delete;
    RequestTimer& operator=(const RequestTimer&) = delete;
    MonoTime started() const { return started_; }
    void HandOff() { handed_off_ = true; }

   private:
    Impl& self_;
    const Op op_;
    const MonoTime started_;
    bool handed_off_ = false;
  };
  void ObserveSince(Op op, MonoTime started) {
    stats_.Observe(op,
                   std::chrono::duration_cast<std::chrono::nanoseconds>(LatencyNow() - started));
  }

  // Counts the operation, and the error when `err` is not 0; true when the
  // caller should send the error reply.
  bool Failed(fuse_req_t req, Op op, int err) {
    stats_.Count(op);
    if (err == 0) return false;
    CountError(op, err);
    fuse_reply_err(req, err);
    return true;
  }
  void CountError(Op op, int err) {
    stats_.CountError(op, err);
    if (err == ESTALE) stats_.fenced.fetch_add(1, std::memory_order_relaxed);
  }

  // ---- admission (the rule itself is ServingView's) ----

  // 0 when the handle's range still admits it under the current view (the
  // view is held by `op`), else ESTALE.
  int CheckHandle(InFlight& op, const FileHandle& h) {
    op.slot = h.inode->file.slot;
    op.role = h.inode->file.role;
    op.token = h.token;
    op.by_name = false;
    return Admit(op);
  }
  // Loads the current view into `op` and admits the operation against it now.
  int Admit(InFlight& op);
  // After the backing call: 0 when it returned before the lease end it was
  // admitted under (or the range is still served to it), else ESTALE.
  int Landed(InFlight& op) { return Now() < op.lease_end ? 0 : Admit(op); }
  // Whether a tenant (by its main file's path) has open handles: while the
  // view drains, only such tenants may still look up, create and unlink.
  bool TenantOpen(const std::string& main_path) const {
    std::lock_guard lock(handles_mu_);
    return open_tenants_.contains(main_path);
  }
  const ServedRange* ServingName(const ServingView& view, const FleetFile& file) const {
    const ServedRange* range = view.Find(file.slot, Now());
    if (range == nullptr || (view.accepting() && range->accepting)) return range;
    return TenantOpen(file.main_path) ? range : nullptr;
  }
  void BeforeBackingCall() {
    if (options_.before_backing_write) options_.before_backing_write();
  }

  // ---- operations ----

  // `prepared`: the epoch the replicator prepared the file for, or
  // kNotPrepared. A main file served at another epoch is prepared again.
  // `started`: when the request came, for its latency once it is answered.
  int DoLookup(fuse_req_t req, const ServingView& view, fuse_ino_t parent, const char* name,
               fuse_entry_param* e, std::uint64_t prepared, MonoTime started);
  int DoLookupFile(fuse_req_t req, const ServingView& view, int bucket, std::string_view name,
                   fuse_entry_param* e, std::uint64_t prepared, MonoTime started);
  // A main file needs the replicator before it is exposed under `epoch`.
  bool NeedsPrepare(const FileInode& inode, std::uint64_t epoch);
  // Hands the lookup to the replicator: kDeferred, or EAGAIN when the
  // caller's user has kMaxDeferredPerUid in flight already.
  int Defer(fuse_req_t req, fuse_ino_t parent, std::string name, const FleetFile& file,
            std::uint64_t epoch, MonoTime started);
  int DoOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, std::uint64_t prepared,
             MonoTime started);
  int DeferOpen(fuse_req_t req, fuse_ino_t ino, const fuse_file_info& fi, const FleetFile& file,
                std::uint64_t epoch, MonoTime started);
  // Counts one deferred lookup or open of `uid`; false when it has the most.
  bool EnterDeferred(uid_t uid) {
    // On io_uring a held answer keeps its ring entry: bounded per ring too.
    if (!SessionTransport::MayHold()) return false;
    std::lock_guard lock(deferred_mu_);
    auto [it, added] = deferred_.try_emplace(uid, 0);
    if (it->second >= kMaxDeferredPerUid) return false;
    ++it->second;
    return true;
  }
  void LeaveDeferred(uid_t uid) {
    std::lock_guard lock(deferred_mu_);
    auto it = deferred_.find(uid);
    if (it != deferred_.end() && --it->second <= 0) deferred_.erase(it);
  }
  void ReplyOpen(fuse_req_t req, fuse_file_info* fi);
  std::shared_ptr<TenantWatch> WatchOf(const FleetFile& file, std::uint64_t epoch) {
    return options_.hooks ? options_.hooks->Watch(file, epoch) : nullptr;
  }
  // Records a negative entry; false when too many are remembered to cache more.
  bool RememberNegative(fuse_ino_t parent, std::string_view name, Slot slot) {
    std::lock_guard lock(negative_mu_);
    return negative_.Remember(parent, name, slot, Now());
  }
  // Truncates an open handle's file to `size` through replication, under
  // the lease rule.
  int TruncateHandle(InFlight& op, FileHandle& h, off_t size);
  int DoCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi, fuse_entry_param* e);
  int DoSetattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi,
                struct stat* out);
  int DoUnlink(fuse_ino_t parent, const char* name);
  int ListDir(fuse_ino_t ino, DirHandle& dir);

  // ---- handles ----

  // Every handle given to the kernel is kept here, so Stop can free what the
  // kernel never releases.
  void AddHandle(Handle* h) {
    std::lock_guard lock(handles_mu_);
    if (h->kind == HandleKind::kFile) {
      auto* f = static_cast<FileHandle*>(h);
      file_handles_.insert(f);
      ++open_tenants_[f->inode->file.main_path];
      open_by_ino_[f->inode->ino].insert(f);
    } else {
      other_handles_.insert(h);
    }
  }
  // Forgets and frees `h`.
  void DropHandle(Handle* h) {
    {
      std::lock_guard lock(handles_mu_);
      if (h->kind == HandleKind::kFile) {
        auto* f = static_cast<FileHandle*>(h);
        if (file_handles_.erase(f) != 0) {
          auto it = open_tenants_.find(f->inode->file.main_path);
          if (it != open_tenants_.end() && --it->second == 0) open_tenants_.erase(it);
          auto by_ino = open_by_ino_.find(f->inode->ino);
          if (by_ino != open_by_ino_.end() && by_ino->second.erase(f) != 0 &&
              by_ino->second.empty()) {
            open_by_ino_.erase(by_ino);
          }
        }
      } else {
        other_handles_.erase(h);
      }
    }
    if (h->kind == HandleKind::kVirtual) control_opens_.Leave(static_cast<VirtualHandle*>(h)->uid);
    delete h;  // a file handle closes its backing descriptor; no write happens on close
  }
  // Attributes of a file that is open but no longer has its name (SQLite
  // unlinks a journal it still holds open): the kernel asks for them without
  // a handle, and the name no longer reaches the file. ESTALE when no handle
  // is open. fstat on a descriptor does not wait on anything a store call or
  // the loop can hold.
  int StatThroughOpenHandle(fuse_ino_t ino, struct stat* st) const {
    std::lock_guard lock(handles_mu_);
    auto it = open_by_ino_.find(ino);
    if (it == open_by_ino_.end() || it->second.empty()) return ESTALE;
    return ::fstat((*it->second.begin())->fd.get(), st) == 0 ? 0 : errno;
  }
  // The same for a change without a handle (SQLite, run as root, fchowns a
  // journal it has open; the kernel sends that without a handle): a
  // duplicate of an open handle's descriptor, or ESTALE when none is open.
  int DupOpenHandle(fuse_ino_t ino, UniqueFd* out) const {
    std::lock_guard lock(handles_mu_);
    auto it = open_by_ino_.find(ino);
    if (it == open_by_ino_.end() || it->second.empty()) return ESTALE;
    *out = UniqueFd(::fcntl((*it->second.begin())->fd.get(), F_DUPFD_CLOEXEC, 0));
    return out->valid() ? 0 : errno;
  }

  MountOptions options_;
  ControlFiles control_;
  BackingDir backing_;
  VfsStats stats_;

  // What every operation checks. Publish swaps it in one atomic exchange (the
  // atomic's internal lock is held for that swap only, never across a store
  // call); operations hold the loaded view until their backing call returns.
  std::atomic<std::shared_ptr<const ServingView>> view_;

  InodeTable inodes_;

  std::mutex negative_mu_;  // guards negative_; taken alone
  NegativeNames negative_;

  PerUidLimit control_opens_{kMaxControlOpensPerUid};

  std::mutex deferred_mu_;  // guards deferred_; taken alone
  std::unordered_map<uid_t, int> deferred_;  // uid -> its lookups and opens in Prepare

  mutable std::mutex handles_mu_;  // guards the four below; taken alone
  std::unordered_set<FileHandle*> file_handles_;
  std::unordered_set<Handle*> other_handles_;
  std::unordered_map<std::string, int> open_tenants_;  // main path -> open file handles
  std::unordered_map<fuse_ino_t, std::unordered_set<FileHandle*>> open_by_ino_;

  fuse_session* session_ = nullptr;
  SessionNotifier notifier_;
  // Carries the session's requests; asks INIT for parallel lookups. Reset
  // after the session is destroyed.
  std::unique_ptr<SessionTransport> transport_;
  Fence fence_;  // after everything it reaches: destroyed (stopped) first
  bool mounted_ = false;
  std::atomic<bool> stopping_{false};  // Stop has begun: the session's end is expected
};

// ---- start and stop ----

Status FleetFs::Impl::Start(std::shared_ptr<const ServingView> initial) {
  FLEETFS_RETURN_IF_ERROR(backing_.Open(options_.backing));
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
  TransportOptions transport;
  transport.transport = options_.transport;
  transport.dev_threads = options_.max_threads;
  // A worker blocked reading /dev/fuse sees the exit flag only after one
  // more request: a stat under the control directory makes one.
  transport.wake = [path = options_.mountpoint + "/" + std::string(kControlDirName) + "/wake-" +
                           std::to_string(::getpid())] {
    struct stat st;
    ::stat(path.c_str(), &st);
  };
  // A statfs of the mount always reaches the agent (the kernel caches no
  // answer of it) and is answered at once: a nudge for held lookups.
  transport.nudge = [path = options_.mountpoint] {
    struct statfs st;
    ::statfs(path.c_str(), &st);
  };
  transport.on_session_end = [this] {
    if (stopping_.load()) return;
    spdlog::error("vfs: the FUSE session at {} ended without the agent: unmounted by someone "
                  "else?", options_.mountpoint);
    if (options_.on_session_end) options_.on_session_end();
  };
  transport.serving_before_start_returns = options_.serving_before_mount_returns;
  transport_ = std::make_unique<SessionTransport>(std::move(transport));
  fence_.Start();
  std::string error;
  if (!transport_->Start(
          session_, [](void* userdata) { return static_cast<Impl*>(userdata)->transport_.get(); },
          &error)) {
    stopping_ = true;
    fence_.Stop();
    transport_->Stop();
    fuse_session_unmount(session_);
    fuse_session_destroy(session_);
    session_ = nullptr;
    transport_.reset();
    mounted_ = false;
    return Unavailable("cannot serve " + options_.mountpoint + ": " + error);
  }
  if (transport_->init().dirops_applied()) {
    spdlog::debug("vfs: the kernel may send lookups of one directory in parallel");
  }
  if (transport_->name() == "io_uring") {
    spdlog::info("vfs: transport io_uring ({} queues)", transport_->queues());
  } else if (!transport_->why().empty()) {
    spdlog::info("vfs: transport /dev/fuse: {}", transport_->why());
  } else {
    spdlog::info("vfs: transport /dev/fuse (asked for)");
  }
  return Status::Ok();
}

void FleetFs::Impl::Stop() {
  // Fences still queued are run first: they need the session.
  fence_.Stop();
  stopping_ = true;
  if (mounted_) {
    transport_->Stop();
    fuse_session_unmount(session_);
    fuse_session_destroy(session_);
    session_ = nullptr;
    transport_.reset();  // joins the /dev/fuse waker, whose request the unmount answered
    mounted_ = false;
  }
  // The session is gone: the kernel will not release what is still open.
  {
    std::lock_guard lock(handles_mu_);
    for (FileHandle* h : file_handles_) delete h;
    for (Handle* h : other_handles_) delete h;
    file_handles_.clear();
    other_handles_.clear();
    open_tenants_.clear();
    open_by_ino_.clear();
  }
  backing_.CloseBuckets();
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
    if (t.role == FileRole::kShm && backing_.StatFile(*inode, &st) == 0) {
      t.size = static_cast<std::uint64_t>(st.st_size);
    }
    targets.push_back(std::move(t));
  }
  return targets;
}

int FleetFs::Impl::Admit(InFlight& op) {
  auto view = View();
  const MonoTime now = Now();
  const ServedRange* range = nullptr;
  if (!op.by_name) {
    range = view->Admitting(op.slot, op.role, *op.token, now);
  } else {
    range = view->ForName(op.slot, now, op.tenant_open);
    if (range != nullptr && op.token && range->token != *op.token) range = nullptr;
    if (range != nullptr && !op.token) op.token = range->token;
  }
  if (range != nullptr) op.lease_end = range->valid_until;
  op.held.push_back(std::move(view));
  return range != nullptr ? 0 : ESTALE;
}

// ---- lookup ----

// An absent fleet name in a served slot is answered with a negative entry,
// which the kernel caches: SQLite checks for a journal that is not there
// before every transaction. The names are remembered, and a claim makes the
// kernel forget those of its ranges, so no cached absence outlives the claim.
// Names in unserved slots are answered with an error, which is never cached.
int FleetFs::Impl::DoLookupFile(fuse_req_t req, const ServingView& view, int bucket,
                                std::string_view name, fuse_entry_param* e,
                                std::uint64_t prepared, MonoTime started) {
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return ENOENT;  // not a fleet file: hidden
  const ServedRange* served = ServingName(view, *file);
  if (served == nullptr) return ENOENT;
  const std::uint64_t epoch = served->token.epoch;
  const fuse_ino_t parent = BucketIno(bucket);
  const bool main = file->role == FileRole::kMain && options_.hooks != nullptr;
  auto absent = [&] {
    if (main && prepared != epoch) {
      // Missing here: the replica may hold it. Restored before it is exposed.
      return Defer(req, parent, std::string(name), *file, epoch, started);
    }
    if (!RememberNegative(parent, name, file->slot)) return ENOENT;
    e->ino = 0;  // a negative entry, cached for entry_timeout
    return 0;
  };
  int bfd = backing_.BucketFd(bucket);
  if (bfd == -ENOENT) return absent();
  if (bfd < 0) return ENOENT;  // a broken bucket (logged): its files are hidden
  std::string n(name);
  struct stat st;
  if (::fstatat(bfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absent() : errno;
  }
  if (!S_ISREG(st.st_mode)) return backing_.NotAFleetFile(bucket, name, st);
  auto inode = inodes_.Remember(bucket, name, *file, st);
  if (main && prepared != epoch && NeedsPrepare(*inode, epoch)) {
    inodes_.Forget(inode->ino, 1);  // the deferred lookup counts its own
    return Defer(req, parent, std::move(n), *file, epoch, started);
  }
  if (main && inode->exposed_epoch.load() < epoch) inode->exposed_epoch.store(epoch);
  st.st_ino = inode->ino;
  e->ino = inode->ino;
  e->attr = st;
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  return 0;
}

bool FleetFs::Impl::NeedsPrepare(const FileInode& inode, std::uint64_t epoch) {
  if (inode.exposed_epoch.load() >= epoch) return false;
  // The stamp is read here, on the FUSE thread: a local call, and the common
  // answer ("already stamped for this epoch") needs nothing more.
  UniqueFd fd;
  if (backing_.OpenFile(inode, O_PATH, &fd) != 0) return true;  // the replicator decides
  return ReadEpochStamp(fd.get()).value_or(0) < epoch;
}

int FleetFs::Impl::Defer(fuse_req_t req, fuse_ino_t parent, std::string name,
                         const FleetFile& file, std::uint64_t epoch, MonoTime started) {
  const uid_t uid = fuse_req_ctx(req)->uid;
  if (!EnterDeferred(uid)) return EAGAIN;
  // The reply comes from the replicator's thread: no FUSE worker waits. The
  // file was prepared for `epoch` only: served at another epoch by the time
  // Prepare is done (the range lapsed and was claimed again meanwhile), it is
  // prepared again for that one, and not served at all, it is absent.
  options_.hooks->Prepare(file, epoch, [this, req, parent, name = std::move(name), epoch, uid,
                                        started](int err) {
    LeaveDeferred(uid);
    if (err != 0) {
      stats_.CountError(Op::kLookup, err);
      fuse_reply_err(req, err);
      ObserveSince(Op::kLookup, started);
      return;
    }
    auto view = View();
    fuse_entry_param e{};
    int rc = DoLookup(req, *view, parent, name.c_str(), &e, epoch, started);
    if (rc == kDeferred) return;  // prepared again, for the epoch served now
    if (rc != 0) {
      stats_.CountError(Op::kLookup, rc);
      fuse_reply_err(req, rc);
      ObserveSince(Op::kLookup, started);
      return;
    }
    if (e.ino == 0) stats_.CountError(Op::kLookup, ENOENT);
    fuse_reply_entry(req, &e);
    ObserveSince(Op::kLookup, started);
  });
  return kDeferred;
}

int FleetFs::Impl::DoLookup(fuse_req_t req, const ServingView& view, fuse_ino_t parent,
                            const char* name, fuse_entry_param* e, std::uint64_t prepared,
                            MonoTime started) {
  std::string_view n(name);
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  if (parent == kRootIno) {
    if (ControlFiles::Lookup(parent, n) == kControlDirIno) {
      e->ino = kControlDirIno;
      e->attr = ControlFiles::Attr(kControlDirIno, backing_.root_stat().st_mtim);
      return 0;
    }
    std::optional<int> bucket = ParseBucketName(n);
    if (!bucket) return ENOENT;
    e->ino = BucketIno(*bucket);
    backing_.StatBucket(*bucket, &e->attr);
    return 0;
  }
  if (parent == kControlDirIno) {
    fuse_ino_t ino = ControlFiles::Lookup(parent, n);
    if (ino == 0) return ENOENT;
    e->ino = ino;
    e->attr = ControlFiles::Attr(ino, backing_.root_stat().st_mtim);
    // Never cached: each open makes the content anew.
    e->attr_timeout = 0;
    return 0;
  }
  if (IsBucketIno(parent)) {
    return DoLookupFile(req, view, BucketOfIno(parent), n, e, prepared, started);
  }
  return ENOENT;
}

void FleetFs::Impl::Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kLookup);
  // Held until the kernel has the answer: a claim's fence runs after every
  // lookup under an older view has answered, so it sees their negative entries.
  auto view = self.View();
  fuse_entry_param e{};
  int err = self.DoLookup(req, *view, parent, name, &e, kNotPrepared, timer.started());
  if (err == kDeferred) {
    self.stats_.Count(Op::kLookup);  // once, however often it is prepared
    timer.HandOff();
    return;
  }
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
  RequestTimer timer(self, Op::kGetattr);
  struct stat st {};
  int err = 0;
  if (ino == kRootIno) {
    st = self.backing_.root_stat();
    st.st_ino = kRootIno;
  } else if (IsBucketIno(ino)) {
    self.backing_.StatBucket(BucketOfIno(ino), &st);
  } else if (ControlFiles::Is(ino)) {
    st = ControlFiles::Attr(ino, self.backing_.root_stat().st_mtim);
  } else if (FileHandle* h = HandleAs<FileHandle>(fi); h != nullptr) {
    InFlight op;
    err = self.CheckHandle(op, *h);
    if (err == 0 && ::fstat(h->fd.get(), &st) != 0) err = errno;
    st.st_ino = ino;
  } else {
    auto view = self.View();
    auto inode = self.inodes_.Find(ino);
    if (inode == nullptr || view->Find(inode->file.slot, self.Now()) == nullptr) {
      err = ESTALE;
    } else {
      err = self.backing_.StatFile(*inode, &st);
      if (err == ESTALE) err = self.StatThroughOpenHandle(ino, &st);
    }
    st.st_ino = ino;
  }
  if (self.Failed(req, Op::kGetattr, err)) return;
  fuse_reply_attr(req, &st, kEntryTimeout);
}

int FleetFs::Impl::TruncateHandle(InFlight& op, FileHandle& h, off_t size) {
  // Replication sees the change first, and may make it wait (a snapshot's
  // write gate): admitted again after that, and once more after it landed.
  WriteGuard guard;
  if (h.watch) guard = h.watch->BeforeTruncate(h.inode->file.role, static_cast<std::uint64_t>(size));
  if (int err = Admit(op); err != 0) return err;
  BeforeBackingCall();
  // open(O_RDONLY | O_TRUNC) truncates too (the kernel checked write
  // permission): a read-only descriptor is truncated through its name.
  const int flags = ::fcntl(h.fd.get(), F_GETFL);
  const int rc = flags >= 0 && (flags & O_ACCMODE) == O_RDONLY
                     ? ::truncate(ProcPath(h.fd.get()).c_str(), size)
                     : ::ftruncate(h.fd.get(), size);
  if (rc != 0) return errno;
  return Landed(op);
}

int FleetFs::Impl::DoSetattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi,
                             struct stat* out) {
  if (ino < kFirstFileIno) return EPERM;  // the layout's directories and control files are fixed
  FileHandle* h = HandleAs<FileHandle>(fi);
  if (fi != nullptr && fi->fh != 0 && h == nullptr) return EBADF;
  std::shared_ptr<FileInode> inode = h != nullptr ? h->inode : inodes_.Find(ino);
  if (inode == nullptr) return ESTALE;
  // Held until the change reached the backing file. Without a handle, the
  // range serving the file now admits the change, and every later check
  // needs the same token: one range, read once.
  InFlight op;
  if (h != nullptr) {
    if (int err = CheckHandle(op, *h); err != 0) return err;
  } else {
    op.slot = inode->file.slot;
    op.role = inode->file.role;
    op.by_name = true;
    // While the view drains, only a tenant with open handles may change.
    op.tenant_open = TenantOpen(inode->file.main_path);
    if (Admit(op) != 0) return ESTALE;
  }
  // The file itself: the handle's descriptor, or the name, checked to still
  // be the file the kernel knows.
  UniqueFd by_name;
  if (h == nullptr) {
    int err = backing_.OpenFile(*inode, O_PATH, &by_name);
    if (err == ESTALE) err = DupOpenHandle(ino, &by_name);
    if (err != 0) return err;
  }
  const int fd = h != nullptr ? h->fd.get() : by_name.get();
  std::string proc = ProcPath(fd);
  if (to_set & FUSE_SET_ATTR_MODE) {
    if (::chmod(proc.c_str(), attr->st_mode & 07777) != 0) return errno;
  }
  if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    if (::fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return errno;
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (h != nullptr) {
      if (int err = TruncateHandle(op, *h, attr->st_size); err != 0) return err;
    } else {
      std::shared_ptr<TenantWatch> watch = WatchOf(inode->file, op.token->epoch);
      WriteGuard guard;
      if (watch) {
        guard = watch->BeforeTruncate(inode->file.role, static_cast<std::uint64_t>(attr->st_size));
      }
      if (int err = Admit(op); err != 0) return err;
      BeforeBackingCall();
      if (::truncate(proc.c_str(), attr->st_size) != 0) return errno;
      if (int err = Landed(op); err != 0) return err;
    }
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
  if (::fstat(fd, out) != 0) return errno;
  out->st_ino = ino;
  return 0;
}

void FleetFs::Impl::Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
                            fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kSetattr);
  struct stat st {};
  int err = self.DoSetattr(ino, attr, to_set, fi, &st);
  if (self.Failed(req, Op::kSetattr, err)) return;
  fuse_reply_attr(req, &st, kEntryTimeout);
}

// ---- what the layout refuses ----

void FleetFs::Impl::Mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Rmdir(fuse_req_t req, fuse_ino_t, const char*) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Symlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*,
                           unsigned int) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}
void FleetFs::Impl::Link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
  RequestTimer timer(Self(req), Op::kRefused);
  Self(req).Failed(req, Op::kRefused, EPERM);
}

// ---- unlink ----

int FleetFs::Impl::DoUnlink(fuse_ino_t parent, const char* name) {
  if (!IsBucketIno(parent)) return parent == kRootIno ? EPERM : EACCES;
  int bucket = BucketOfIno(parent);
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return ENOENT;
  InFlight op;
  op.slot = file->slot;
  op.role = file->role;
  op.by_name = true;
  op.tenant_open = TenantOpen(file->main_path);
  if (Admit(op) != 0) return ENOENT;
  const std::uint64_t epoch = op.token->epoch;
  int bfd = backing_.BucketFd(bucket);
  if (bfd < 0) return ENOENT;
  // Only regular files are fleet files; anything else stays hidden.
  struct stat st;
  if (::fstatat(bfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return backing_.NotAFleetFile(bucket, name, st);
  {
    // Deleting a WAL is the last moment to capture its commits; finishing a
    // journal is a commit. Replication may make the unlink wait.
    std::shared_ptr<TenantWatch> watch;
    if (file->role != FileRole::kMain) watch = WatchOf(*file, epoch);
    WriteGuard guard;
    if (watch) guard = watch->BeforeUnlink(file->role);
    if (int err = Admit(op); err != 0) return err;
    if (file->role == FileRole::kMain && options_.hooks) options_.hooks->WillDelete(*file, epoch);
    BeforeBackingCall();
    if (::unlinkat(bfd, name, 0) != 0) return errno;
    // Landed after the lease end: no more changes (no sidecars removed, no
    // tombstone), and the caller is not told it succeeded.
    if (int err = Landed(op); err != 0) return err;
  }
  if (file->role == FileRole::kMain && options_.hooks) {
    options_.hooks->Deleted(*file, epoch);  // a tombstone: not restored behind the user
  }
  if (file->role == FileRole::kMain) {
    // Deleting the main file deletes the tenant: its sidecars go with it.
    FenceJob forget;
    for (std::string_view suffix : kSidecarSuffixes) {
      std::string sidecar = std::string(name) + std::string(suffix);
      if (::unlinkat(bfd, sidecar.c_str(), 0) == 0) {
        forget.entries.push_back(EntryName{parent, sidecar});
      }
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
  RequestTimer timer(self, Op::kUnlink);
  int err = self.DoUnlink(parent, name);
  if (self.Failed(req, Op::kUnlink, err)) return;
  fuse_reply_err(req, 0);
}

// ---- open, create, release ----

int FleetFs::Impl::DoOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi,
                          std::uint64_t prepared, MonoTime started) {
  auto inode = inodes_.Find(ino);
  if (inode == nullptr) return ino < kFirstFileIno ? EISDIR : ESTALE;
  InFlight op;
  op.slot = inode->file.slot;
  op.role = inode->file.role;
  op.by_name = true;
  op.tenant_open = TenantOpen(inode->file.main_path);
  if (Admit(op) != 0) return ESTALE;
  const std::uint64_t epoch = op.token->epoch;
  const bool main = inode->file.role == FileRole::kMain && options_.hooks != nullptr;
  // An inode the kernel kept (an open descriptor, reopened through
  // /proc/PID/fd/N) skips the lookup: a main file not prepared for the epoch
  // served now goes through the same check as a lookup before it is opened.
  if (main && prepared != epoch && NeedsPrepare(*inode, epoch)) {
    return DeferOpen(req, ino, *fi, inode->file, epoch, started);
  }
  if (main && inode->exposed_epoch.load() < epoch) inode->exposed_epoch.store(epoch);
  auto h = std::make_unique<FileHandle>();
  // O_TRUNC is done below, through replication and under the lease rule.
  int flags = fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_NOFOLLOW | O_TRUNC);
  if (int err = backing_.OpenFile(*inode, flags, &h->fd); err != 0) return err;
  h->inode = inode;
  h->token = *op.token;
  h->watch = WatchOf(inode->file, epoch);
  if (fi->flags & O_TRUNC) {
    if (int err = TruncateHandle(op, *h, 0); err != 0) return err;
  }
  // Every process goes through this mount, so cached pages stay true; a
  // fence drops them.
  fi->keep_cache = 1;
  AddHandle(h.get());
  fi->fh = reinterpret_cast<uintptr_t>(static_cast<Handle*>(h.release()));
  return 0;
}

void FleetFs::Impl::ReplyOpen(fuse_req_t req, fuse_file_info* fi) {
  if (fuse_reply_open(req, fi) != 0) {
    // The opener was interrupted: the kernel will not release this handle.
    DropHandle(reinterpret_cast<Handle*>(static_cast<uintptr_t>(fi->fh)));
  }
}

int FleetFs::Impl::DeferOpen(fuse_req_t req, fuse_ino_t ino, const fuse_file_info& fi,
                             const FleetFile& file, std::uint64_t epoch, MonoTime started) {
  const uid_t uid = fuse_req_ctx(req)->uid;
  if (!EnterDeferred(uid)) return EAGAIN;
  // As Defer: the reply comes from the replicator's thread, with a copy of
  // the request's file info (the handler's is gone by then). Served at
  // another epoch by then, the file is prepared again for that one; not
  // served at all, the open is answered ESTALE.
  options_.hooks->Prepare(file, epoch, [this, req, ino, info = fi, epoch, uid,
                                        started](int err) mutable {
    LeaveDeferred(uid);
    if (err == 0) err = DoOpen(req, ino, &info, epoch, started);
    if (err == kDeferred) return;  // prepared again, for the epoch served now
    if (err != 0) {
      CountError(Op::kOpen, err);
      fuse_reply_err(req, err);
    } else {
      ReplyOpen(req, &info);
    }
    ObserveSince(Op::kOpen, started);
  });
  return kDeferred;
}

void FleetFs::Impl::Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kOpen);
  if (ino == kControlIno) {
    const uid_t uid = fuse_req_ctx(req)->uid;
    if (!ControlFiles::MayControl(uid, ::geteuid())) {
      spdlog::warn("vfs: refused an open of .fleetfs/control by uid {} (pid {}): only root or the "
                   "agent's user (uid {}) may send requests",
                   uid, fuse_req_ctx(req)->pid, ::geteuid());
      self.Failed(req, Op::kOpen, EACCES);
      return;
    }
    if (!self.control_opens_.Enter(uid)) {
      self.Failed(req, Op::kOpen, EMFILE);
      return;
    }
    auto h = std::make_unique<VirtualHandle>();
    h->control = true;
    h->uid = uid;
    self.AddHandle(h.get());
    fi->fh = reinterpret_cast<uintptr_t>(static_cast<Handle*>(h.release()));
    fi->direct_io = 1;
    self.stats_.Count(Op::kOpen);
    self.ReplyOpen(req, fi);
    return;
  }
  if (ControlFiles::IsFile(ino)) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
      self.Failed(req, Op::kOpen, EACCES);
      return;
    }
    const uid_t uid = fuse_req_ctx(req)->uid;
    if (!self.control_opens_.Enter(uid)) {
      self.Failed(req, Op::kOpen, EMFILE);
      return;
    }
    auto h = std::make_unique<VirtualHandle>();
    h->uid = uid;
    h->content = self.control_.Contents(ino);
    self.AddHandle(h.get());
    fi->fh = reinterpret_cast<uintptr_t>(static_cast<Handle*>(h.release()));
    fi->direct_io = 1;
    self.stats_.Count(Op::kOpen);
    self.ReplyOpen(req, fi);
    return;
  }
  int err = self.DoOpen(req, ino, fi, kNotPrepared, timer.started());
  if (err == kDeferred) {
    self.stats_.Count(Op::kOpen);  // once, however often it is prepared
    timer.HandOff();
    return;
  }
  if (self.Failed(req, Op::kOpen, err)) return;
  self.ReplyOpen(req, fi);
}

int FleetFs::Impl::DoCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                            fuse_file_info* fi, fuse_entry_param* e) {
  if (!IsBucketIno(parent)) return EPERM;
  int bucket = BucketOfIno(parent);
  std::optional<FleetFile> file = ParseFleetName(options_.mode, bucket, name);
  if (!file) return EPERM;  // not a fleet file: no such file may exist here
  InFlight op;  // held until the file exists with its stamp
  op.slot = file->slot;
  op.role = file->role;
  op.by_name = true;
  op.tenant_open = TenantOpen(file->main_path);
  if (Admit(op) != 0) return EREMOTE;  // another host's slot, or a new tenant while draining
  const std::uint64_t epoch = op.token->epoch;
  if (!options_.allow_create && file->role == FileRole::kMain) {
    struct stat st;
    int bfd = backing_.BucketFd(bucket);
    if (bfd < 0 || ::fstatat(bfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return EPERM;
  }
  int bfd = backing_.EnsureBucket(bucket);
  if (bfd < 0) return -bfd;
  if (int err = Admit(op); err != 0) return err;  // right before the backing call
  // O_EXCL first, to know whether this call made the file. O_TRUNC is done
  // below, through replication, for a file that was there.
  int flags = (fi->flags & ~(O_NOCTTY | O_CREAT | O_EXCL | O_TRUNC)) | O_NOFOLLOW | O_CLOEXEC;
  UniqueFd fd(::openat(bfd, name, flags | O_CREAT | O_EXCL, mode & 07777));
  const bool created = fd.valid();
  const fuse_ctx* ctx = fuse_req_ctx(req);
  struct stat st;
  if (!created) {
    if (errno != EEXIST || (fi->flags & O_EXCL)) return errno;
    // The file is there although the kernel believed the name absent (a
    // negative entry older than the file, or a create racing a lookup): the
    // kernel checked only the directory, and this process is root. So check
    // as the kernel would, against the file found, before opening it.
    if (::fstatat(bfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
    if (!S_ISREG(st.st_mode)) return backing_.NotAFleetFile(bucket, name, st);
    Caller caller{ctx->uid, ctx->gid, SupplementaryGroups(ctx->pid)};
    if (!MayAccess(st, caller, AccessWanted(fi->flags))) return EACCES;
    fd = UniqueFd(::openat(bfd, name, flags));
    if (!fd.valid()) return errno == ELOOP ? backing_.NotAFleetFile(bucket, name, st) : errno;
    struct stat opened;
    if (::fstat(fd.get(), &opened) != 0) return errno;
    // Replaced between the check and the open: the check was of another file.
    if (opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) return EAGAIN;
  }
  // A file this call made and then does not hand out (it landed after the
  // lease end, or could not be given its owner) is removed again, so nothing
  // made under a lease that ended stays behind. Only if the name still names
  // it: a file made by anything else there meanwhile is not this call's.
  auto unmade = [&](int err) {
    struct stat made, named;
    if (created && ::fstat(fd.get(), &made) == 0 &&
        ::fstatat(bfd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        made.st_dev == named.st_dev && made.st_ino == named.st_ino) {
      ::unlinkat(bfd, name, 0);
      spdlog::info("vfs: removed {}/{} again: its create was answered {}", BucketName(bucket),
                   name, std::strerror(err));
    }
    return err;
  };
  if (::fstat(fd.get(), &st) != 0) return unmade(errno);
  if (!S_ISREG(st.st_mode)) return EPERM;
  if (created) {
    // A file an application creates belongs to that application's user and
    // group, as on a local file system (the agent itself runs as root).
    if (::fchown(fd.get(), ctx->uid, ctx->gid) != 0) return unmade(errno);
  }
  if (created && file->role == FileRole::kMain) {
    spdlog::info("vfs: created tenant {}/{} (slot {}, epoch {}) for uid {}", BucketName(bucket),
                 name, file->slot, epoch, ctx->uid);
    // The stamp: the epoch this file was made under, and whose file it is.
    if (Status stamped = WriteStamps(fd.get(), epoch, file->key, file->main_path);
        !stamped.ok()) {
      spdlog::warn("vfs: {}", stamped.message());
    }
  }
  if (int err = Landed(op); err != 0) return unmade(err);
  if (::fstat(fd.get(), &st) != 0) return unmade(errno);
  auto inode = inodes_.Remember(bucket, name, *file, st);
  if (created && file->role == FileRole::kMain) inode->exposed_epoch.store(epoch);
  {
    std::lock_guard lock(negative_mu_);
    negative_.Forget(parent, name);  // there now: no absence to forget later
  }
  auto h = std::make_unique<FileHandle>();
  h->fd = std::move(fd);
  h->inode = inode;
  h->token = *op.token;
  h->watch = WatchOf(inode->file, epoch);
  if (!created && (fi->flags & O_TRUNC)) {
    if (int err = TruncateHandle(op, *h, 0); err != 0) {
      inodes_.Forget(inode->ino, 1);
      return err;
    }
    if (::fstat(h->fd.get(), &st) != 0) st.st_size = 0;
  }
  st.st_ino = inode->ino;
  e->ino = inode->ino;
  e->attr = st;
  e->attr_timeout = kEntryTimeout;
  e->entry_timeout = kEntryTimeout;
  fi->keep_cache = 1;
  AddHandle(h.get());
  fi->fh = reinterpret_cast<uintptr_t>(static_cast<Handle*>(h.release()));
  return 0;
}

void FleetFs::Impl::Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                           fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kCreate);
  fuse_entry_param e{};
  int err = self.DoCreate(req, parent, name, mode, fi, &e);
  if (self.Failed(req, Op::kCreate, err)) return;
  if (fuse_reply_create(req, &e, fi) != 0) {
    self.DropHandle(reinterpret_cast<Handle*>(static_cast<uintptr_t>(fi->fh)));
  }
}

void FleetFs::Impl::Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kRelease);
  self.stats_.Count(Op::kRelease);
  if (fi->fh != 0) self.DropHandle(reinterpret_cast<Handle*>(static_cast<uintptr_t>(fi->fh)));
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) {
  // Nothing is buffered here, and the kernel keeps the locks.
  RequestTimer timer(Self(req), Op::kFlush);
  Self(req).stats_.Count(Op::kFlush);
  fuse_reply_err(req, 0);
}

// ---- the hot path: read, write, fsync, fallocate ----

void FleetFs::Impl::Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off,
                         fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kRead);
  if (VirtualHandle* v = HandleAs<VirtualHandle>(fi); v != nullptr) {
    std::unique_lock<std::mutex> lock;
    if (v->control) lock = std::unique_lock(v->mu);
    const std::string& c = v->content;
    size_t start = std::min(static_cast<size_t>(std::max<off_t>(off, 0)), c.size());
    // The reply is sent from a copy: once the kernel has it, the reader may
    // close the file and its release may free the handle while this thread
    // is still returning from the write to /dev/fuse.
    thread_local std::string chunk;
    chunk.assign(c, start, std::min(size, c.size() - start));
    if (lock) lock.unlock();
    self.stats_.Count(Op::kRead);
    fuse_reply_buf(req, chunk.data(), chunk.size());
    return;
  }
  FileHandle* h = HandleAs<FileHandle>(fi);
  if (h == nullptr) {
    self.Failed(req, Op::kRead, EBADF);
    return;
  }
  InFlight op;
  int err = self.CheckHandle(op, *h);
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
  if (VirtualHandle* v = HandleAs<VirtualHandle>(fi); v != nullptr) {
    if (!v->control) {
      self.Failed(req, Op::kWrite, EBADF);
      return;
    }
    self.WriteControl(req, *v, std::string_view(buf, size));
    return;
  }
  RequestTimer timer(self, Op::kWrite);
  FileHandle* h = HandleAs<FileHandle>(fi);
  if (h == nullptr) {
    self.Failed(req, Op::kWrite, EBADF);  // a control file or directory: never written
    return;
  }
  InFlight op;  // its views are held until the write is answered: a fence waits for it
  int err = self.CheckHandle(op, *h);
  ssize_t n = 0;
  if (err == 0) {
    // Replication sees the change first; a WAL restart waits here until the
    // old log's commits are captured, a snapshot holds its write gate.
    WriteGuard guard;
    if (h->watch) {
      guard = h->watch->BeforeWrite(h->inode->file.role, static_cast<std::uint64_t>(off), buf, size);
    }
    err = self.Admit(op);  // after the wait, right before the backing call
    if (err == 0) {
      self.BeforeBackingCall();
      n = ::pwrite(h->fd.get(), buf, size, off);
      err = n < 0 ? errno : self.Landed(op);
    }
  }
  if (self.Failed(req, Op::kWrite, err)) return;
  fuse_reply_write(req, static_cast<size_t>(n));
}

// The largest request: a range, an owner id of at most 128 bytes, a verb.
constexpr std::size_t kMaxControlRequest = 1024;

void FleetFs::Impl::WriteControl(fuse_req_t req, VirtualHandle& h, std::string_view request) {
  // Checked again at each write: a descriptor opened by root may have been
  // passed to another process.
  const fuse_ctx* ctx = fuse_req_ctx(req);
  if (!ControlFiles::MayControl(ctx->uid, ::geteuid())) {
    spdlog::warn("vfs: refused a request on .fleetfs/control from uid {} (pid {}): only root or "
                 "the agent's user (uid {}) may send requests",
                 ctx->uid, ctx->pid, ::geteuid());
    Failed(req, Op::kWrite, EACCES);
    return;
  }
  MountOptions::ControlReply reply;
  if (request.size() > kMaxControlRequest) {
    reply.text = "error: a control request is at most " + std::to_string(kMaxControlRequest) +
                 " bytes, written in one write\n";
  } else if (!options_.control) {
    reply.text = "error: this mount takes no control requests\n";
  } else {
    reply = options_.control(request);
  }
  {
    std::lock_guard lock(h.mu);
    h.content = reply.text;
  }
  if (!reply.accepted) {
    Failed(req, Op::kWrite, EINVAL);
    return;
  }
  stats_.Count(Op::kWrite);
  fuse_reply_write(req, request.size());
}

void FleetFs::Impl::Fsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kFsync);
  FileHandle* h = HandleAs<FileHandle>(fi);
  if (h == nullptr) {
    // A control file holds nothing to sync (as fsync(2) on a file that
    // cannot be synced: EINVAL).
    self.Failed(req, Op::kFsync, HandleAs<VirtualHandle>(fi) != nullptr ? EINVAL : EBADF);
    return;
  }
  InFlight op;
  int err = self.CheckHandle(op, *h);
  if (err == 0) {
    self.BeforeBackingCall();
    if ((datasync ? ::fdatasync(h->fd.get()) : ::fsync(h->fd.get())) != 0) {
      err = errno;
    } else {
      err = self.Landed(op);  // durable only once the lease had not ended
    }
  }
  if (self.Failed(req, Op::kFsync, err)) return;
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t off, off_t len,
                              fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kFallocate);
  FileHandle* h = HandleAs<FileHandle>(fi);
  if (h == nullptr) {
    self.Failed(req, Op::kFallocate, EBADF);
    return;
  }
  // Only what SQLite uses. Punching, zeroing, collapsing or inserting a range
  // changes committed bytes in place, which no capture could read back.
  if ((mode & ~FALLOC_FL_KEEP_SIZE) != 0) {
    self.Failed(req, Op::kFallocate, EOPNOTSUPP);
    return;
  }
  InFlight op;
  int err = self.CheckHandle(op, *h);
  if (err == 0) {
    // Mode 0 past the end grows the file, as a truncate up to off + len
    // would: replication sees that size change first, under the write gate.
    // Within the file, or with KEEP_SIZE, no byte a reader sees changes.
    WriteGuard guard;
    struct stat st;
    if (mode == 0 && h->watch && off >= 0 && len > 0) {
      if (len > std::numeric_limits<off_t>::max() - off) {
        err = EFBIG;
      } else if (::fstat(h->fd.get(), &st) != 0) {
        err = errno;
      } else if (off + len > st.st_size) {
        guard = h->watch->BeforeTruncate(h->inode->file.role, static_cast<std::uint64_t>(off + len));
        err = self.Admit(op);  // after the wait, right before the backing call
      }
    }
    if (err == 0) {
      self.BeforeBackingCall();
      err = ::fallocate(h->fd.get(), mode, off, len) != 0 ? errno : self.Landed(op);
    }
  }
  if (self.Failed(req, Op::kFallocate, err)) return;
  fuse_reply_err(req, 0);
}

// ---- directories ----

void FleetFs::Impl::Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kOpendir);
  if (ino != kRootIno && ino != kControlDirIno && !IsBucketIno(ino)) {
    self.Failed(req, Op::kOpendir, ENOTDIR);
    return;
  }
  // The listing is made at the first readdir: SQLite opens a directory only
  // to fsync it, once per new journal, and that must stay cheap.
  auto dir = std::make_unique<DirHandle>();
  self.AddHandle(dir.get());
  fi->fh = reinterpret_cast<uintptr_t>(static_cast<Handle*>(dir.release()));
  self.stats_.Count(Op::kOpendir);
  if (fuse_reply_open(req, fi) != 0) {  // interrupted: no release will come
    self.DropHandle(reinterpret_cast<Handle*>(static_cast<uintptr_t>(fi->fh)));
  }
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
  if (!IsBucketIno(ino)) return ENOTDIR;
  int bucket = BucketOfIno(ino);
  int bfd = backing_.BucketFd(bucket);
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
    if (!file || !view->accepting()) continue;
    const ServedRange* range = view->Find(file->slot, now);
    if (range == nullptr || !range->accepting) continue;
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
  RequestTimer timer(self, Op::kReaddir);
  DirHandle* dir = HandleAs<DirHandle>(fi);
  int err = dir == nullptr ? EBADF : 0;
  if (err == 0 && (off == 0 || !dir->listed)) {
    dir->entries.clear();
    err = self.ListDir(ino, *dir);
    dir->listed = true;
  }
  if (self.Failed(req, Op::kReaddir, err)) return;
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < dir->entries.size(); ++i) {
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
  if (fi->fh != 0) self.DropHandle(reinterpret_cast<Handle*>(static_cast<uintptr_t>(fi->fh)));
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kFsync);
  int fd = ino == kRootIno ? self.backing_.root_fd()
           : IsBucketIno(ino) ? self.backing_.BucketFd(BucketOfIno(ino))
                              : -1;
  int err = 0;
  // SQLite syncs the directory after creating a journal, so its name is durable.
  if (fd >= 0 && (datasync ? ::fdatasync(fd) : ::fsync(fd)) != 0) err = errno;
  if (self.Failed(req, Op::kFsync, err)) return;
  fuse_reply_err(req, 0);
}

void FleetFs::Impl::Statfs(fuse_req_t req, fuse_ino_t) {
  Impl& self = Self(req);
  RequestTimer timer(self, Op::kStatfs);
  struct statvfs st {};
  int err = ::fstatvfs(self.backing_.root_fd(), &st) == 0 ? 0 : errno;
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
std::string FleetFs::TransportName() const { return impl_->TransportName(); }
std::size_t FleetFs::KnownInodes() const { return impl_->KnownInodes(); }
std::string FleetFs::TransportWhy() const { return impl_->TransportWhy(); }
std::vector<std::pair<std::string, std::size_t>> FleetFs::OpenHandlesByTenant() const {
  return impl_->OpenHandlesByTenant();
}
std::size_t FleetFs::OpenHandlesIn(Slot first, Slot last) const {
  return impl_->OpenHandlesIn(first, last);
}

}  // namespace fleetfs::vfs
