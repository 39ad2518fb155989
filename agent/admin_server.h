// AdminServer: the agent's HTTP endpoint on loopback (/health, /status,
// /metrics), served on the agent's libuv loop. One request per connection,
// read by HttpRequestParser (agent/http_request.h); answers come from a
// handler.
//
// Any local user can connect, so nothing a client does may hold the server:
// - a connection has `request_time` from its accept to send a whole request
//   head (8 KiB at most, no body), `write_time` to take the answer, then
//   `linger_time` while the server reads and drops what the client still
//   sends (so a client that sent too much gets its answer, not a reset);
// - at `max_connections`, a new connection closes the oldest one that is
//   not being answered: idle connections cannot keep /health out;
// - malformed requests get 400, a body 413, an oversized head 431, and the
//   connection is closed. No request blocks the loop.
//
// Thread-safety: lives on the loop thread; every method runs there.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "agent/config.h"
#include "agent/http_request.h"
#include "fleet/clock.h"
#include "fleet/status.h"

namespace fleetfs::agent {

struct AdminLimits {
  std::size_t max_connections = 128;
  Millis request_time{5000};
  Millis write_time{5000};
  Millis linger_time{2000};
};

// Counted since the server started, for operators and tests.
struct AdminStats {
  std::uint64_t accepted = 0;
  std::uint64_t evicted = 0;    // closed at the cap to admit a newer connection
  std::uint64_t timed_out = 0;  // closed past their request, write or linger time
  std::uint64_t refused = 0;    // answered 400, 413 or 431
};

class AdminServer {
 public:
  using Handler = std::function<HttpResponse(const std::string& method, const std::string& path)>;

  // Listens on `endpoint`; fails naming the address when it cannot bind.
  static Result<std::unique_ptr<AdminServer>> Start(uv_loop_t* loop, const Endpoint& endpoint,
                                                    Handler handler, AdminLimits limits = {});
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Stops listening and drops open connections; the loop frees them.
  void Close();

  const AdminStats& stats() const { return stats_; }

  struct Connection;

 private:
  AdminServer(uv_loop_t* loop, Handler handler, AdminLimits limits)
      : loop_(loop), handler_(std::move(handler)), limits_(limits) {}
  static void OnConnection(uv_stream_t* server, int status);
  static void OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  void Admit(Connection* c);
  void Answer(Connection* c, const HttpResponse& response, bool head);
  void Sweep();
  void Drop(Connection* c);

  uv_loop_t* loop_;
  Handler handler_;
  AdminLimits limits_;
  uv_tcp_t* listener_ = nullptr;  // freed by its close callback
  uv_timer_t* sweep_ = nullptr;   // closes connections past their time; freed by its close callback
  std::unordered_set<Connection*> connections_;
  std::uint64_t next_sequence_ = 0;  // accept order, to find the oldest
  AdminStats stats_;
};

}  // namespace fleetfs::agent
