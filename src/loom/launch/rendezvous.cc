#include "loom/launch/rendezvous.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "loom/comm/net/socket.h"
#include "loom/core/deadline.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"

namespace loom::launch {
namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

json node_json(const NodeInfo& n) {
  return {{"host", n.host},
          {"addr", n.addr},
          {"id", n.id},
          {"nproc", n.nproc},
          {"store_port", n.store_port},
          {"torch_port", n.torch_port}};
}

NodeInfo node_of(const json& j) {
  NodeInfo n;
  n.host = j.at("host").get<std::string>();
  n.addr = j.at("addr").get<std::string>();
  n.id = j.at("id").get<std::string>();
  n.nproc = j.at("nproc").get<int>();
  n.store_port = j.at("store_port").get<int>();
  n.torch_port = j.at("torch_port").get<int>();
  if (n.nproc < 1 || n.host.empty()) throw std::invalid_argument("bad node record");
  return n;
}

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) s += digits[b >> 4], s += digits[b & 15];
  return s;
}

}  // namespace

int Membership::world_size() const {
  int n = 0;
  for (const NodeInfo& node : nodes) n += node.nproc;
  return n;
}

int Membership::rank_offset() const {
  int n = 0;
  for (int i = 0; i < node_rank; ++i) n += nodes[i].nproc;
  return n;
}

std::string Membership::hosts() const {
  std::string s;
  for (const NodeInfo& n : nodes) s += (s.empty() ? "" : ", ") + n.host;
  return s;
}

// Everything under /loom/JOB/ as one read, its signatures checked.
struct Rendezvous::State {
  int64_t round = -1;                                 // -1: the job has no round yet
  std::vector<std::pair<NodeInfo, int64_t>> members;  // of `round`, with create revisions
  std::optional<std::vector<NodeInfo>> frozen;
  std::set<std::string> waiting, done, live_ids;  // hosts; live_ids: launcher ids with keys
  std::optional<std::string> failed;
  std::vector<std::string> forged;  // keys whose signature is not this job's token's
  bool frozen_forged = false;       // the round was frozen by launchers with another token
};

std::string Rendezvous::record(const std::string& key, const json& body) const {
  const std::string what = key + "\n" + body.dump();
  return json{{"body", body}, {"sig", hex(hmac_sha256(opts_.token, what.data(), what.size()))}}
      .dump();
}

std::optional<json> Rendezvous::verified_body(const EtcdKv& kv) const {
  const json j = json::parse(kv.value, nullptr, false);
  if (!j.is_object() || !j.contains("body") || !j.contains("sig")) return std::nullopt;
  if (kv.value != record(kv.key, j["body"])) return std::nullopt;
  return j["body"];
}

Rendezvous::Rendezvous(std::string endpoint, EtcdTls tls, RendezvousOptions opts)
    : etcd_(std::move(endpoint), tls, 5), tls_(std::move(tls)), opts_(std::move(opts)) {
  if (opts_.min_nodes < 1 || opts_.max_nodes < opts_.min_nodes)
    throw UserError("--nnodes " + std::to_string(opts_.min_nodes) + ":" +
                        std::to_string(opts_.max_nodes) + " is not MIN:MAX with 1 <= MIN <= MAX",
                    "e.g. --nnodes 2:4, or --nnodes 3 for exactly 3 machines");
  if (opts_.job.empty() || opts_.job.find('/') != std::string::npos)
    throw UserError("--rdzv-id '" + opts_.job + "' must be a non-empty name without '/'",
                    "e.g. --rdzv-id gpt-run-7 (the same on every machine of the job)");
  lease_ = etcd_.grant(opts_.lease_ttl_s);
  keepalive_ = std::thread([this] { keepalive_loop(); });
}

Rendezvous::~Rendezvous() {
  stop_ = true;
  if (keepalive_.joinable()) keepalive_.join();
  try {
    etcd_.revoke(lease_);
  } catch (const Error&) {  // etcd gone: the lease expires on its own
  }
}

