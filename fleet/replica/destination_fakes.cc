#include "fleet/replica/destination_fakes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "fleet/fd_io.h"

namespace fleetfs::replica {
namespace {

// The contents of `fd` from offset 0 to its end.
Result<std::string> ReadWhole(int fd) {
  std::string out;
  std::vector<char> buf(1 << 16);
  while (true) {
    FLEETFS_ASSIGN_OR_RETURN(std::size_t n, PreadFull(fd, buf.data(), buf.size(), out.size()));
    out.append(buf.data(), n);
    if (n < buf.size()) return out;
  }
}

Result<std::uint64_t> FileSize(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat of the local copy", errno);
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace

// ---- MemoryDestination

MemoryDestination::MemoryDestination(std::string url, std::size_t get_piece)
    : url_(std::move(url)), get_piece_(std::max<std::size_t>(get_piece, 1)) {}

std::optional<std::string> MemoryDestination::Peek(std::string_view path) const {
  std::lock_guard lock(mu_);
  auto it = objects_.find(path);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, std::string> MemoryDestination::Objects() const {
  std::lock_guard lock(mu_);
  return {objects_.begin(), objects_.end()};
}

Result<std::vector<std::string>> MemoryDestination::ListLocked(std::string_view dir) const {
  std::string prefix = dir.empty() ? "" : std::string(dir) + "/";
  std::set<std::string> names;
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
    std::string_view rest = std::string_view(it->first).substr(prefix.size());
    names.emplace(rest.substr(0, rest.find('/')));
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Result<std::vector<std::string>> MemoryDestination::List(std::string_view dir) {
  counter_.Count(Request::kList);
  std::lock_guard lock(mu_);
  return counter_.Outcome(ListLocked(dir));
}

Result<std::vector<std::string>> MemoryDestination::ListFrom(std::string_view dir,
                                                             std::string_view after) {
  counter_.Count(Request::kList);
  std::lock_guard lock(mu_);
  auto names = ListLocked(dir);  // sorted already: a std::set's order
  if (names.ok()) std::erase_if(*names, [&](const std::string& n) { return n <= after; });
  return counter_.Outcome(std::move(names));
}

Status MemoryDestination::Store(std::string_view path, std::string bytes, bool create_only) {
  if (create_only) FLEETFS_RETURN_IF_ERROR(ValidateObjectPath(path));
  std::lock_guard lock(mu_);
  // As in a directory, a name is an object or a directory, never both.
  for (std::size_t slash = path.find('/'); slash != std::string_view::npos;
       slash = path.find('/', slash + 1)) {
    if (objects_.contains(path.substr(0, slash))) {
      return Status(Code::kFailedPrecondition,
                    Full(path) + ": " + std::string(path.substr(0, slash)) + " is an object");
    }
  }
  std::string as_dir = std::string(path) + "/";
  if (auto it = objects_.lower_bound(as_dir);
      it != objects_.end() && it->first.starts_with(as_dir)) {
    return Status(Code::kFailedPrecondition, Full(path) + " is a directory");
  }
  auto it = objects_.find(path);
  if (it != objects_.end()) {
    if (create_only) {
      return Status(Code::kAlreadyExists,
                    Full(path) + " already exists: a create never replaces an object");
    }
    it->second = std::move(bytes);
    return Status::Ok();
  }
  objects_.emplace(std::string(path), std::move(bytes));
  return Status::Ok();
}

Status MemoryDestination::Put(std::string_view path, std::string_view bytes) {
  counter_.Count(Request::kPut);
  return counter_.Outcome(Store(path, std::string(bytes), false));
}

Status MemoryDestination::PutFile(std::string_view path, int fd) {
  counter_.Count(Request::kPut);
  auto bytes = ReadWhole(fd);
  if (!bytes.ok()) return counter_.Outcome(bytes.status());
  return counter_.Outcome(Store(path, std::move(*bytes), false));
}

Status MemoryDestination::Create(std::string_view path, std::string_view bytes) {
  counter_.Count(Request::kCreate);
  return counter_.Outcome(Store(path, std::string(bytes), true));
}

Status MemoryDestination::CreateFromFile(std::string_view path, int fd) {
  counter_.Count(Request::kCreate);
  auto bytes = ReadWhole(fd);
  if (!bytes.ok()) return counter_.Outcome(bytes.status());
  return counter_.Outcome(Store(path, std::move(*bytes), true));
}

Status MemoryDestination::Get(std::string_view path, const Sink& sink) {
  counter_.Count(Request::kGet);
  std::optional<std::string> bytes = Peek(path);
  if (!bytes) return counter_.Outcome(NotFound(Full(path) + " does not exist"));
  // The sink runs without the lock: it may call back into the destination.
  for (std::size_t off = 0; off < bytes->size(); off += get_piece_) {
    Status st = sink(std::string_view(*bytes).substr(off, get_piece_));
    if (!st.ok()) return counter_.Outcome(st);
  }
  return Status::Ok();
}

Result<std::string> MemoryDestination::GetHead(std::string_view path, std::size_t n) {
  counter_.Count(Request::kHead);
  std::optional<std::string> bytes = Peek(path);
  if (!bytes)
    return counter_.Outcome(Result<std::string>(NotFound(Full(path) + " does not exist")));
  return bytes->substr(0, n);
}

Result<std::uint64_t> MemoryDestination::Size(std::string_view path) {
  counter_.Count(Request::kSize);
  std::optional<std::string> bytes = Peek(path);
  if (!bytes) {
    return counter_.Outcome(Result<std::uint64_t>(NotFound(Full(path) + " does not exist")));
  }
  return static_cast<std::uint64_t>(bytes->size());
}

Status MemoryDestination::Remove(std::string_view path) {
  counter_.Count(Request::kRemove);
  std::lock_guard lock(mu_);
  if (path.empty()) {
    objects_.clear();
    return Status::Ok();
  }
  objects_.erase(std::string(path));
  std::string as_dir = std::string(path) + "/";
  auto it = objects_.lower_bound(as_dir);
  while (it != objects_.end() && it->first.starts_with(as_dir)) it = objects_.erase(it);
  return Status::Ok();
}

Status MemoryDestination::Probe() {
  counter_.Count(Request::kProbe);
  return Status::Ok();
}

Result<int> MemoryDestination::CleanTemps(std::chrono::seconds) {
  counter_.Count(Request::kCleanTemps);
  return 0;  // a map has no temporary files
}

// ---- FailingDestination

FailingDestination::FailingDestination(std::shared_ptr<Destination> inner)
    : inner_(std::move(inner)) {}

void FailingDestination::Inject(Fault fault) {
  std::lock_guard lock(mu_);
  faults_.push_back(Armed{std::move(fault)});
}

void FailingDestination::Heal() {
  std::lock_guard lock(mu_);
  faults_.clear();
}

int FailingDestination::injected_failures() const {
  std::lock_guard lock(mu_);
  return failed_;
}

Status FailingDestination::Check(Request kind, std::optional<std::string_view> path,
                                 std::optional<std::uint64_t> write_bytes, bool* landed) {
  std::lock_guard lock(mu_);
  std::optional<Status> verdict;
  for (Armed& a : faults_) {
    const Fault& f = a.fault;
    if (f.kind && *f.kind != kind) continue;
    if (f.under && (!path || !path->starts_with(*f.under))) continue;
    if (f.writes_over && (!write_bytes || *write_bytes <= *f.writes_over)) continue;
    if (f.after_landing && landed == nullptr) continue;
    ++a.seen;
    bool fires = a.seen > f.skip && (f.times < 0 || a.seen <= f.skip + f.times);
    if (fires && !verdict) {
      verdict = f.status;
      if (landed) *landed = f.after_landing;
    }
  }
  if (!verdict) return Status::Ok();
  ++failed_;
  return *verdict;
}

Result<std::vector<std::string>> FailingDestination::List(std::string_view dir) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kList, dir, std::nullopt));
  return inner_->List(dir);
}
Result<std::vector<std::string>> FailingDestination::ListFrom(std::string_view dir,
                                                              std::string_view after) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kList, dir, std::nullopt));
  return inner_->ListFrom(dir, after);
}
Status FailingDestination::Put(std::string_view path, std::string_view bytes) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kPut, path, bytes.size()));
  return inner_->Put(path, bytes);
}
Status FailingDestination::PutFile(std::string_view path, int fd) {
  FLEETFS_ASSIGN_OR_RETURN(std::uint64_t size, FileSize(fd));
  FLEETFS_RETURN_IF_ERROR(Check(Request::kPut, path, size));
  return inner_->PutFile(path, fd);
}
Status FailingDestination::Create(std::string_view path, std::string_view bytes) {
  bool landed = false;
  Status st = Check(Request::kCreate, path, bytes.size(), &landed);
  if (!st.ok() && !landed) return st;
  Status created = inner_->Create(path, bytes);
  return landed ? st : created;
}
Status FailingDestination::CreateFromFile(std::string_view path, int fd) {
  FLEETFS_ASSIGN_OR_RETURN(std::uint64_t size, FileSize(fd));
  bool landed = false;
  Status st = Check(Request::kCreate, path, size, &landed);
  if (!st.ok() && !landed) return st;
  Status created = inner_->CreateFromFile(path, fd);
  return landed ? st : created;
}
Status FailingDestination::Get(std::string_view path, const Sink& sink) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kGet, path, std::nullopt));
  return inner_->Get(path, sink);
}
Result<std::string> FailingDestination::GetHead(std::string_view path, std::size_t n) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kHead, path, std::nullopt));
  return inner_->GetHead(path, n);
}
Result<std::uint64_t> FailingDestination::Size(std::string_view path) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kSize, path, std::nullopt));
  return inner_->Size(path);
}
Status FailingDestination::Remove(std::string_view path) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kRemove, path, std::nullopt));
  return inner_->Remove(path);
}
Status FailingDestination::Probe() {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kProbe, std::nullopt, 0));
  return inner_->Probe();
}
Result<int> FailingDestination::CleanTemps(std::chrono::seconds max_age) {
  FLEETFS_RETURN_IF_ERROR(Check(Request::kCleanTemps, std::nullopt, std::nullopt));
  return inner_->CleanTemps(max_age);
}

