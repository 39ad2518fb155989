#include "vfs/inode_table.h"

#include <algorithm>

namespace fleetfs::vfs {

std::shared_ptr<FileInode> InodeTable::Find(Ino ino) const {
  std::lock_guard lock(mu_);
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : it->second;
}

std::shared_ptr<FileInode> InodeTable::Remember(int bucket, std::string_view name,
                                                const FleetFile& file,
                                                const struct stat& st) {
  std::lock_guard lock(mu_);
  BackingKey key{st.st_dev, st.st_ino, bucket, std::string(name)};
  auto it = by_backing_.find(key);
  if (it != by_backing_.end()) {
    auto& inode = inodes_.at(it->second);
    ++inode->nlookup;
    return inode;
  }
  auto inode = std::make_shared<FileInode>();
  inode->ino = next_ino_++;
  inode->bucket = bucket;
  inode->name = std::string(name);
  inode->file = file;
  inode->dev = st.st_dev;
  inode->backing_ino = st.st_ino;
  inode->nlookup = 1;
  inodes_.emplace(inode->ino, inode);
  by_backing_.emplace(std::move(key), inode->ino);
  return inode;
}

void InodeTable::Forget(Ino ino, std::uint64_t nlookup) {
  if (ino < kFirstFileIno) return;  // fixed inodes are never forgotten
  std::lock_guard lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;
  auto& inode = it->second;
  inode->nlookup -= std::min(nlookup, inode->nlookup);
  if (inode->nlookup == 0) {
    // Its key names it alone (Remember finds a key before it adds one).
    auto key = by_backing_.find(KeyOf(*inode));
    if (key != by_backing_.end() && key->second == ino) by_backing_.erase(key);
    inodes_.erase(it);
  }
}

std::vector<std::shared_ptr<FileInode>> InodeTable::In(
    const std::vector<ServedRange>& ranges) const {
  std::vector<std::shared_ptr<FileInode>> found;
  if (ranges.empty()) return found;
  std::lock_guard lock(mu_);
  for (const auto& [ino, inode] : inodes_) {
    for (const ServedRange& r : ranges) {
      if (inode->file.slot >= r.first && inode->file.slot <= r.last) {
        found.push_back(inode);
        break;
      }
    }
  }
  return found;
}

std::size_t InodeTable::size() const {
  std::lock_guard lock(mu_);
  return inodes_.size();
}

}  // namespace fleetfs::vfs
