// FakeEtcd: an in-memory etcd behind the EtcdTransport interface, answering
// the v3 JSON gateway calls the etcd store makes, in the gateway's own shapes
// (base64 keys and values, numbers as strings, zero and false fields left
// out). Its leases never run out by themselves: a test ends one with
// Expire(), standing for etcd's own clock. A hook runs before each call, so a
// test can slip a competing write in between a store's read and its txn.
//
// Test-only. Thread-safety: one mutex around everything; the hook runs
// without it and may call the helpers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lease/etcd_client.h"

namespace fleetfs::lease::testing {

class FakeEtcd final : public EtcdTransport {
 public:
  using Json = nlohmann::json;

  struct Value {
    std::string value;
    std::int64_t create_revision = 0;
    std::int64_t mod_revision = 0;
    std::int64_t version = 0;
    std::int64_t lease = 0;
  };

  // One call as the store sent it: its path and the request's JSON.
  struct Seen {
    std::string path;
    Json request;
  };

  // Runs before each call with its path; it may change the data.
  std::function<void(const std::string& path)> before;

  Result<EtcdHttpAnswer> Post(const EtcdHttpCall& call) override {
    if (before) before(call.path);
    std::lock_guard lock(mu_);
    const Json request = Json::parse(call.body);
    seen_.push_back({call.path, request});
    if (call.path == "/v3/kv/range") return Ok(RangeAnswer(request));
    if (call.path == "/v3/kv/txn") return TxnAnswer(request);
    if (call.path == "/v3/lease/grant") {
      const std::int64_t id = next_lease_++;
      const std::int64_t ttl = std::stoll(request["TTL"].get<std::string>());
      leases_[id] = ttl;
      return Ok({{"header", Header()}, {"ID", std::to_string(id)}, {"TTL", std::to_string(ttl)}});
    }
    const std::int64_t id = std::stoll(request["ID"].get<std::string>());
    const auto lease = leases_.find(id);
    if (call.path == "/v3/lease/keepalive") {
      Json result = {{"header", Header()}, {"ID", std::to_string(id)}};
      if (lease != leases_.end()) result["TTL"] = std::to_string(lease->second);
      return Ok({{"result", result}});
    }
    if (call.path == "/v3/lease/timetolive") {
      Json answer = {{"header", Header()}, {"ID", std::to_string(id)}};
      answer["TTL"] = lease != leases_.end() ? std::to_string(lease->second) : "-1";
      return Ok(answer);
    }
    if (call.path == "/v3/lease/revoke") {
      if (lease == leases_.end()) return Error(404, 5, "etcdserver: requested lease not found");
      EndLeaseLocked(id);
      return Ok({{"header", Header()}});
    }
    return Error(404, 5, "Not Found");
  }

  // The data as a test sets or checks it.
  void Put(const std::string& key, const std::string& value, std::int64_t lease = 0) {
    std::lock_guard lock(mu_);
    PutLocked(key, value, lease, ++revision_);
  }
  std::int64_t GrantLease(std::int64_t ttl_s) {
    std::lock_guard lock(mu_);
    leases_[next_lease_] = ttl_s;
    return next_lease_++;
  }
  // etcd's clock ran out for this lease: it and its keys are gone.
  void Expire(std::int64_t lease) {
    std::lock_guard lock(mu_);
    EndLeaseLocked(lease);
  }
  std::optional<Value> Get(const std::string& key) const {
    std::lock_guard lock(mu_);
    const auto it = data_.find(key);
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }
  bool LeaseExists(std::int64_t lease) const {
    std::lock_guard lock(mu_);
    return leases_.count(lease) > 0;
  }
  std::vector<Seen> seen() const {
    std::lock_guard lock(mu_);
    return seen_;
  }
  void ClearSeen() {
    std::lock_guard lock(mu_);
    seen_.clear();
  }

 private:
  static Result<EtcdHttpAnswer> Ok(const Json& answer) { return EtcdHttpAnswer{200, answer.dump()}; }
  static Result<EtcdHttpAnswer> Error(long status, int code, const std::string& message) {
    return EtcdHttpAnswer{status,
                          Json{{"error", message}, {"message", message}, {"code", code}}.dump()};
  }
  Json Header() const { return {{"cluster_id", "1"}, {"revision", std::to_string(revision_)}}; }
  static std::string Decode(const Json& text) { return *Base64Decode(text.get<std::string>()); }

