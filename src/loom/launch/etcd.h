// A client for etcd's v3 API through its JSON gateway (etcd 3.4: POST /v3/kv/range, ...),
// over libcurl — what the multi-machine rendezvous (`loom run --rdzv etcd://...`, issue 13)
// stands on. Keys and values are bytes (base64 on the wire); int64s come back as strings;
// omitted fields mean their defaults (an empty range has no "kvs"). Every call has a
// deadline; a server that answers with an error raises PeerError naming the endpoint, the
// call and etcd's message.
//
// An etcd cluster is given as its members' endpoints, comma-separated. Calls go to one of
// them; when it cannot be reached, or answers "unavailable" (HTTP 503: no leader, a request
// timed out in an election), the call moves to the next and the client says so on stderr.
// When none can serve it, EtcdUnavailable says what each did — and, when the members that
// answer have no leader, that etcd has lost its quorum.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.h"

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

// No endpoint could serve a call. quorum_lost: a member answered, but without a leader (a
// majority of the cluster is down or cut off); else no member answered at all.
class EtcdUnavailable : public PeerError {
 public:
  EtcdUnavailable(const std::string& what, bool quorum_lost)
      : PeerError(Kind::kClosed, what), quorum_lost_(quorum_lost) {}
  bool quorum_lost() const { return quorum_lost_; }

 private:
  bool quorum_lost_;
};

// A call made with a lease etcd no longer has (it expired while this machine could not reach
// etcd): the caller grants a new lease and repeats the call.
class EtcdLeaseGone : public PeerError {
 public:
  explicit EtcdLeaseGone(const std::string& what) : PeerError(Kind::kClosed, what) {}
};

class Etcd {
 public:
  // endpoints: http://host:port or https://host:port, or several (a cluster's members)
  // separated by commas. announce_moves: say on stderr when calls move to another member.
  explicit Etcd(const std::string& endpoints, EtcdTls tls = {}, double timeout_s = 10,
                bool announce_moves = true);
  // The member calls go to now.
  const std::string& endpoint() const { return endpoints_[current_.load()]; }
  // Every member given, comma-separated (as the constructor takes them).
  std::string endpoints() const;

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
  // Refreshes the lease; returns its remaining TTL (0 or less: it had expired, or etcd no
  // longer knows it).
  int64_t keep_alive(int64_t lease);
  void revoke(int64_t lease);

  // The member calls go to now, as it sees itself (no consensus needed): its id and its
  // leader's ("" when it has none).
  struct Status {
    std::string member_id, leader;
  };
  Status status();

  // Changes under prefix from revision `from` on (get_prefix's revision + 1 for changes
  // after a read): returns as soon as there are some, or empty after timeout_s.
  std::vector<EtcdEvent> watch_prefix(const std::string& prefix, int64_t from, double timeout_s);

 private:
  struct Answer;
  Answer attempt(const std::string& endpoint, const std::string& path, const nlohmann::json& body,
                 double timeout_s) const;
  nlohmann::json call(const std::string& path, const nlohmann::json& body);
  void move_to(size_t next, const std::string& why);
  // Why no member served `path`: each one's failure (why[i] for endpoints_[i]), and whether
  // those that answer have a leader (a status query each member answers by itself).
  EtcdUnavailable unavailable(const std::string& path, const std::vector<std::string>& why) const;

  std::vector<std::string> endpoints_;
  std::atomic<size_t> current_{0};
  EtcdTls tls_;
  double timeout_s_;
  bool announce_moves_;
};

// The end of etcd's range for every key starting with prefix (its last byte + 1).
std::string etcd_prefix_end(const std::string& prefix);

// The members of a comma-separated endpoint list ("A,B,C"), in order (empty ones kept, for
// the caller to refuse).
std::vector<std::string> etcd_endpoint_list(const std::string& list);

}  // namespace loom::launch
