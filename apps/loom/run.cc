// `loom run -n N [--max-restarts K] [--all-ranks] [--profile] [--] loom train ...` (also `loom run
// -n N train ...`): starts N ranks on this machine around a rendezvous store it hosts, prints their
// output prefixed with the rank, forwards SIGINT/SIGTERM, tears the job down when a rank fails
// (naming it), and on failure restarts the job from its latest checkpoint up to K times.
//
// On several machines (`--nnodes MIN:MAX --rdzv etcd://HOST:PORT --rdzv-id JOB`, run on each):
// the machines meet in etcd (launch/rendezvous.h), node 0's launcher hosts the store, and a
// machine lost, a rank failing or a machine waiting to join makes every launcher stop its
// ranks and meet again; the training resumes from its latest checkpoint on the machines left.
#include "run.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include "loom/comm/store/tcp_store.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"
#include "loom/launch/local_launcher.h"
#include "loom/launch/rendezvous.h"

namespace loom::apps {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
}

struct Args {
  int n = 1;
  int max_restarts = 0;
  bool all_ranks = false, profile = false;
  double timeout = 0;
  // Several machines.
  std::string nnodes, rdzv, rdzv_id, node_addr, token_file, ca, cert, key;
  double last_call = 10, rdzv_timeout = 600;
};

// `loom train ... --resume` (once): a restarted job continues from its latest checkpoint.
void add_resume(std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--resume") == argv.end()) argv.push_back("--resume");
}

// The exit code for a failed job: the first failing rank's, 128 + its signal.
int exit_code(const launch::RankExit& e) {
  return e.signal ? 128 + e.signal : e.exit_code;
}

std::string job_token(const Args& a) {
  std::string token;
  if (!a.token_file.empty()) {
    std::ifstream f(a.token_file);
    if (!f || !std::getline(f, token) || token.empty())
      throw UserError("cannot read the job token from --token-file " + a.token_file,
                      "a file whose first line is the job's secret, the same on every machine");
  } else if (const char* t = std::getenv("LOOM_JOB_TOKEN")) {
    token = t;
  }
  if (token.size() < 16)
    throw UserError(
        "loom run --rdzv needs the job's secret (16 characters or more) on every "
        "machine",
        "set LOOM_JOB_TOKEN (e.g. to `openssl rand -hex 32`, the same on each "
        "machine) or pass --token-file");
  return token;
}

// `--nnodes MIN[:MAX]`.
std::pair<int, int> parse_nnodes(const std::string& s) {
  const size_t colon = s.find(':');
  try {
    size_t used = 0;
    const int lo = std::stoi(s.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? s.size() : colon)) throw std::invalid_argument(s);
    const int hi = colon == std::string::npos ? lo : std::stoi(s.substr(colon + 1), &used);
    if (colon != std::string::npos && used != s.size() - colon - 1) throw std::invalid_argument(s);
    if (lo >= 1 && hi >= lo) return {lo, hi};
  } catch (const std::logic_error&) {
  }
  throw UserError("--nnodes '" + s + "' is not MIN:MAX (or N) with 1 <= MIN <= MAX",
                  "e.g. --nnodes 2:4 (2 to 4 machines) or --nnodes 3");
}

std::string describe(const launch::Change& c) {
  using C = launch::Change;
  switch (c.kind) {
    case C::kMemberLost:
      return "machine " + c.detail + " was lost (its lease expired)";
    case C::kJoinerWaiting:
      return "machine " + c.detail + " waits to join";
    case C::kRoundMoved:
      return "another machine stopped the round (" + c.detail + ")";
    case C::kJobFailed:
      return "the job failed: " + c.detail;
    case C::kLeaseLost:
    case C::kEtcdLost:
      return c.detail;
    case C::kNone:
      break;
  }
  return "nothing changed";
}

