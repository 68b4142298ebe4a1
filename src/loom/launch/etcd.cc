#include "loom/launch/etcd.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "loom/core/base64.h"
#include "loom/core/error.h"

namespace loom::launch {
namespace {
using json = nlohmann::json;

std::string b64(const std::string& s) {
  return base64_encode(s);
}
std::string unb64(const json& j) {
  std::string out;
  if (j.is_string()) base64_decode(j.get<std::string>(), out);
  return out;
}
int64_t num(const json& obj, const char* field) {  // int64s are strings; absent means 0
  if (!obj.is_object() || !obj.contains(field)) return 0;
  const json& v = obj[field];
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}
// A uint64 id as etcd writes it (a decimal string; absent or "0": none).
std::string id_of(const json& obj, const char* field) {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_string()) return "";
  const std::string id = obj[field].get<std::string>();
  return id == "0" ? "" : id;
}
EtcdKv kv_of(const json& j) {
  return {unb64(j.value("key", json())), unb64(j.value("value", json())), num(j, "create_revision"),
          num(j, "mod_revision"), num(j, "lease")};
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One POST of a JSON body; the response body goes to `sink` (return false to stop).
struct Post {
  CURL* h = nullptr;
  std::string body;
  std::string err = std::string(CURL_ERROR_SIZE, '\0');
  Post(const std::string& url, const std::string& payload, const EtcdTls& tls, double timeout_s)
      : body(payload) {
    curl_init_once();
    h = curl_easy_init();
    if (!h) throw Error("curl_easy_init failed");
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000));
    // A member that is down refuses at once; one cut off is given up on after 3 s, so the
    // next member is tried while the call's deadline still has room.
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(timeout_s, 3.0) * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err.data());
    if (!tls.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, tls.ca_file.c_str());
    if (!tls.cert_file.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, tls.cert_file.c_str());
    if (!tls.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, tls.key_file.c_str());
  }
  ~Post() { curl_easy_cleanup(h); }
  // Why the transfer failed with rc: curl's message for it.
  std::string why(CURLcode rc) const { return err[0] ? err.c_str() : curl_easy_strerror(rc); }
  Post(const Post&) = delete;
  Post& operator=(const Post&) = delete;
};

json put_request(const std::string& key, const std::string& value, int64_t lease) {
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  return put;
}

size_t append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}
}  // namespace

std::string etcd_prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: every key
}

std::vector<std::string> etcd_endpoint_list(const std::string& list) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

Etcd::Etcd(const std::string& endpoints, EtcdTls tls, double timeout_s, bool announce_moves)
    : tls_(std::move(tls)), timeout_s_(timeout_s), announce_moves_(announce_moves) {
  for (std::string e : etcd_endpoint_list(endpoints)) {
    while (!e.empty() && e.back() == '/') e.pop_back();
    if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0)
      throw UserError("etcd endpoint '" + e + "' is not http://HOST:PORT or https://...",
                      "e.g. http://10.0.0.1:2379, or several members: "
                      "http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379");
    endpoints_.push_back(std::move(e));
  }
}

std::string Etcd::endpoints() const {
  std::string all;
  for (const std::string& e : endpoints_) all += (all.empty() ? "" : ",") + e;
  return all;
}

// One call to one member: its answer, or why it could not serve the call.
struct Etcd::Answer {
  json body;
  std::string why;  // empty: served
};

Etcd::Answer Etcd::attempt(const std::string& endpoint, const std::string& path, const json& body,
                           double timeout_s) const {
  Post post(endpoint + path, body.dump(), tls_, timeout_s);
  std::string response;
  curl_easy_setopt(post.h, CURLOPT_WRITEFUNCTION, append);
  curl_easy_setopt(post.h, CURLOPT_WRITEDATA, &response);
  const CURLcode rc = curl_easy_perform(post.h);
  if (rc != CURLE_OK) return {json(), post.why(rc)};
  long status = 0;
  curl_easy_getinfo(post.h, CURLINFO_RESPONSE_CODE, &status);
  json j = json::parse(response, nullptr, /*allow_exceptions=*/false);
  if (status == 200 && !j.is_discarded() && !j.contains("error")) return {std::move(j), ""};
  const std::string message =
      j.is_object() && j.contains("message") ? j["message"].dump() : response.substr(0, 300);
  // 5xx: the member could not serve it — gRPC's Unavailable (503: no leader, a leader
  // change) or a deadline passed waiting for consensus (500 "context deadline exceeded" from
  // a member without a leader). Another member may serve it; a 4xx is the call's own error.
  if (status >= 500) return {json(), "answered HTTP " + std::to_string(status) + ": " + message};
  if (status == 404 && message.find("lease not found") != std::string::npos)
    throw EtcdLeaseGone("etcd at " + endpoint + ": " + path + ": " + message);
  throw PeerError(PeerError::Kind::kProtocol, "etcd at " + endpoint + ": " + path +
                                                  " answered HTTP " + std::to_string(status) +
                                                  ": " + message);
}