void Rendezvous::keepalive_loop() {
  // Its own handle (calls do not share curl state), quiet: the main handle says when the
  // job's calls move to another member.
  Etcd etcd(etcd_.endpoints(), tls_, 2, /*announce_moves=*/false);
  auto last = Clock::now();
  etcd_ok_ns_ = now_ns();
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Every keepalive_s; every second while etcd fails, to see it come back soon.
    if (since(last) < (etcd_failing_ ? 1.0 : opts_.keepalive_s)) continue;
    last = Clock::now();
    // A lease the main thread has since replaced (join() grants a new one) is not lost.
    const int64_t lease = lease_;
    try {
      if (etcd.keep_alive(lease) <= 0 && lease_ == lease) lease_lost_ = true;
      etcd_ok_ns_ = now_ns();
      etcd_failing_ = etcd_lost_ = false;
    } catch (const Error& e) {
      // etcd unavailable for now: short outages (a member restarting, an election) pass
      // unnoticed. After the lease's TTL without a keep-alive this machine can no longer
      // tell who is in the job (its lease, and the others', may have expired): lost.
      {
        std::lock_guard<std::mutex> lock(problem_mu_);
        etcd_problem_ = e.what();
      }
      etcd_failing_ = true;
      if (static_cast<double>(now_ns() - etcd_ok_ns_.load()) * 1e-9 >=
          static_cast<double>(opts_.lease_ttl_s))
        etcd_lost_ = true;
    }
  }
}

std::string Rendezvous::etcd_problem() const {
  std::lock_guard<std::mutex> lock(problem_mu_);
  return etcd_problem_;
}

Change Rendezvous::etcd_change() const {
  if (!etcd_lost_) return {};
  return {Change::kEtcdLost, "no keep-alive of this machine's lease for its TTL (" +
                                 std::to_string(opts_.lease_ttl_s) + " s): " + etcd_problem()};
}

void Rendezvous::waiting_for_etcd(const EtcdUnavailable& e, double waited) {
  if (waited > opts_.join_timeout_s)
    throw PeerError(PeerError::Kind::kTimeout,
                    "rendezvous " + opts_.job + ": etcd did not come back within --rdzv-timeout " +
                        std::to_string(static_cast<int>(opts_.join_timeout_s)) + " s: " + e.what());
  if (!etcd_waited_.exchange(true))
    std::fprintf(stderr, "loom run: waiting for etcd (up to --rdzv-timeout %d s): %s\n",
                 static_cast<int>(opts_.join_timeout_s), e.what());
}

void Rendezvous::etcd_answered() {
  etcd_ok_ns_ = now_ns();
  etcd_lost_ = false;
  if (etcd_waited_.exchange(false))
    std::fprintf(stderr, "loom run: etcd answers again (at %s)\n", etcd_.endpoint().c_str());
}

