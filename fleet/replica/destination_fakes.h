// Hand-written Destinations for tests (a test-only library, never linked into
// the agent):
// - MemoryDestination: objects in a map; create-only honoured; counts its
//   requests by kind, as CountingDestination does for a real one.
// - FailingDestination: forwards to another, except the calls its faults
//   pick, which fail with a chosen Status (every call, the n-th call of a
//   kind, or only writes bigger than some size: a full disk, where a probe's
//   empty put still lands).
// - HangingDestination: forwards to another, except that while it hangs the
//   calls block until Release() (for the caller's time limits).
//
// Thread-safety: all are safe from any thread, like real destinations; each
// says what its mutex guards.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/replica/counting_destination.h"
#include "fleet/replica/destination.h"

namespace fleetfs::replica {

class MemoryDestination final : public Destination {
 public:
  // `get_piece` is the most bytes one Get hands its sink at a time, so tests
  // can make a sink see many pieces.
  explicit MemoryDestination(std::string url = "memory://test", std::size_t get_piece = 64 << 10);

  RequestCounts counts() const { return counter_.Snapshot(); }
  void ResetCounts() { counter_.Reset(); }
  // The object's bytes, or nullopt; not counted as a request.
  std::optional<std::string> Peek(std::string_view path) const;
  // Every object by path; not counted as a request.
  std::map<std::string, std::string> Objects() const;

  const std::string& url() const override { return url_; }
  Result<std::vector<std::string>> List(std::string_view dir) override;
  Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after) override;
  Status Put(std::string_view path, std::string_view bytes) override;
  Status PutFile(std::string_view path, int fd) override;
  Status Create(std::string_view path, std::string_view bytes) override;
  Status CreateFromFile(std::string_view path, int fd) override;
  Status Get(std::string_view path, const Sink& sink) override;
  Result<std::string> GetHead(std::string_view path, std::size_t n) override;
  Result<std::uint64_t> Size(std::string_view path) override;
  Status Remove(std::string_view path) override;
  Status Probe() override;
  Result<int> CleanTemps(std::chrono::seconds max_age) override;

 private:
  Result<std::vector<std::string>> ListLocked(std::string_view dir) const;
  // Stores `bytes` at `path`; with `create_only`, only if the name is free.
  Status Store(std::string_view path, std::string bytes, bool create_only);
  std::string Full(std::string_view path) const { return url_ + "/" + std::string(path); }

  const std::string url_;
  const std::size_t get_piece_;
  RequestCounter counter_;
  mutable std::mutex mu_;  // guards objects_
  // Directories are implicit: "a/b" puts "a" in List("").
  std::map<std::string, std::string, std::less<>> objects_;
};

// Which calls a FailingDestination fails. A fault counts the calls it
// matches and fails those numbered skip+1 to skip+times; a call that several
// faults fail gets the status of the first injected.
struct Fault {
  std::optional<Request> kind = std::nullopt;  // nullopt: calls of every kind
  Status status = Unavailable("injected failure");
  int skip = 0;    // matching calls let through first
  int times = -1;  // matching calls failed after those (-1: all)
  // When set, the fault matches only writes (puts, creates, probes) of more
  // than this many bytes. A probe writes none.
  std::optional<std::uint64_t> writes_over = std::nullopt;
  // When set, the fault matches only calls on a path (or a listed
  // directory) that starts with this; a probe or a clean of temps has none.
  std::optional<std::string> under = std::nullopt;
  // The write is done, and then its answer is lost: the caller sees the
  // status although the object landed (a timeout after the server wrote).
  bool after_landing = false;
};

class FailingDestination final : public Destination {
 public:
  explicit FailingDestination(
      std::shared_ptr<Destination> inner = std::make_shared<MemoryDestination>());