// The job on this machine as one of several (see the file's comment).
int run_machines(const Args& a, launch::LaunchOptions lo, bool is_train) {
  const auto [min_nodes, max_nodes] = parse_nnodes(a.nnodes.empty() ? "1" : a.nnodes);
  // etcd://HOST:PORT (or etcds:// for TLS), or a cluster's members: etcd://A:P,B:P,C:P.
  const bool tls = a.rdzv.rfind("etcds://", 0) == 0;
  if (!tls && a.rdzv.rfind("etcd://", 0) != 0)
    throw UserError("--rdzv '" + a.rdzv + "' is not etcd://HOST:PORT or etcds://HOST:PORT",
                    "e.g. --rdzv etcd://10.0.0.1:2379 (etcd's client URL), or a cluster's "
                    "members: etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379");
  std::string endpoint;
  for (const std::string& member : launch::etcd_endpoint_list(a.rdzv.substr(tls ? 8 : 7)))
    if (!member.empty())  // (a trailing comma)
      endpoint +=
          std::string(endpoint.empty() ? "" : ",") + (tls ? "https://" : "http://") + member;
  if (a.rdzv_id.empty())
    throw UserError("--rdzv needs --rdzv-id JOB, the same on every machine of the job",
                    "e.g. --rdzv-id gpt-run-7");
  launch::RendezvousOptions ro;
  ro.job = a.rdzv_id;
  ro.min_nodes = min_nodes;
  ro.max_nodes = max_nodes;
  ro.last_call_s = a.last_call;
  ro.join_timeout_s = a.rdzv_timeout;
  ro.token = job_token(a);
  launch::NodeInfo self;
  const char* host_id = std::getenv("LOOM_HOST_ID");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  self.host = host_id && *host_id ? host_id : host;
  self.addr = a.node_addr.empty() ? launch::address_towards(endpoint) : a.node_addr;
  self.id = generate_token().substr(0, 16);
  self.nproc = a.n;
  launch::Rendezvous rdzv(endpoint, {a.ca, a.cert, a.key}, ro);
  int restarts = 0;
  for (;;) {
    // A store of our own for every round (used if this machine becomes node 0), on the
    // address the other machines reach us at.
    comm::TcpStoreServer store(self.addr, 0, ro.token);
    self.store_port = store.address().port;
    self.torch_port = launch::free_port(self.addr);
    const launch::Membership m = rdzv.join(self);
    const launch::NodeInfo& node0 = m.nodes[0];
    std::fprintf(stderr,
                 "loom run: %s round %lld: machine %d of %zu (%s), ranks %d-%d of %d, store on "
                 "%s\n",
                 a.rdzv_id.c_str(), static_cast<long long>(m.round), m.node_rank, m.nodes.size(),
                 m.hosts().c_str(), m.rank_offset(), m.rank_offset() + a.n - 1, m.world_size(),
                 node0.host.c_str());
    lo.rank_offset = m.rank_offset();
    lo.world_size = m.world_size();
    lo.store_url = "tcp://" + node0.addr + ":" + std::to_string(node0.store_port);
    lo.token = ro.token;
    lo.job_id = a.rdzv_id + "-r" + std::to_string(m.round);
    lo.torch_master = node0.addr + ":" + std::to_string(node0.torch_port);
    // A later round continues the job (a machine admitted then starts from the checkpoint
    // too); a job id used again after it finished starts at round 0.
    if (is_train && m.round > 0) add_resume(lo.argv);
    // While the ranks run: a change of membership stops them (a machine waiting to join:
    // at a checkpoint, through SIGTERM; anything else at once).
    std::atomic<bool> stop{false}, running{true};
    std::atomic<int> forward{0};
    launch::Change change;
    std::thread monitor([&] {
      while (running) {
        if (int sig = g_signal.load()) forward = sig;
        launch::Change c;
        if (rdzv.etcd_failing()) {  // a watch would wait on etcd: look at its health only
          c = rdzv.etcd_change();
          if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        } else {
          try {
            c = rdzv.watch(m, 0.5);
          } catch (const Error&) {  // etcd unreachable for a moment: the leases decide
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
          }
        }
        if (!c) continue;
        change = c;
        std::fprintf(stderr, "loom run: %s: stopping this machine's ranks%s\n", describe(c).c_str(),
                     c.kind == launch::Change::kJoinerWaiting ? " at a checkpoint" : "");
        if (c.kind == launch::Change::kJoinerWaiting)
          forward = SIGTERM;
        else
          stop = true;
        return;
      }
    });
    lo.stop = &stop;
    lo.forward_signal = &forward;
    launch::LaunchResult res = launch::run_local(lo);
    running = false;
    monitor.join();
    if (res.ok()) {
      try {
        rdzv.finish(m);
      } catch (const launch::EtcdUnavailable& e) {  // the job is done all the same
        std::fprintf(stderr,
                     "loom run: the ranks finished; etcd could not be told (%s): the job's keys "
                     "expire with the leases\n",
                     e.what());
      }
      return 0;
    }
    if (g_signal.load()) {
      std::fprintf(stderr, "loom run: stopped by signal %d\n", g_signal.load());
      return 130;
    }
    if (!change && !rdzv.etcd_failing()) {
      try {
        change = rdzv.watch(m, 0);  // did a change elsewhere stop our ranks?
      } catch (const Error&) {
      }
    }
    const launch::RankExit* e = res.first_failure >= 0 ? &res.ranks[res.first_failure] : nullptr;
    std::string why;
    using C = launch::Change;
    // Ranks that failed while etcd is away: most likely stopped by another machine's launcher
    // that saw etcd lost first; this machine waits for etcd with them.
    if (!change && !res.ok() && !res.timed_out && rdzv.etcd_failing() &&
        !(e && (e->exit_code == 2 || e->exit_code == loom::kExitDiverged)))
      change = {C::kEtcdLost, rdzv.etcd_problem()};
    switch (change.kind) {
      case C::kEtcdLost:  // not the job's fault: no restart counted
        std::fprintf(stderr,
                     "loom run: %s; this machine's ranks were stopped: they resume from the "
                     "latest checkpoint when etcd answers again\n",
                     describe(change).c_str());
        rdzv.next_round(m);  // waits for etcd
        continue;
      case C::kJoinerWaiting:
        std::fprintf(stderr, "loom run: %s; meeting again\n", describe(change).c_str());
        rdzv.next_round(m);
        continue;  // scaling up is not a restart
      case C::kJobFailed:
        std::fprintf(stderr, "loom run: %s\n", describe(change).c_str());
        return 1;
      case C::kMemberLost:
      case C::kRoundMoved:
      case C::kLeaseLost:
        why = describe(change);
        // A rank of this machine killed by a signal from outside (the OOM killer, an
        // operator) is this machine's own cause, even when another machine's launcher saw
        // its connections close and moved the round first.
        if (e && e->signal != 0) why = e->describe() + "; " + why;
        break;
      case C::kNone:
        if (res.timed_out) {
          why = "the job ran past --timeout";
          rdzv.fail(m, self.host + ": " + why);
          std::fprintf(stderr, "loom run: %s\n", why.c_str());
          return 124;
        }
        if (e && e->exit_code == 130) {  // stopped by a signal on another machine
          std::fprintf(stderr, "loom run: the ranks stopped at a checkpoint (a signal)\n");
          return 130;
        }
        why = e ? e->describe() : "the ranks stopped";
        if (e && e->exit_code == 2) {  // bad input: every machine stops, none restarts
          rdzv.fail(m, self.host + ": " + why + " (bad input)");
          std::fprintf(stderr, "loom run: %s\n", why.c_str());
          return 2;
        }
        if (e && e->exit_code == loom::kExitDiverged) {  // nor after a diverged step
          rdzv.fail(m, self.host + ": " + why + " (training diverged)");
          std::fprintf(stderr, "loom run: %s\n", why.c_str());
          return loom::kExitDiverged;
        }
        break;
    }
    std::fprintf(stderr, "loom run: %s; this machine's ranks were stopped\n", why.c_str());
    if (restarts++ >= a.max_restarts) {
      rdzv.fail(m, self.host + ": " + why + ", and --max-restarts " +
                       std::to_string(a.max_restarts) + " were used");
      return e ? exit_code(*e) : 1;
    }
    std::fprintf(
        stderr,
        "loom run: meeting again, to resume from the latest checkpoint (restart %d of %d)\n",
        restarts, a.max_restarts);
    rdzv.next_round(m);
  }
}

}  // namespace

