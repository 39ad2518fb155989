#include "vfs/vfs_stats.h"

#include <cerrno>

namespace fleetfs::vfs {

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kLookup: return "lookup";
    case Op::kGetattr: return "getattr";
    case Op::kSetattr: return "setattr";
    case Op::kOpen: return "open";
    case Op::kCreate: return "create";
    case Op::kRead: return "read";
    case Op::kWrite: return "write";
    case Op::kFsync: return "fsync";
    case Op::kFlush: return "flush";
    case Op::kRelease: return "release";
    case Op::kUnlink: return "unlink";
    case Op::kOpendir: return "opendir";
    case Op::kReaddir: return "readdir";
    case Op::kStatfs: return "statfs";
    case Op::kFallocate: return "fallocate";
    case Op::kRefused: return "refused";
    case Op::kCount: break;
  }
  return "unknown";
}

std::string_view ErrKindName(ErrKind kind) {
  switch (kind) {
    case ErrKind::kEnoent: return "ENOENT";
    case ErrKind::kEremote: return "EREMOTE";
    case ErrKind::kEperm: return "EPERM";
    case ErrKind::kEstale: return "ESTALE";
    case ErrKind::kEacces: return "EACCES";
    case ErrKind::kEio: return "EIO";
    case ErrKind::kEnospc: return "ENOSPC";
    case ErrKind::kErofs: return "EROFS";
    case ErrKind::kOther: case ErrKind::kCount: break;
  }
  return "other";
}

ErrKind ErrKindOf(int err) {
  switch (err) {
    case ENOENT: return ErrKind::kEnoent;
    case EREMOTE: return ErrKind::kEremote;
    case EPERM: return ErrKind::kEperm;
    case ESTALE: return ErrKind::kEstale;
    case EACCES: return ErrKind::kEacces;
    case EIO: return ErrKind::kEio;
    case ENOSPC: return ErrKind::kEnospc;
    case EROFS: return ErrKind::kErofs;
    default: return ErrKind::kOther;
  }
}

}  // namespace fleetfs::vfs