json Etcd::call(const std::string& path, const json& body) {
  const size_t n = endpoints_.size(), first = current_.load();
  std::vector<std::string> why(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n, before = (i + n - 1) % n;
    Answer a = attempt(endpoints_[i], path, body, timeout_s_);
    if (a.why.empty()) {
      if (k > 0) move_to(i, endpoints_[before] + ": " + why[before]);
      return std::move(a.body);
    }
    why[i] = std::move(a.why);
  }
  throw unavailable(path, why);
}

void Etcd::move_to(size_t next, const std::string& why) {
  if (current_.exchange(next) != next && announce_moves_)
    std::fprintf(stderr, "loom run: etcd: %s; now using %s\n", why.c_str(),
                 endpoints_[next].c_str());
}

EtcdUnavailable Etcd::unavailable(const std::string& path,
                                  const std::vector<std::string>& why) const {
  // Each member reports its own status without consensus: one that answers with no leader
  // is cut from the majority, and then the cluster has lost its quorum.
  std::vector<std::string> leaderless, silent;
  for (const std::string& e : endpoints_) {
    try {
      const Answer a =
          attempt(e, "/v3/maintenance/status", json::object(), std::min(timeout_s_, 1.0));
      if (!a.why.empty())
        silent.push_back(e);
      else if (id_of(a.body, "leader").empty())
        leaderless.push_back(e);
    } catch (const Error&) {
      silent.push_back(e);
    }
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& e : v) s += (s.empty() ? "" : ", ") + e;
    return s;
  };
  // In the order the call tried them (from the member in use on).
  std::string tried;
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (current_.load() + k) % endpoints_.size();
    tried += (tried.empty() ? "" : "; ") + endpoints_[i] + ": " + why[i];
  }
  if (!leaderless.empty()) {
    std::string what = "etcd has lost its quorum: " + list(leaderless) + " answer" +
                       (leaderless.size() > 1 ? "" : "s") + " without a leader";
    if (!silent.empty())
      what += ", " + list(silent) + (silent.size() > 1 ? " do" : " does") + " not answer";
    return EtcdUnavailable(what + " (more than half of etcd's members are down or cut off; " +
                               path + ": " + tried + ")",
                           true);
  }
  if (endpoints_.size() == 1)  // "etcd at URL: PATH failed: why"
    return EtcdUnavailable("etcd at " + endpoints_[0] + ": " + path + " failed: " + why[0], false);
  return EtcdUnavailable("etcd cannot be reached: none of its " +
                             std::to_string(endpoints_.size()) + " members serves " + path + " (" +
                             tried + ")",
                         false);
}

void Etcd::put(const std::string& key, const std::string& value, int64_t lease) {
  call("/v3/kv/put", put_request(key, value, lease));
}

std::optional<EtcdKv> Etcd::get(const std::string& key) {
  const json j = call("/v3/kv/range", {{"key", b64(key)}});
  if (!j.contains("kvs") || j["kvs"].empty()) return std::nullopt;
  return kv_of(j["kvs"][0]);
}

std::vector<EtcdKv> Etcd::get_prefix(const std::string& prefix, int64_t* revision) {
  const json j =
      call("/v3/kv/range", {{"key", b64(prefix)}, {"range_end", b64(etcd_prefix_end(prefix))}});
  if (revision) *revision = num(j.value("header", json::object()), "revision");
  std::vector<EtcdKv> out;
  for (const json& kv : j.value("kvs", json::array())) out.push_back(kv_of(kv));
  return out;
}