std::function<int()> add_run_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* r = app.add_subcommand(
      "run", "start N ranks of a command on this machine (or on each of several: --rdzv)");
  r->add_option("-n,--nprocs,--nproc-per-node", a->n, "number of ranks (on this machine)")
      ->required()
      ->check(CLI::Range(1, 4096));
  r->add_option("--nnodes", a->nnodes, "MIN:MAX (or N) machines, with --rdzv");
  r->add_option("--rdzv", a->rdzv,
                "etcd://HOST:PORT (or etcds:// for TLS): meet the job's other machines there");
  r->add_option("--rdzv-id", a->rdzv_id, "the job's name in etcd, the same on every machine");
  r->add_option("--rdzv-last-call", a->last_call,
                "seconds to wait for more machines once MIN are in (default 10)");
  r->add_option("--rdzv-timeout", a->rdzv_timeout,
                "seconds a rendezvous may wait for MIN machines (default 600)");
  r->add_option("--node-addr", a->node_addr,
                "this machine's address for the others (default: the one that reaches etcd)");
  r->add_option("--token-file", a->token_file,
                "file holding the job's secret (default: LOOM_JOB_TOKEN), the same everywhere");
  r->add_option("--rdzv-ca", a->ca, "etcds://: the CA certificate to trust");
  r->add_option("--rdzv-cert", a->cert, "etcds://: client certificate");
  r->add_option("--rdzv-key", a->key, "etcds://: client key");
  r->add_option("--max-restarts", a->max_restarts,
                "restart a failed job from its latest checkpoint up to this many times")
      ->check(CLI::NonNegativeNumber);
  r->add_flag("--all-ranks", a->all_ranks, "every rank prints its training log (default: rank 0)");
  r->add_option("--timeout", a->timeout, "kill the job after this many seconds (0: never)");
  r->add_flag("--profile", a->profile,
              "loom train: record the timeline (train.profile = true: run.dir/trace.json)");
  r->prefix_command();
  r->footer("Example: loom run -n 2 loom train -c configs/tiny.toml --set train.zero=1");
  return [a, r, &app]() -> int {
    std::vector<std::string> cmd = r->remaining();  // main.cc drops a `--` before it
    if (cmd.empty())
      throw UserError("loom run needs a command to start",
                      "e.g. loom run -n 2 loom train -c configs/tiny.toml");
    if (cmd[0] == "loom")
      cmd[0] = launch::self_exe();
    else if (cmd[0] != "run" &&
             !app.get_subcommands([&](CLI::App* sub) { return sub->get_name() == cmd[0]; }).empty())
      cmd.insert(cmd.begin(), launch::self_exe());  // `loom run -n 2 train ...`
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    launch::LaunchOptions lo;
    lo.nprocs = a->n;
    lo.argv = cmd;
    lo.prefix_output = true;
    lo.torch_env = true;
    lo.forward_signal = &g_signal;
    lo.timeout_seconds = a->timeout;
    if (a->all_ranks) lo.env["LOOM_LOG_ALL_RANKS"] = "1";
    const bool is_train = cmd.size() > 1 && cmd[1] == "train";
    if (a->profile && !is_train)
      throw UserError("--profile records a `loom train` job's timeline",
                      "e.g. loom run -n 2 --profile loom train -c configs/tiny.toml");
    if (a->profile) lo.argv.insert(lo.argv.begin() + 2, {"--set", "train.profile=true"});
    if (!a->rdzv.empty()) return run_machines(*a, lo, is_train);
    if (!a->nnodes.empty() && parse_nnodes(a->nnodes) != std::pair{1, 1})
      throw UserError("--nnodes " + a->nnodes + " needs --rdzv: where the machines meet",
                      "e.g. --rdzv etcd://10.0.0.1:2379 --rdzv-id JOB on every machine");
    for (int attempt = 0;; ++attempt) {
      launch::LaunchResult res = launch::run_local(lo);
      if (res.ok()) return 0;
      if (res.forwarded_signal) {
        std::fprintf(stderr, "loom run: stopped by signal %d\n", res.forwarded_signal);
        return 130;
      }
      if (res.timed_out) {
        std::fprintf(stderr, "loom run: the job ran past --timeout %.0f s and was killed\n",
                     a->timeout);
        return 124;
      }
      const launch::RankExit& e = res.ranks[res.first_failure];
      std::fprintf(stderr, "loom run: %s; the other ranks were stopped\n", e.describe().c_str());
      const int code = exit_code(e);
      // Bad input and a diverged run: a restart would fail the same way.
      if (attempt >= a->max_restarts || e.exit_code == loom::kExitBadInput ||
          e.exit_code == loom::kExitDiverged)
        return code;
      std::fprintf(stderr, "loom run: restarting from the latest checkpoint (restart %d of %d)\n",
                   attempt + 1, a->max_restarts);
      if (is_train) add_resume(lo.argv);
    }
  };
}

}  // namespace loom::apps