  void PutLocked(const std::string& key, const std::string& value, std::int64_t lease,
                 std::int64_t revision) {
    Value& v = data_[key];
    if (v.create_revision == 0) v.create_revision = revision;
    v.mod_revision = revision;
    ++v.version;
    v.value = value;
    v.lease = lease;
  }
  void EndLeaseLocked(std::int64_t lease) {
    leases_.erase(lease);
    bool changed = false;
    for (auto it = data_.begin(); it != data_.end();) {
      if (it->second.lease == lease) {
        it = data_.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
    if (changed) ++revision_;
  }

  Json RangeAnswer(const Json& request) const {
    const std::string key = Decode(request["key"]);
    const std::string end = request.contains("range_end") ? Decode(request["range_end"]) : "";
    Json kvs = Json::array();
    for (const auto& [k, v] : data_) {
      const bool in = end.empty() ? k == key : (k >= key && k < end);
      if (!in) continue;
      Json item = {{"key", Base64Encode(k)},
                   {"create_revision", std::to_string(v.create_revision)},
                   {"mod_revision", std::to_string(v.mod_revision)},
                   {"version", std::to_string(v.version)}};
      if (!v.value.empty()) item["value"] = Base64Encode(v.value);
      if (v.lease != 0) item["lease"] = std::to_string(v.lease);
      kvs.push_back(item);
    }
    Json answer = {{"header", Header()}};
    if (!kvs.empty()) {
      answer["kvs"] = kvs;
      answer["count"] = std::to_string(kvs.size());
    }
    return answer;
  }

  Result<EtcdHttpAnswer> TxnAnswer(const Json& request) {
    bool holds = true;
    for (const Json& c : request.value("compare", Json::array())) {
      const auto it = data_.find(Decode(c["key"]));
      const Value v = it == data_.end() ? Value{} : it->second;
      const std::string target = c["target"];
      std::int64_t have = v.mod_revision;
      std::string field = "mod_revision";
      if (target == "CREATE") have = v.create_revision, field = "create_revision";
      if (target == "VERSION") have = v.version, field = "version";
      const std::int64_t want = c.contains(field) ? std::stoll(c[field].get<std::string>()) : 0;
      holds = holds && have == want;
    }
    Json answer = {{"header", Header()}};
    if (!holds) return Ok(answer);  // no "succeeded": false is left out
    std::vector<std::string> keys;
    for (const Json& op : request.value("success", Json::array())) {
      const Json& body = op.contains("request_put") ? op["request_put"] : op["request_delete_range"];
      const std::string key = Decode(body["key"]);
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        return Error(400, 3, "etcdserver: duplicate key given in txn request");
      }
      keys.push_back(key);
      if (op.contains("request_put") && body.contains("lease") &&
          leases_.count(std::stoll(body["lease"].get<std::string>())) == 0) {
        return Error(404, 5, "etcdserver: requested lease not found");
      }
    }
    const std::int64_t revision = ++revision_;  // one txn is one revision
    for (const Json& op : request.value("success", Json::array())) {
      if (op.contains("request_put")) {
        const Json& put = op["request_put"];
        PutLocked(Decode(put["key"]), put.contains("value") ? Decode(put["value"]) : "",
                  put.contains("lease") ? std::stoll(put["lease"].get<std::string>()) : 0,
                  revision);
      } else {
        data_.erase(Decode(op["request_delete_range"]["key"]));
      }
    }
    answer = {{"header", Header()}, {"succeeded", true}};
    return Ok(answer);
  }

  mutable std::mutex mu_;
  std::map<std::string, Value> data_;
  std::map<std::int64_t, std::int64_t> leases_;  // id -> TTL in seconds
  std::int64_t revision_ = 1;
  std::int64_t next_lease_ = 7000;
  std::vector<Seen> seen_;
};

}  // namespace fleetfs::lease::testing
