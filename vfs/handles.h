// The handles the mount gives the kernel (fuse_file_info::fh), one kind per
// thing that can be opened: a fleet file, a control file, a directory.
//
// Every handler that takes a handle checks its kind first: a local user can
// send any operation the kernel allows on any open descriptor (fsync on a
// virtual file, an allocate on a directory), and a handle taken for another
// kind would be memory misread as a file.
//
// Thread-safety: a handle's fields are set before it is given to the kernel
// and not changed after, except a DirHandle's listing, which the kernel's
// per-file lock serializes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fleet/tenant_hooks.h"
#include "fleet/unique_fd.h"
#include "vfs/control_files.h"
#include "vfs/inode_table.h"
#include "vfs/serving_view.h"

namespace fleetfs::vfs {

enum class HandleKind : std::uint8_t { kFile, kVirtual, kDir };

struct Handle {
  explicit Handle(HandleKind k) : kind(k) {}
  virtual ~Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  const HandleKind kind;
};

// An open fleet file. Owns its backing descriptor.
struct FileHandle final : Handle {
  static constexpr HandleKind kKind = HandleKind::kFile;
  FileHandle() : Handle(kKind) {}
  UniqueFd fd;
  std::shared_ptr<FileInode> inode;
  ServingToken token;
  std::shared_ptr<TenantWatch> watch;  // replication's, for main, -wal and -journal
};

// An open control file: its content, made at open. For .fleetfs/control
// (`control`), the reply to the last request written, which a write
// replaces: the kernel may run a read and a write of one descriptor at once.
struct VirtualHandle final : Handle {
  static constexpr HandleKind kKind = HandleKind::kVirtual;
  VirtualHandle() : Handle(kKind) {}
  bool control = false;
  std::mutex mu;        // guards content of a control handle
  std::string content;
  uid_t uid = 0;  // who opened it: the open counted against theirs, given back at release
};

// An open directory: its listing, made at the first readdir.
struct DirHandle final : Handle {
  static constexpr HandleKind kKind = HandleKind::kDir;
  DirHandle() : Handle(kKind) {}
  bool listed = false;
  std::vector<ControlFiles::Entry> entries;
};

// The handle of kind H that `fh` (a value the mount gave the kernel) names,
// or nullptr when there is none or it is of another kind.
template <typename H>
H* HandleOfKind(std::uint64_t fh) {
  if (fh == 0) return nullptr;
  auto* h = reinterpret_cast<Handle*>(static_cast<std::uintptr_t>(fh));
  return h->kind == H::kKind ? static_cast<H*>(h) : nullptr;
}

}  // namespace fleetfs::vfs
