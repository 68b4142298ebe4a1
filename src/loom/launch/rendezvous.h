// The multi-machine rendezvous of `loom run --rdzv etcd://HOST:PORT` (docs/architecture.md,
// "several machines"), on etcd's v3 API (launch/etcd.h). Every machine's launcher:
//
//   - holds one lease (TTL 10 s, kept alive every 3 s by a thread): when a machine dies its
//     keys vanish, and that is how the others notice;
//   - joins the current round R: creates /loom/JOB/rR/members/HOST (create-if-absent, with
//     the lease), then watches /loom/JOB/ until MIN members are in; a last-call window
//     then runs until MAX are in or it ends, and the first launcher to create
//     /loom/JOB/rR/frozen (create-if-absent) fixes the membership (sorted by host);
//   - arriving after a round froze, waits under /loom/JOB/rR/waiting/HOST: the running
//     machines stop at a checkpoint and move to round R+1, which admits it;
//   - on a membership change (a member's key vanished, a machine waiting, a rank failing)
//     moves /loom/JOB/round from R to R+1 (compare-and-swap) and joins again.
//
// The job token never enters etcd: member and frozen records carry an HMAC of their content
// (with the job id and round) under it, so a writer to etcd cannot inject a member or
// replay an old one, and a launcher with another token is refused, loudly.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/launch/etcd.h"

namespace loom::launch {

struct NodeInfo {
  std::string host;    // the machine's identity (LOOM_HOST_ID or the host name)
  std::string addr;    // where the other machines reach it
  std::string id;      // this launcher process (random): tells a restarted launcher apart
  int nproc = 1;       // ranks it runs
  int store_port = 0;  // its rendezvous store (used when it is node 0)
  int torch_port = 0;  // MASTER_PORT for torch.distributed when it is node 0
};

struct RendezvousOptions {
  std::string job;  // --rdzv-id
  int min_nodes = 1, max_nodes = 1;
  double last_call_s = 10;      // between MIN machines in and freezing (unless MAX are in)
  double join_timeout_s = 600;  // a join waiting longer fails, naming who is in
  int64_t lease_ttl_s = 10;
  double keepalive_s = 3;
  std::string token;  // signs the records
};

struct Membership {
  int64_t round = 0;
  std::vector<NodeInfo> nodes;  // node-rank order
  int node_rank = -1;
  int world_size() const;
  int rank_offset() const;  // the first global rank of node_rank's ranks
  std::string hosts() const;
};

struct Change {
  enum Kind {
    kNone,
    kMemberLost,
    kJoinerWaiting,
    kRoundMoved,
    kJobFailed,
    kLeaseLost,
    kEtcdLost  // no keep-alive for the lease's TTL: etcd lost its quorum or cannot be reached
  };
  Kind kind = kNone;
  std::string detail;  // which machine, or the failure as its launcher reported it
  explicit operator bool() const { return kind != kNone; }
};

class Rendezvous {
 public:
  Rendezvous(std::string endpoint, EtcdTls tls, RendezvousOptions opts);
  ~Rendezvous();  // stops the keep-alive and revokes the lease: this machine's keys vanish
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Joins the current round, or waits for the next one if it froze without this machine;
  // returns the frozen membership it is in. UserError on records signed with another
  // token; PeerError(kTimeout) after join_timeout_s, naming the machines that were in.
  Membership join(const NodeInfo& self);

  // What changed since `m` froze, waiting up to timeout_s for a change (0: just look).
  Change watch(const Membership& m, double timeout_s);

  // Moves the job from round m.round to the next (a no-op if another machine did); while
  // etcd cannot serve it, waits for etcd (up to join_timeout_s).
  void next_round(const Membership& m);
  // Marks the round failed (every launcher stops without restarting), e.g. on bad input.
  void fail(const Membership& m, const std::string& why);
  // This machine's ranks finished: marks it done; node 0 (which hosts the store) waits up
  // to timeout_s for the others' ranks to finish too, then removes the job's keys.
  void finish(const Membership& m, double timeout_s = 120);

  int64_t lease() const { return lease_.load(); }
  // The last keep-alive failed (etcd unavailable, for now); etcd_problem() says how.
  bool etcd_failing() const { return etcd_failing_; }
  std::string etcd_problem() const;
  // kEtcdLost once no keep-alive succeeded for the lease's TTL, else kNone; never waits.
  Change etcd_change() const;

 private:
  struct State;
  State read(int64_t* revision);
  std::string prefix() const { return "/loom/" + opts_.job + "/"; }
  std::string round_prefix(int64_t r) const { return prefix() + "r" + std::to_string(r) + "/"; }
  // A record as stored: {"body": body, "sig": HMAC under the token of key "\n" body}.
  std::string record(const std::string& key, const nlohmann::json& body) const;
  // The body of a record signed with this job's token under its own key; nullopt if not.
  std::optional<nlohmann::json> verified_body(const EtcdKv& kv) const;
  void keepalive_loop();
  // f, again every second while etcd cannot serve it (saying so once), up to join_timeout_s.
  void with_etcd(const std::function<void()>& f);
  // After f failed with e, `waited` s into a wait for etcd: says so (once), or throws
  // past join_timeout_s.
  void waiting_for_etcd(const EtcdUnavailable& e, double waited);
  void etcd_answered();  // a call succeeded: etcd is back (saying so if it was away)

  Etcd etcd_;
  EtcdTls tls_;  // for the keep-alive thread's own client
  RendezvousOptions opts_;
  std::atomic<int64_t> lease_{0};
  std::atomic<bool> lease_lost_{false}, stop_{false};
  // etcd's health as the keep-alive sees it: failing (the last attempt), lost (no success
  // for lease_ttl_s), the last success (steady-clock ns), and what the last failure said.
  std::atomic<bool> etcd_failing_{false}, etcd_lost_{false}, etcd_waited_{false};
  std::atomic<int64_t> etcd_ok_ns_{0};
  mutable std::mutex problem_mu_;
  std::string etcd_problem_;
  std::thread keepalive_;
};

// The address of this machine that reaches etcd (the first of `endpoints`, "http://HOST:PORT"
// comma-separated, that takes a connection): what the other machines will reach it at, if
// they reach etcd the same way.
std::string address_towards(const std::string& endpoints);

}  // namespace loom::launch