bool Etcd::create(const std::string& key, const std::string& value, int64_t lease) {
  const json put = put_request(key, value, lease);
  const json j = call(
      "/v3/kv/txn",
      {{"compare",
        {{{"target", "CREATE"}, {"key", b64(key)}, {"create_revision", "0"}, {"result", "EQUAL"}}}},
       {"success", {{{"request_put", put}}}}});
  return j.value("succeeded", false);
}

bool Etcd::compare_and_swap(const std::string& key, const std::string& expected,
                            const std::string& value) {
  const json j = call(
      "/v3/kv/txn",
      {{"compare",
        {{{"target", "VALUE"}, {"key", b64(key)}, {"value", b64(expected)}, {"result", "EQUAL"}}}},
       {"success", {{{"request_put", put_request(key, value, 0)}}}}});
  return j.value("succeeded", false);
}

int64_t Etcd::erase(const std::string& key) {
  return num(call("/v3/kv/deleterange", {{"key", b64(key)}}), "deleted");
}

int64_t Etcd::erase_prefix(const std::string& prefix) {
  return num(call("/v3/kv/deleterange",
                  {{"key", b64(prefix)}, {"range_end", b64(etcd_prefix_end(prefix))}}),
             "deleted");
}

int64_t Etcd::grant(int64_t ttl_s) {
  return num(call("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}), "ID");
}

int64_t Etcd::keep_alive(int64_t lease) {
  try {
    const json j = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
    return num(j.value("result", json::object()), "TTL");
  } catch (const EtcdLeaseGone&) {  // (etcd answers an expired lease with TTL 0 here, so far)
    return 0;
  }
}

Etcd::Status Etcd::status() {
  const json j = call("/v3/maintenance/status", json::object());
  return {id_of(j.value("header", json::object()), "member_id"), id_of(j, "leader")};
}

void Etcd::revoke(int64_t lease) {
  call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
}

std::vector<EtcdEvent> Etcd::watch_prefix(const std::string& prefix, int64_t from,
                                          double timeout_s) {
  // The gateway streams one JSON object per message: first {"result": {"created": true}},
  // then {"result": {"events": [...]}}. Stop at the first events, or at the deadline.
  struct Stream {
    std::string buf;
    std::vector<EtcdEvent> events;
  } s;
  const json body = {{"create_request",
                      {{"key", b64(prefix)},
                       {"range_end", b64(etcd_prefix_end(prefix))},
                       {"start_revision", std::to_string(from)}}}};
  const size_t at = current_.load();
  Post post(endpoints_[at] + "/v3/watch", body.dump(), tls_, timeout_s);
  auto on_data = +[](char* data, size_t size, size_t n, void* p) -> size_t {
    auto* st = static_cast<Stream*>(p);
    st->buf.append(data, size * n);
    // Messages are whole JSON objects, one per line.
    size_t nl;
    while ((nl = st->buf.find('\n')) != std::string::npos) {
      const json j = json::parse(st->buf.substr(0, nl), nullptr, false);
      st->buf.erase(0, nl + 1);
      if (j.is_discarded() || !j.contains("result")) continue;
      for (const json& e : j["result"].value("events", json::array()))
        st->events.push_back({e.value("type", "") == "DELETE", kv_of(e.value("kv", json()))});
    }
    return st->events.empty() ? size * n : 0;  // 0 ends the transfer
  };
  curl_easy_setopt(post.h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(post.h, CURLOPT_WRITEDATA, &s);
  const CURLcode rc = curl_easy_perform(post.h);
  if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR && rc != CURLE_OPERATION_TIMEDOUT) {
    const std::string why = post.why(rc);
    if (endpoints_.size() == 1)
      throw EtcdUnavailable("etcd at " + endpoints_[at] + ": /v3/watch failed: " + why, false);
    // The caller reads again after a watch (it may have missed nothing but a wait): the
    // read goes to the next member.
    move_to((at + 1) % endpoints_.size(), endpoints_[at] + ": /v3/watch: " + why);
  }
  return s.events;
}

}  // namespace loom::launch