// ---- HangingDestination

HangingDestination::HangingDestination(std::shared_ptr<Destination> inner,
                                       std::chrono::milliseconds give_up)
    : inner_(std::move(inner)), give_up_(give_up) {}

void HangingDestination::Hang(std::optional<Request> kind) {
  std::lock_guard lock(mu_);
  hanging_ = true;
  kind_ = kind;
}

void HangingDestination::Release() {
  std::lock_guard lock(mu_);
  hanging_ = false;
  ++releases_;
  cv_.notify_all();
}

int HangingDestination::held() const {
  std::lock_guard lock(mu_);
  return held_;
}

bool HangingDestination::WaitHeld(int n, std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, limit, [&] { return held_ >= n; });
}

Status HangingDestination::Gate(Request kind) {
  std::unique_lock lock(mu_);
  if (!hanging_ || (kind_ && *kind_ != kind)) return Status::Ok();
  const std::uint64_t entered = releases_;
  ++held_;
  cv_.notify_all();
  bool released = cv_.wait_for(lock, give_up_, [&] { return releases_ != entered; });
  --held_;
  cv_.notify_all();
  if (released) return Status::Ok();
  return Status(Code::kDeadlineExceeded, "a " + std::string(RequestName(kind)) + " to " +
                                             inner_->url() +
                                             " was held by HangingDestination and never released");
}