  void Inject(Fault fault);
  // Every call fails with `status`.
  void FailEvery(Status status) { Inject(Fault{.status = std::move(status)}); }
  // Every call of `kind` fails with `status`.
  void FailEvery(Request kind, Status status) {
    Inject(Fault{.kind = kind, .status = std::move(status)});
  }
  // The n-th call of `kind` from now (1 is the next one) fails, once.
  void FailNth(Request kind, int n, Status status) {
    Inject(Fault{.kind = kind, .status = std::move(status), .skip = n - 1, .times = 1});
  }
  // The n-th create of `kind` from now lands, and its answer is lost, once.
  void LoseAnswerOfNth(Request kind, int n, Status status) {
    Inject(Fault{.kind = kind, .status = std::move(status), .skip = n - 1, .times = 1,
                 .after_landing = true});
  }
  // A full disk: every write of more than `bytes` bytes fails.
  void FailWritesOver(std::uint64_t bytes, Status status) {
    Inject(Fault{.status = std::move(status), .writes_over = bytes});
  }
  // Drops every fault.
  void Heal();
  // Calls failed by a fault so far.
  int injected_failures() const;
  Destination& inner() { return *inner_; }

  const std::string& url() const override { return inner_->url(); }
  Result<std::vector<std::string>> List(std::string_view dir) override;
  Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after) override;
  Status Put(std::string_view path, std::string_view bytes) override;
  Status PutFile(std::string_view path, int fd) override;
  Status Create(std::string_view path, std::string_view bytes) override;
  Status CreateFromFile(std::string_view path, int fd) override;
  Status Get(std::string_view path, const Sink& sink) override;
  Result<std::string> GetHead(std::string_view path, std::size_t n) override;
  Result<std::uint64_t> Size(std::string_view path) override;
  Status Remove(std::string_view path) override;
  Status Probe() override;
  Result<int> CleanTemps(std::chrono::seconds max_age) override;

 private:
  struct Armed {
    Fault fault;
    int seen = 0;
  };
  // The status of the fault that fails this call, or OK. `write_bytes` is
  // set for writes only.
  // `landed`, when given, is set when the failure is one whose call must
  // reach the inner destination first (Fault::after_landing).
  Status Check(Request kind, std::optional<std::string_view> path,
               std::optional<std::uint64_t> write_bytes, bool* landed = nullptr);

  const std::shared_ptr<Destination> inner_;
  mutable std::mutex mu_;  // guards faults_ and failed_
  std::vector<Armed> faults_;
  int failed_ = 0;
};

class HangingDestination final : public Destination {
 public:
  // A held call that nobody releases gives up after `give_up` with
  // kDeadlineExceeded, so a test that forgets to release fails instead of
  // hanging its binary.
  explicit HangingDestination(
      std::shared_ptr<Destination> inner = std::make_shared<MemoryDestination>(),
      std::chrono::milliseconds give_up = std::chrono::seconds(60));
  // Like any destination, it must outlive its callers: a test releases the
  // held calls (or lets `give_up` pass) and joins them before it goes.

  // From now, calls of `kind` (nullopt: every kind) block until Release().
  void Hang(std::optional<Request> kind = std::nullopt);
  // Lets the held calls go on to the inner destination; later calls are not
  // held until the next Hang().
  void Release();
  // Calls blocked now.
  int held() const;
  // Waits until at least `n` calls are blocked; false after `limit`.
  bool WaitHeld(int n, std::chrono::milliseconds limit);
  Destination& inner() { return *inner_; }

  const std::string& url() const override { return inner_->url(); }
  Result<std::vector<std::string>> List(std::string_view dir) override;
  Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after) override;
  Status Put(std::string_view path, std::string_view bytes) override;
  Status PutFile(std::string_view path, int fd) override;
  Status Create(std::string_view path, std::string_view bytes) override;
  Status CreateFromFile(std::string_view path, int fd) override;
  Status Get(std::string_view path, const Sink& sink) override;
  Result<std::string> GetHead(std::string_view path, std::size_t n) override;
  Result<std::uint64_t> Size(std::string_view path) override;
  Status Remove(std::string_view path) override;
  Status Probe() override;
  Result<int> CleanTemps(std::chrono::seconds max_age) override;

 private:
  // Blocks while this kind of call is held; DeadlineExceeded after give_up_.
  Status Gate(Request kind);

  const std::shared_ptr<Destination> inner_;
  const std::chrono::milliseconds give_up_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool hanging_ = false;
  std::optional<Request> kind_;  // the held kind when hanging_; nullopt: all
  std::uint64_t releases_ = 0;   // a held call waits for this to move
  int held_ = 0;
};

}  // namespace fleetfs::replica
