// Where replicas go: a store of named objects under '/'-separated paths, with
// atomic puts (a reader sees the whole object or none). `file://DIR` is the
// one built here: a directory that several hosts may share (a put writes a
// temporary file, syncs it, renames it into place and syncs the directory).
// The interface is what an S3-compatible store also offers: list one level,
// put, get as a stream, remove.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <functional>
#include <memory>
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
  // alike; an absent `dir` lists as empty.
  virtual Result<std::vector<std::string>> List(std::string_view dir) = 0;
  virtual Status Put(std::string_view path, std::string_view bytes) = 0;
  // Puts the contents of `fd` from offset 0 to its end.
  virtual Status PutFile(std::string_view path, int fd) = 0;
  // Streams the object to `sink` in pieces; NotFound when it is absent.
  using Sink = std::function<Status(std::string_view)>;
  virtual Status Get(std::string_view path, const Sink& sink) = 0;
  // The first `n` bytes (fewer when the object is shorter).
  virtual Result<std::string> GetHead(std::string_view path, std::size_t n) = 0;
  virtual Result<std::uint64_t> Size(std::string_view path) = 0;
  // Removes an object, or a directory and everything under it.
  virtual Status Remove(std::string_view path) = 0;
  // A write probe: OK when a put can land now.
  virtual Status Probe() = 0;
};

// Opens `url`: only file:///ABSOLUTE/DIR for now (made when absent).
Result<std::shared_ptr<Destination>> OpenDestination(std::string_view url);
// Checks `url`'s shape without touching anything (for configuration).
Status ValidateDestinationUrl(std::string_view url);

}  // namespace fleetfs::replica
