// Any bytes a local user sends to the admin port: the request parser, then
// the answer the agent would render for it, from a fake agent snapshot
// through the same report functions Agent::Serve calls.
//
// Properties: the result does not depend on how the bytes were split into
// reads; a request has a printable ASCII target whose path is its prefix; an
// error is 400, 413 or 431; no more than 8 KiB is ever read; the rendered
// answer is well formed and its Content-Length is its body's.
#include <cstdint>
#include <string>

#include "agent/http_request.h"
#include "agent/report.h"
#include "tests/fuzz/fuzz_check.h"

namespace fleetfs::agent {
namespace {

using Progress = HttpRequestParser::Progress;

struct ParseOutcome {
  Progress progress = Progress::kNeedMore;
  std::string method, target, path;
  int status = 0;
  std::size_t consumed = 0;
  bool operator==(const ParseOutcome&) const = default;
};

// Feeds `bytes` in reads of `piece` bytes, then ends the input.
ParseOutcome Parse(std::string_view bytes, std::size_t piece, bool finish) {
  HttpRequestParser p;
  for (std::size_t at = 0; at < bytes.size() && p.progress() == Progress::kNeedMore; at += piece) {
    p.Feed(bytes.substr(at, piece));
  }
  if (finish) p.Finish();
  ParseOutcome o;
  o.progress = p.progress();
  o.consumed = p.consumed();
  if (p.progress() == Progress::kRequest) {
    o.method = p.request().method;
    o.target = p.request().target;
    o.path = p.request().path;
  } else if (p.progress() == Progress::kError) {
    o.status = p.error().status;
  }
  return o;
}

AgentSnapshot FakeSnapshot() {
  AgentSnapshot s;
  s.owner = "host-a";
  s.store = "sqlite:///var/lib/fleetfs/control.db";
  s.mode = "tenant";
  s.backing = "/var/lib/fleetfs/volume";
  s.mountpoint = "/mnt/fleet";
  s.admin = "127.0.0.1:7878";
  s.phase = "serving";
  s.ttl = Millis(30000);
  s.pid = 42;
  RangeSnapshot r;
  r.status.range = *lease::SlotRange::Parse("0-8191");
  r.status.serving = true;
  r.status.epoch = lease::Epoch(3);
  r.status.lease_left = Millis(12000);
  r.open_files = 2;
  s.ranges.push_back(r);
  s.vfs = VfsSnapshot{};
  return s;
}

// As Agent::Serve routes (agent/agent.cc), on a fixed snapshot.
HttpResponse Serve(const std::string& method, const std::string& path) {
  static const AgentSnapshot snapshot = FakeSnapshot();
  if (method != "GET" && method != "HEAD") return {405, "text/plain", "only GET is served\n"};
  if (path == "/health") return Health(snapshot);
  if (path == "/status") return {200, "application/json", StatusJson(snapshot).dump(2) + "\n"};
  if (path == "/metrics") return {200, "text/plain; version=0.0.4", MetricsText(snapshot)};
  return {404, "text/plain", "not found\n"};
}

bool PrintableAscii(std::string_view s) {
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

}  // namespace
}  // namespace fleetfs::agent

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fleetfs::agent;  // NOLINT: a fuzz entry point outside the namespace
  std::string_view bytes = fleetfs::fuzz::AsText(data, size);

  const ParseOutcome whole = Parse(bytes, bytes.size() + 1, false);
  // The same bytes in other reads give the same outcome.
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
    FUZZ_CHECK(Parse(bytes, piece, false) == whole, "the outcome depends on the reads");
  }
  FUZZ_CHECK(whole.consumed <= HttpRequestParser::kMaxHeadBytes, "read past the 8 KiB head");

  const ParseOutcome ended = Parse(bytes, bytes.size() + 1, true);
  switch (whole.progress) {
    case HttpRequestParser::Progress::kNeedMore:
      FUZZ_CHECK(size < HttpRequestParser::kMaxHeadBytes, "more than 8 KiB and no answer");
      FUZZ_CHECK(ended.progress == HttpRequestParser::Progress::kError && ended.status == 400,
                 "a request cut short is not 400 at its end");
      return 0;
    case HttpRequestParser::Progress::kError:
      FUZZ_CHECK(whole.status == 400 || whole.status == 413 || whole.status == 431,
                 "an error that is not 400, 413 or 431");
      FUZZ_CHECK(ended == whole, "the end of input changed a result");
      break;
    case HttpRequestParser::Progress::kRequest:
      FUZZ_CHECK(ended == whole, "the end of input changed a result");
      FUZZ_CHECK(!whole.method.empty(), "a request without a method");
      FUZZ_CHECK(!whole.target.empty() && PrintableAscii(whole.target),
                 "a target that is not printable ASCII");
      FUZZ_CHECK(whole.target.rfind(whole.path, 0) == 0, "the path is not the target's prefix");
      FUZZ_CHECK(whole.path.find('?') == std::string::npos, "a query left in the path");
      break;
  }

  // The answer as it would be sent.
  HttpResponse response;
  bool head = false;
  if (whole.progress == HttpRequestParser::Progress::kRequest) {
    response = Serve(whole.method, whole.path);
    head = whole.method == "HEAD";
  } else {
    response = HttpResponse{whole.status, "text/plain; charset=utf-8", "refused\n"};
  }
  const std::string sent = RenderResponse(response, head);
  const std::size_t end_of_head = sent.find("\r\n\r\n");
  FUZZ_CHECK(sent.rfind("HTTP/1.1 " + std::to_string(response.status) + " ", 0) == 0,
             "a status line that is not the status");
  FUZZ_CHECK(end_of_head != std::string::npos, "an answer without the end of its head");
  FUZZ_CHECK(
      sent.find("Content-Length: " + std::to_string(response.body.size()) + "\r\n") < end_of_head,
      "a Content-Length that is not the body's");
  FUZZ_CHECK(sent.size() - end_of_head - 4 == (head ? 0 : response.body.size()),
             "a body that is not the one counted");
  return 0;
}
