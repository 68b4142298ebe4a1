// A client for etcd's v3 API through its JSON gateway (etcd 3.4: POST /v3/kv/range, ...),
// over libcurl — what the multi-machine rendezvous (`loom run --rdzv etcd://...`, issue 13)
// stands on. Keys and values are bytes (base64 on the wire); int64s come back as strings;
// omitted fields mean their defaults (an empty range has no "kvs"). Every call has a
// deadline; a server that cannot be reached or answers with an error raises PeerError
// naming the endpoint, the call and etcd's message.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::launch {

struct EtcdTls {  // https endpoints: the CA to trust, and a client certificate if etcd asks
  std::string ca_file, cert_file, key_file;
};

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

struct EtcdEvent {
  bool deleted = false;  // else a put
  EtcdKv kv;
};

class Etcd {
 public:
  // endpoint: http://host:port or https://host:port.
  explicit Etcd(std::string endpoint, EtcdTls tls = {}, double timeout_s = 10);
  const std::string& endpoint() const { return endpoint_; }

  void put(const std::string& key, const std::string& value, int64_t lease = 0);
  std::optional<EtcdKv> get(const std::string& key);
  // Every key starting with prefix, in key order; *revision gets the store's revision.
  std::vector<EtcdKv> get_prefix(const std::string& prefix, int64_t* revision = nullptr);
  // Creates key unless it exists (a transaction on its create revision): true if created.
  bool create(const std::string& key, const std::string& value, int64_t lease = 0);
  // Replaces key's value if it is `expected`: true if replaced.
  bool compare_and_swap(const std::string& key, const std::string& expected,
                        const std::string& value);
  // Number of keys deleted.
  int64_t erase(const std::string& key);
  int64_t erase_prefix(const std::string& prefix);

  // A lease of ttl_s seconds: keys put with it vanish when it expires or is revoked.
  int64_t grant(int64_t ttl_s);
  // Refreshes the lease; returns its remaining TTL (0 or less: it had expired).
  int64_t keep_alive(int64_t lease);
  void revoke(int64_t lease);

  // Changes under prefix from revision `from` on (get_prefix's revision + 1 for changes
  // after a read): returns as soon as there are some, or empty after timeout_s.
  std::vector<EtcdEvent> watch_prefix(const std::string& prefix, int64_t from, double timeout_s);

 private:
  nlohmann::json call(const std::string& path, const nlohmann::json& body);
  std::string endpoint_;
  EtcdTls tls_;
  double timeout_s_;
};

// The end of etcd's range for every key starting with prefix (its last byte + 1).
std::string etcd_prefix_end(const std::string& prefix);

}  // namespace loom::launch
