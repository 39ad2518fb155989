// A minimal write-through FUSE low-level passthrough: the floor fleetfs is
// measured against in the same benchmark run. No filtering, no fences, no
// statistics: lookups, attributes, open/create, read, write, fsync, unlink
// and directory listing over a backing directory, with the same kernel
// settings as fleetfs (no writeback cache, no lock operations, 10 threads).
//
// Not part of fleetfs. Usage: min_passthrough BACKING MOUNTPOINT (runs until
// unmounted).
#define FUSE_USE_VERSION 314

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Inode {
  int fd = -1;  // O_PATH
  uint64_t nlookup = 0;
  ~Inode() {
    if (fd >= 0) close(fd);
  }
};

struct Fs {
  int root_fd = -1;
  std::mutex mu;  // guards inodes and by_key
  std::map<fuse_ino_t, std::unique_ptr<Inode>> inodes;
  std::map<std::pair<dev_t, ino_t>, fuse_ino_t> by_key;
  fuse_ino_t next = 2;
};

Fs& Self(fuse_req_t req) { return *static_cast<Fs*>(fuse_req_userdata(req)); }

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

void Init(void*, fuse_conn_info* conn) {
  conn->want &= ~(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_entry_param e{};
  int err = DoLookup(Self(req), parent, name, &e);
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
  ForgetOne(Self(req), ino, n);
  fuse_reply_none(req);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* f) {
  for (size_t i = 0; i < count; ++i) ForgetOne(Self(req), f[i].ino, f[i].nlookup);
  fuse_reply_none(req);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  struct stat st;
  int fd = fi ? static_cast<int>(fi->fh) : FdOf(Self(req), ino);
  if (fstat(fd, &st) != 0) return (void)fuse_reply_err(req, errno);
  st.st_ino = ino;
  fuse_reply_attr(req, &st, 1.0);
}

void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  int pfd = FdOf(Self(req), ino);
  if (to_set & FUSE_SET_ATTR_SIZE) {
    int rc = fi ? ftruncate(static_cast<int>(fi->fh), attr->st_size)
                : truncate(Proc(pfd).c_str(), attr->st_size);
    if (rc != 0) return (void)fuse_reply_err(req, errno);
  }
  if (to_set & FUSE_SET_ATTR_MODE) chmod(Proc(pfd).c_str(), attr->st_mode);
  Getattr(req, ino, fi);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int fd = open(Proc(FdOf(Self(req), ino)).c_str(), fi->flags & ~(O_NOFOLLOW | O_CREAT));
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  fi->fh = static_cast<uint64_t>(fd);
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
            fuse_file_info* fi) {
  Fs& fs = Self(req);
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
  thread_local std::vector<char> buf;
  if (buf.size() < size) buf.resize(size);
  ssize_t n = pread(static_cast<int>(fi->fh), buf.data(), size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void Write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
           fuse_file_info* fi) {
  ssize_t n = pwrite(static_cast<int>(fi->fh), buf, size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_write(req, static_cast<size_t>(n));
}

void Flush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void Fsync(fuse_req_t req, fuse_ino_t, int datasync, fuse_file_info* fi) {
  int fd = static_cast<int>(fi->fh);
  fuse_reply_err(req, (datasync ? fdatasync(fd) : fsync(fd)) == 0 ? 0 : errno);
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, unlinkat(FdOf(Self(req), parent), name, 0) == 0 ? 0 : errno);
}

void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int fd = openat(FdOf(Self(req), ino), ".", O_RDONLY | O_DIRECTORY);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  fi->fh = static_cast<uint64_t>(fd);
  fuse_reply_open(req, fi);
}

void Readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
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
  close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void Fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  fuse_reply_err(req, fsync(static_cast<int>(fi->fh)) == 0 ? 0 : errno);
}

void Statfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st;
  fstatvfs(Self(req).root_fd, &st);
  fuse_reply_statfs(req, &st);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: min_passthrough BACKING MOUNTPOINT\n");
    return 2;
  }
  Fs fs;
  fs.root_fd = open(argv[1], O_PATH | O_DIRECTORY);
  if (fs.root_fd < 0) {
    std::perror(argv[1]);
    return 1;
  }
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
  std::vector<char*> args_v = {argv[0], const_cast<char*>("-o"), opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, args_v.data());
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &fs);
  if (se == nullptr || fuse_session_mount(se, argv[2]) != 0) return 1;
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, 10);
  int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  return rc == 0 ? 0 : 1;
}