void Rendezvous::with_etcd(const std::function<void()>& f) {
  const auto start = Clock::now();
  for (;;) {
    try {
      f();
      etcd_answered();
      return;
    } catch (const EtcdUnavailable& e) {
      waiting_for_etcd(e, since(start));
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

Rendezvous::State Rendezvous::read(int64_t* revision) {
  State s;
  const std::string pre = prefix();
  std::vector<EtcdKv> kvs = etcd_.get_prefix(pre, revision);
  for (const EtcdKv& kv : kvs)
    if (kv.key == pre + "round") s.round = std::stoll(kv.value);
  const std::string rp = round_prefix(s.round);
  for (const EtcdKv& kv : kvs) {
    if (kv.key.rfind(rp, 0) != 0) continue;
    const std::string rest = kv.key.substr(rp.size());
    const std::optional<json> verified = verified_body(kv);
    if (!verified) {
      s.forged.push_back(kv.key);
      s.frozen_forged |= rest == "frozen";
      continue;
    }
    const json& body = *verified;
    try {
      if (rest.rfind("members/", 0) == 0) {
        s.members.emplace_back(node_of(body), kv.create_revision);
        s.live_ids.insert(s.members.back().first.id);
      } else if (rest == "frozen") {
        std::vector<NodeInfo> nodes;
        for (const json& n : body.at("nodes")) nodes.push_back(node_of(n));
        s.frozen = std::move(nodes);
      } else if (rest.rfind("waiting/", 0) == 0) {
        s.waiting.insert(rest.substr(8));
      } else if (rest.rfind("done/", 0) == 0) {
        s.done.insert(rest.substr(5));
      } else if (rest == "failed") {
        s.failed = body.get<std::string>();
      }
    } catch (const std::exception&) {
      s.forged.push_back(kv.key);
    }
  }
  return s;
}

Membership Rendezvous::join(const NodeInfo& self) {
  const auto start = Clock::now();
  double min_at = -1;  // when this round first had MIN members (seconds after start), or -1
  std::set<std::string> warned;
  int64_t joined = -1;    // the round this machine's member key is in
  double etcd_away = -1;  // since when (s after start) etcd could not serve the join, or -1
  for (;;) {
    try {
      if (lease_lost_.exchange(false)) lease_ = etcd_.grant(opts_.lease_ttl_s), joined = -1;
      int64_t rev = 0;
      State s = read(&rev);
      for (const std::string& k : s.forged)
        if (warned.insert(k).second)
          std::fprintf(stderr,
                       "loom run: ignoring %s in etcd: not signed with this job's token (another "
                       "job with --rdzv-id %s, or a launcher given another LOOM_JOB_TOKEN?)\n",
                       k.c_str(), opts_.job.c_str());
      if (s.round < 0) {  // the first machine of the job
        etcd_.create(prefix() + "round", "0");
        continue;
      }
      const std::string rp = round_prefix(s.round);
      if (joined >= 0 && joined != s.round) {  // the round moved on under us
        etcd_.erase(round_prefix(joined) + "members/" + self.host);
        joined = -1, min_at = -1;
      }
      if (s.failed) {  // a rerun of a failed job starts a new round
        etcd_.compare_and_swap(prefix() + "round", std::to_string(s.round),
                               std::to_string(s.round + 1));
        continue;
      }
      if (s.frozen_forged && !s.frozen)
        throw UserError("round " + std::to_string(s.round) + " of job " + opts_.job +
                            " in etcd was frozen by launchers with another job token",
                        "every machine of a job needs the same LOOM_JOB_TOKEN (or --token-file); "
                        "or another job uses --rdzv-id " +
                            opts_.job);
      if (s.frozen) {
        for (size_t i = 0; i < s.frozen->size(); ++i)
          if ((*s.frozen)[i].id == self.id) {
            etcd_answered();
            return {s.round, *s.frozen, static_cast<int>(i)};
          }
        // Frozen without us. If none of its machines is alive (a job that ended or died),
        // start the next round; else wait to be admitted.
        bool alive = false;
        for (const NodeInfo& n : *s.frozen) alive |= s.live_ids.count(n.id) > 0;
        if (!alive) {
          etcd_.compare_and_swap(prefix() + "round", std::to_string(s.round),
                                 std::to_string(s.round + 1));
          continue;
        }
        if (!s.waiting.count(self.host))
          etcd_.put(rp + "waiting/" + self.host, record(rp + "waiting/" + self.host, self.host),
                    lease_);
      } else {
        bool in = false;
        for (const auto& [n, crev] : s.members) in |= n.id == self.id;
        if (!in) {
          const std::string key = rp + "members/" + self.host;
          if (etcd_.create(key, record(key, node_json(self)), lease_)) {
            joined = s.round;
            continue;
          }
          if (since(start) > 2.0 * static_cast<double>(opts_.lease_ttl_s))
            throw UserError("another launcher holds " + key + " in etcd",
                            "two machines with the same host identity (LOOM_HOST_ID or host "
                            "name) cannot be in one job; or wait for a dead launcher's lease to "
                            "expire");
        } else {
          const int n = static_cast<int>(s.members.size());
          if (n < opts_.min_nodes)
            min_at = -1;
          else if (min_at < 0)
            min_at = since(start);
          if (n >= opts_.max_nodes || (min_at >= 0 && since(start) - min_at >= opts_.last_call_s)) {
            // Freeze: the first MAX to arrive, in host order.
            auto members = s.members;
            std::sort(members.begin(), members.end(),
                      [](const auto& a, const auto& b) { return a.second < b.second; });
            if (static_cast<int>(members.size()) > opts_.max_nodes) members.resize(opts_.max_nodes);
            std::sort(members.begin(), members.end(),
                      [](const auto& a, const auto& b) { return a.first.host < b.first.host; });
            json nodes = json::array();
            for (const auto& [node, crev] : members) nodes.push_back(node_json(node));
            etcd_.create(rp + "frozen", record(rp + "frozen", json{{"nodes", nodes}}));
            continue;
          }
        }
      }
      if (since(start) > opts_.join_timeout_s) {
        std::string in;
        for (const auto& [n, crev] : s.members) in += (in.empty() ? "" : ", ") + n.host;
        throw PeerError(PeerError::Kind::kTimeout,
                        "rendezvous " + opts_.job + " at " + etcd_.endpoint() + ": " +
                            std::to_string(s.members.size()) + " of --nnodes " +
                            std::to_string(opts_.min_nodes) + ":" +
                            std::to_string(opts_.max_nodes) + " machines joined round " +
                            std::to_string(s.round) + " within " +
                            std::to_string(static_cast<int>(opts_.join_timeout_s)) +
                            " s (in: " + (in.empty() ? "none" : in) + ")");
      }
      double wait = 1.0;  // re-read at least this often (the last call, lease expiry)
      if (min_at >= 0) wait = std::clamp(opts_.last_call_s - (since(start) - min_at), 0.05, 1.0);
      etcd_.watch_prefix(prefix(), rev + 1, wait);
    } catch (const EtcdLeaseGone&) {
      // The lease expired while etcd could not be reached (the keep-alive thread may not
      // have seen it yet): a new one, and this machine joins again.
      lease_lost_ = true;
    } catch (const EtcdUnavailable& e) {  // retried (the steps above can be repeated)
      if (etcd_away < 0) etcd_away = since(start);
      waiting_for_etcd(e, since(start) - etcd_away);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

Change Rendezvous::watch(const Membership& m, double timeout_s) {
  for (int pass = 0;; ++pass) {
    if (lease_lost_) return {Change::kLeaseLost, "this machine's lease expired"};
    if (Change c = etcd_change()) return c;
    int64_t rev = 0;
    State s = read(&rev);
    if (s.round != m.round) {
      // A failure recorded in the round we ran counts, even after it moved on.
      if (auto f = etcd_.get(round_prefix(m.round) + "failed"))
        if (auto why = verified_body(*f); why && why->is_string())
          return {Change::kJobFailed, why->get<std::string>()};
      // Moved on to admit a machine waiting in our round (its ranks stopped at a checkpoint).
      for (const EtcdKv& w : etcd_.get_prefix(round_prefix(m.round) + "waiting/"))
        if (verified_body(w)) return {Change::kJoinerWaiting, w.key.substr(w.key.rfind('/') + 1)};
      return {Change::kRoundMoved, "round " + std::to_string(s.round)};
    }
    if (s.failed) return {Change::kJobFailed, *s.failed};
    for (const NodeInfo& n : m.nodes)
      if (!s.live_ids.count(n.id) && !s.done.count(n.host)) return {Change::kMemberLost, n.host};
    if (!s.waiting.empty() && static_cast<int>(m.nodes.size()) < opts_.max_nodes)
      return {Change::kJoinerWaiting, *s.waiting.begin()};
    if (pass > 0 || timeout_s <= 0) return {};
    etcd_.watch_prefix(prefix(), rev + 1, timeout_s);
  }
}

void Rendezvous::next_round(const Membership& m) {
  with_etcd([&] {
    etcd_.compare_and_swap(prefix() + "round", std::to_string(m.round),
                           std::to_string(m.round + 1));
  });
}

void Rendezvous::fail(const Membership& m, const std::string& why) {
  const std::string key = round_prefix(m.round) + "failed";
  etcd_.create(key, record(key, why));
}

void Rendezvous::finish(const Membership& m, double timeout_s) {
  const NodeInfo& self = m.nodes[m.node_rank];
  const std::string key = round_prefix(m.round) + "done/" + self.host;
  etcd_.put(key, record(key, self.host));
  if (m.node_rank != 0) return;
  const auto start = Clock::now();
  while (since(start) < timeout_s) {
    int64_t rev = 0;
    State s = read(&rev);
    bool all = true;
    for (const NodeInfo& n : m.nodes) all &= s.done.count(n.host) || !s.live_ids.count(n.id);
    if (all || s.round != m.round) break;
    etcd_.watch_prefix(prefix(), rev + 1, 1.0);
  }
  etcd_.erase_prefix(prefix());  // the job is over: its id may be used again
}

std::string address_towards(const std::string& endpoints) {
  // The first member that takes a connection (of "URL,URL,..."); 2 s each but the last.
  const std::vector<std::string> urls = etcd_endpoint_list(endpoints);
  for (size_t i = 0; i < urls.size(); ++i) {
    const bool last = i + 1 == urls.size();
    std::string hp =
        urls[i].substr(urls[i].find("://") == std::string::npos ? 0 : urls[i].find("://") + 3);
    if (auto slash = hp.find('/'); slash != std::string::npos) hp.resize(slash);
    try {
      comm::net::Fd fd = comm::net::connect_to(comm::net::parse_host_port(hp, "the etcd endpoint"),
                                               Deadline::after_seconds(last ? 10 : 2), "etcd");
      return comm::net::local_address(fd.get()).host;
    } catch (const PeerError&) {
      if (last) throw;  // its error
    }
  }
  throw UserError("no etcd endpoint given", "e.g. --rdzv etcd://10.0.0.1:2379");
}

}  // namespace loom::launch
