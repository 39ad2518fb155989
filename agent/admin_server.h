// AdminServer: the agent's HTTP endpoint on loopback (/health, /status,
// /metrics), served on the agent's libuv loop. One request per connection;
// requests are parsed with http-parser, answers come from a handler.
//
// Thread-safety: lives on the loop thread; every method runs there.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "agent/config.h"
#include "fleet/status.h"

namespace fleetfs::agent {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class AdminServer {
 public:
  using Handler = std::function<HttpResponse(const std::string& method, const std::string& path)>;

  // Listens on `endpoint`; fails naming the address when it cannot bind.
  static Result<std::unique_ptr<AdminServer>> Start(uv_loop_t* loop, const Endpoint& endpoint,
                                                    Handler handler);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Stops listening and drops open connections; the loop frees them.
  void Close();

  struct Connection;

 private:
  AdminServer(uv_loop_t* loop, Handler handler) : loop_(loop), handler_(std::move(handler)) {}
  static void OnConnection(uv_stream_t* server, int status);
  void Drop(Connection* c);

  uv_loop_t* loop_;
  Handler handler_;
  uv_tcp_t* listener_ = nullptr;  // freed by its close callback
  std::unordered_set<Connection*> connections_;
};

}  // namespace fleetfs::agent