Result<std::vector<std::string>> HangingDestination::List(std::string_view dir) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kList));
  return inner_->List(dir);
}
Result<std::vector<std::string>> HangingDestination::ListFrom(std::string_view dir,
                                                              std::string_view after) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kList));
  return inner_->ListFrom(dir, after);
}
Status HangingDestination::Put(std::string_view path, std::string_view bytes) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kPut));
  return inner_->Put(path, bytes);
}
Status HangingDestination::PutFile(std::string_view path, int fd) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kPut));
  return inner_->PutFile(path, fd);
}
Status HangingDestination::Create(std::string_view path, std::string_view bytes) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kCreate));
  return inner_->Create(path, bytes);
}
Status HangingDestination::CreateFromFile(std::string_view path, int fd) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kCreate));
  return inner_->CreateFromFile(path, fd);
}
Status HangingDestination::Get(std::string_view path, const Sink& sink) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kGet));
  return inner_->Get(path, sink);
}
Result<std::string> HangingDestination::GetHead(std::string_view path, std::size_t n) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kHead));
  return inner_->GetHead(path, n);
}
Result<std::uint64_t> HangingDestination::Size(std::string_view path) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kSize));
  return inner_->Size(path);
}
Status HangingDestination::Remove(std::string_view path) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kRemove));
  return inner_->Remove(path);
}
Status HangingDestination::Probe() {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kProbe));
  return inner_->Probe();
}
Result<int> HangingDestination::CleanTemps(std::chrono::seconds max_age) {
  FLEETFS_RETURN_IF_ERROR(Gate(Request::kCleanTemps));
  return inner_->CleanTemps(max_age);
}

}  // namespace fleetfs::replica
