// InodeTable: the inode numbers the kernel knows the mount's files by.
//
// The layout's directories and the control files have fixed numbers (the
// layout is fixed, so they are too); every fleet file the kernel looks up
// gets a number from kFirstFileIno up, kept until the kernel forgets it
// (FUSE forget: the lookup count drops to zero). One backing file (dev, ino)
// found under one name (bucket, name) has one number while the kernel knows
// it. The name is part of the identity: a file system reuses a deleted
// file's inode number at once (ext4 does), while the kernel may still know
// the deleted file (a descriptor holds it), so a new file under another name
// with the same (dev, ino) is another inode, never the deleted one's.
//
// An inode holds no descriptor: it names its backing file by bucket and name
// and remembers the (dev, ino) it was found as, so however many inodes the
// kernel caches, the mount's descriptors stay bounded (the root, 256 buckets
// and the open handles). A file replaced under the name is another file.
//
// Thread-safety: every method is safe from any thread; one mutex, taken
// alone. A FileInode's fixed fields never change after Remember.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fleet/layout.h"
#include "vfs/serving_view.h"

namespace fleetfs::vfs {

using Ino = std::uint64_t;  // fuse_ino_t, without FUSE's header

// Fixed inode numbers.
inline constexpr Ino kRootIno = 1;                               // FUSE_ROOT_ID
inline constexpr Ino kFirstBucketIno = 2;                        // 2..257
inline constexpr Ino kControlDirIno = kFirstBucketIno + kBucketCount;  // 258
inline constexpr Ino kStatusIno = kControlDirIno + 1;
inline constexpr Ino kRangesIno = kControlDirIno + 2;
inline constexpr Ino kControlIno = kControlDirIno + 3;  // .fleetfs/control
inline constexpr Ino kTenantsLiveIno = kControlDirIno + 4;  // .fleetfs/tenants-live.jsonl
inline constexpr Ino kFirstFileIno = 1024;

inline bool IsBucketIno(Ino ino) { return ino >= kFirstBucketIno && ino < kFirstBucketIno + kBucketCount; }
inline int BucketOfIno(Ino ino) { return static_cast<int>(ino - kFirstBucketIno); }
inline Ino BucketIno(int bucket) { return kFirstBucketIno + static_cast<Ino>(bucket); }

// A fleet file the kernel knows by `ino`: its name under its bucket and the
// backing file it was found as.
struct FileInode {
  Ino ino = 0;
  int bucket = 0;
  std::string name;
  FleetFile file;
  dev_t dev = 0;
  ino_t backing_ino = 0;
  // The newest epoch this main file was prepared and stamped for: lookups
  // and opens under it need no replica check.
  std::atomic<std::uint64_t> exposed_epoch{0};
  std::uint64_t nlookup = 0;  // guarded by InodeTable::mu_
};

class InodeTable {
 public:
  // The inode numbered `ino`, or nullptr (a fixed number, or forgotten).
  std::shared_ptr<FileInode> Find(Ino ino) const;
  // Registers (or finds) the inode of the backing file `st` describes, found
  // as `name` in `bucket`, and counts one lookup. The inode returned always
  // has this bucket and name.
  std::shared_ptr<FileInode> Remember(int bucket, std::string_view name, const FleetFile& file,
                                      const struct stat& st);
  // The kernel forgot `nlookup` lookups of `ino`. Open handles keep their
  // own reference to the inode.
  void Forget(Ino ino, std::uint64_t nlookup);
  // Every known inode whose slot lies in one of `ranges`.
  std::vector<std::shared_ptr<FileInode>> In(const std::vector<ServedRange>& ranges) const;
  std::size_t size() const;

 private:
  // What a backing file is known by: its (dev, ino) and the name it was found as.
  struct BackingKey {
    dev_t dev;
    ino_t ino;
    int bucket;
    std::string name;
    auto operator<=>(const BackingKey&) const = default;
  };
  static BackingKey KeyOf(const FileInode& inode) {
    return BackingKey{inode.dev, inode.backing_ino, inode.bucket, inode.name};
  }

  mutable std::mutex mu_;  // guards the three below and every FileInode::nlookup; taken alone
  std::unordered_map<Ino, std::shared_ptr<FileInode>> inodes_;
  std::map<BackingKey, Ino> by_backing_;
  Ino next_ino_ = kFirstFileIno;
};

}  // namespace fleetfs::vfs
