// Where replicas go: a store of named objects under '/'-separated paths, with
// atomic writes (a reader sees the whole object or none). `file://DIR` is the
// one built here: a directory that several hosts may share, where a write
// goes to a temporary file (an O_TMPFILE where the file system has them),
// is synced, renamed (put) or linked (create) into place, and the directory
// synced. The interface is
// what an S3-compatible store also offers: list one level (optionally after a
// name, S3's start-after), put, create only if absent (S3's
// `If-None-Match: *`), get as a stream, remove.
//
// Two kinds of write:
// - Put/PutFile replace whatever has the name (last writer wins);
// - Create/CreateFromFile write only if the name is free, atomically: of
//   several writers racing for one name exactly one succeeds and the others
//   get kAlreadyExists. The create-only replica log (DESIGN 5) stands on it.
//
// Replica objects are no more readable than the tenant files they hold: the
// file:// destination makes objects 0600 and directories 0700, whatever the
// umask.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/status.h"

namespace fleetfs::replica {

// How the file destination's temporary files begin: a put in progress, or
// one a crash left behind. Listings never name them.
inline constexpr std::string_view kDestinationTempPrefix = ".tmp-";

class Destination {
 public:
  virtual ~Destination() = default;
  // The URL it was opened from, for messages.
  virtual const std::string& url() const = 0;
  // Names directly under `dir` ("" is the top), objects and sub-directories
  // alike, in no particular order; an absent `dir` lists as empty.
  virtual Result<std::vector<std::string>> List(std::string_view dir) = 0;
  // The names of List(dir) that sort after `after` (byte order, as S3 lists),
  // sorted. "" lists everything. This default lists and filters; a store that
  // can start a listing after a name (S3's start-after) overrides it.
  virtual Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after);

  // Writes the object, replacing any object of that name.
  virtual Status Put(std::string_view path, std::string_view bytes) = 0;
  // Puts the contents of `fd` from offset 0 to its end.
  virtual Status PutFile(std::string_view path, int fd) = 0;

  // Writes the object only if no object has that name: it appears whole or
  // not at all, and an existing object is never touched. A taken name gives
  // kAlreadyExists with a message naming the path; the caller reads that
  // object (its header says who took the name). A failure of any other code
  // may leave the object written (the write landed but its sync did not), so
  // a retry that finds kAlreadyExists reads the object before deciding.
  // `path` is relative ('/'-separated, no "", "." or ".." parts, no part
  // starting ".tmp", which is the destination's own).
  virtual Status Create(std::string_view path, std::string_view bytes) = 0;
  // Create with the contents of `fd` from offset 0 to its end.
  virtual Status CreateFromFile(std::string_view path, int fd) = 0;

  // Streams the object to `sink` in pieces; NotFound when it is absent.
  using Sink = std::function<Status(std::string_view)>;
  virtual Status Get(std::string_view path, const Sink& sink) = 0;
  // The first `n` bytes (fewer when the object is shorter).
  virtual Result<std::string> GetHead(std::string_view path, std::size_t n) = 0;
  virtual Result<std::uint64_t> Size(std::string_view path) = 0;
  // Removes an object, or a directory and everything under it.
  virtual Status Remove(std::string_view path) = 0;
  // Removes one object (never a directory): where a store must list to find
  // what is under a name (S3), this saves the listing. The default removes.
  virtual Status RemoveObject(std::string_view path) { return Remove(path); }
  // A write probe: OK when a put can land now.
  virtual Status Probe() = 0;

  // Removes what crashed writers left behind (a writer's temporary files)
  // when it was last touched more than `max_age` ago, and returns how many.
  // `max_age` must exceed the longest write (and, for a directory shared by
  // hosts, their clock skew): a live writer's temporary file removed under
  // it makes that write fail. The default has nothing to clean.
  virtual Result<int> CleanTemps(std::chrono::seconds max_age);
};

// Checks that `path` names an object a Create may write (see Create).
Status ValidateObjectPath(std::string_view path);

// Where an s3:// destination's requests go: the config keys (and flags)
// replica_endpoint, replica_region and replica_path_style. Credentials are not
// here: they are found the way AWS tools find them, when the destination opens.
struct S3Settings {
  std::string endpoint;            // "" = AWS's endpoint for the region
  std::string region;              // "" = AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
  std::optional<bool> path_style;  // unset = on for a custom endpoint, off for AWS
};

struct DestinationOptions {
  // file://: stage writes in named temporary files even where the file system
  // offers O_TMPFILE (files without a name); for tests of that path.
  bool named_temps_only = false;
  S3Settings s3;  // s3:// only
  // s3://: the longest wait between two attempts of one request when the
  // first got no answer (0: the client's own cap, 5 s; throttling answers
  // always get the full backoff). The agent passes its sync interval: a request
  // retried through an outage tries again within an interval of the store's
  // return, so what waited ships within two intervals (issue 12), not after
  // a backoff several intervals long.
  std::chrono::milliseconds retry_wait_cap{0};
};

// Opens `url`: file:///ABSOLUTE/DIR (made, 0700, when absent) or
// s3://BUCKET[/PREFIX] (fleet/replica/s3_destination.h: its endpoint and
// region from options.s3, credentials found as AWS tools find them).
Result<std::shared_ptr<Destination>> OpenDestination(std::string_view url,
                                                     const DestinationOptions& options = {});
// Checks `url`'s shape without touching anything (for configuration).
Status ValidateDestinationUrl(std::string_view url);

}  // namespace fleetfs::replica
