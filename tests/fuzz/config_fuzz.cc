// The agent's configuration as `fleetfs mount` resolves it: a TOML file and
// the flags that win over it (ResolveConfig), then the status document and
// metrics an accepted configuration is shown in.
//
// Input: the file's bytes, optionally followed by a NUL byte and flag values,
// one "key=value" a line (owner=host-b), as a user would pass them. The
// backing and mount directories default to two empty directories made for
// the run, so the checks after them are reached.
//
// Properties: nothing throws; a refused configuration says why; an accepted
// one holds values inside their rules (ttl, ranges, owner, admin on loopback,
// intervals, S3 settings only with an s3:// replica), and its status JSON serializes (a value that cannot be
// serialized would abort the agent at its first /status).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "agent/config.h"
#include "agent/report.h"
#include "lease/lease_ttl.h"
#include "lease/store_url.h"
#include "tests/fuzz/fuzz_check.h"

namespace fleetfs::agent {
namespace {

struct Dirs {
  std::string root, backing, mount, file;
};

Dirs* dirs = nullptr;  // made once by LLVMFuzzerInitialize, removed at exit

void SetFlag(ConfigInput& in, std::string_view key, std::string_view value) {
  std::pair<const char*, std::optional<std::string>*> keys[] = {
      {"backing", &in.backing},
      {"mount", &in.mountpoint},
      {"mode", &in.mode},
      {"owner", &in.owner},
      {"ranges", &in.ranges},
      {"store", &in.store},
      {"ttl", &in.ttl},
      {"admin", &in.admin},
      {"shutdown_grace", &in.shutdown_grace},
      {"replica", &in.replica},
      {"sync_interval", &in.sync_interval},
      {"snapshot_interval", &in.snapshot_interval},
      {"retention", &in.retention},
      {"replica_endpoint", &in.replica_endpoint},
      {"replica_region", &in.replica_region},
      {"replica_path_style", &in.replica_path_style},
      {"transport", &in.transport}};
  for (auto& [name, slot] : keys) {
    if (key == name) *slot = std::string(value);
  }
  if (key == "no_create") in.no_create = value == "true";
}

void CheckAccepted(const AgentConfig& c) {
  FUZZ_CHECK(lease::CheckTtl(c.ttl).ok(), "an accepted ttl out of bounds");
  FUZZ_CHECK(lease::CheckConfiguredRanges(c.ranges).ok(), "accepted ranges that overlap");
  FUZZ_CHECK(lease::OwnerId::Make(c.owner.str()).ok(), "an accepted owner that is not valid");
  FUZZ_CHECK(lease::ParseStoreUrl(c.store).ok(), "an accepted store URL that does not parse");
  if (c.admin) {
    auto again = ParseAdminEndpoint(c.admin->ToString());
    FUZZ_CHECK(again.ok() && again->host == c.admin->host && again->port == c.admin->port,
               "an accepted admin endpoint that does not parse back");
    FUZZ_CHECK(c.admin->port >= 1 && c.admin->port <= 65535, "an admin port out of range");
  }
  FUZZ_CHECK(c.shutdown_grace >= Millis(0) && c.shutdown_grace <= Millis(600000),
             "a shutdown grace out of bounds");
  FUZZ_CHECK(c.sync_interval >= Millis(10) && c.sync_interval <= Millis(600000),
             "a sync interval out of bounds");
  FUZZ_CHECK(c.snapshot_interval >= Millis(1000), "a snapshot interval under 1s");
  FUZZ_CHECK(c.retention >= Millis(60000), "a retention under 60s");
  FUZZ_CHECK(!c.backing.empty() && c.backing[0] == '/', "a backing path that is not absolute");
  FUZZ_CHECK(CheckS3SettingsApply(c.replica, c.replica_s3).ok(),
             "S3 settings accepted for a replica that is not s3://");
  if (!c.replica_s3.endpoint.empty()) {
    auto again = ParseReplicaEndpoint(c.replica_s3.endpoint);
    FUZZ_CHECK(again.ok() && *again == c.replica_s3.endpoint,
               "an accepted replica endpoint that does not parse back as itself");
  }
  FUZZ_CHECK(CheckReplicaRegion(c.replica_s3.region).ok(), "an accepted region that is not one");
  auto transport = ParseTransport(TransportValue(c.transport));
  FUZZ_CHECK(transport.ok() && *transport == c.transport,
             "an accepted transport that does not read back as itself");

  // What /status, /metrics and status.json show of it.
  AgentSnapshot s;
  s.owner = c.owner.str();
  s.store = c.store;
  s.mode = std::string(ModeName(c.mode));
  s.backing = c.backing;
  s.mountpoint = c.mountpoint;
  s.admin = c.admin ? c.admin->ToString() : "off";
  s.replica = c.replica;
  s.phase = "serving";
  s.ttl = c.ttl;
  for (const lease::SlotRange& r : c.ranges) {
    RangeSnapshot range;
    range.status.range = r;
    s.ranges.push_back(range);
  }
  try {
    std::string json = StatusJson(s).dump(2);
    FUZZ_CHECK(!json.empty(), "an empty status document");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "status JSON: %s\n", e.what());
    FUZZ_CHECK(false, "an accepted configuration's status JSON does not serialize");
  }
  FUZZ_CHECK(!MetricsText(s).empty(), "empty metrics");
  FUZZ_CHECK(!RangesText(s).empty(), "an empty ranges file");
}

}  // namespace
}  // namespace fleetfs::agent

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using fleetfs::agent::dirs;
  char root[] = "/tmp/fleetfs-config-fuzz-XXXXXX";
  if (::mkdtemp(root) == nullptr) std::abort();
  dirs = new fleetfs::agent::Dirs{root, std::string(root) + "/backing", std::string(root) + "/mnt",
                                  std::string(root) + "/agent.toml"};
  std::filesystem::create_directory(dirs->backing);
  std::filesystem::create_directory(dirs->mount);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(dirs->root, ec);
    delete dirs;
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fleetfs::agent;  // NOLINT: a fuzz entry point outside the namespace
  std::string_view input = fleetfs::fuzz::AsText(data, size);
  const std::size_t nul = input.find('\0');
  std::string_view file = input.substr(0, nul);

  ConfigInput in;
  in.config_file = dirs->file;
  in.backing = dirs->backing;
  in.mountpoint = dirs->mount;
  if (nul != std::string_view::npos) {
    std::string_view flags = input.substr(nul + 1);
    while (!flags.empty()) {
      std::string_view line = flags.substr(0, flags.find('\n'));
      flags.remove_prefix(std::min(flags.size(), line.size() + 1));
      const std::size_t eq = line.find('=');
      if (eq != std::string_view::npos) SetFlag(in, line.substr(0, eq), line.substr(eq + 1));
    }
  }

  const int fd = ::open(dirs->file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot write the config file");
  FUZZ_CHECK(::write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size()),
             "cannot write the config file");
  ::close(fd);

  auto config = ResolveConfig(in);
  if (!config.ok()) {
    FUZZ_CHECK(!config.status().message().empty(), "a refusal that does not say why");
    return 0;
  }
  CheckAccepted(*config);
  return 0;
}
