// `loom run -n N [--max-restarts K] [--all-ranks] [--profile] [--] loom train ...` (also `loom run
// -n N train ...`): starts N ranks on this machine around a rendezvous store it hosts, prints their
// output prefixed with the rank, forwards SIGINT/SIGTERM, tears the job down when a rank fails
// (naming it), and on failure restarts the job from its latest checkpoint up to K times.
#include "run.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>

#include "loom/core/error.h"
#include "loom/launch/local_launcher.h"

namespace loom::apps {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
}

}  // namespace

std::function<int()> add_run_command(CLI::App& app) {
  struct Args {
    int n = 1;
    int max_restarts = 0;
    bool all_ranks = false, profile = false;
    double timeout = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* r = app.add_subcommand("run", "start N ranks of a command on this machine");
  r->add_option("-n,--nprocs", a->n, "number of ranks")->required()->check(CLI::Range(1, 4096));
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
    std::vector<std::string> cmd = r->remaining();
    if (!cmd.empty() && cmd[0] == "--") cmd.erase(cmd.begin());
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
      const int code = e.signal ? 128 + e.signal : e.exit_code;
      // Exit code 2 is bad input: a restart would fail the same way.
      if (attempt >= a->max_restarts || e.exit_code == 2) return code;
      std::fprintf(stderr, "loom run: restarting from the latest checkpoint (restart %d of %d)\n",
                   attempt + 1, a->max_restarts);
      if (is_train && std::find(lo.argv.begin(), lo.argv.end(), "--resume") == lo.argv.end())
        lo.argv.push_back("--resume");
    }
  };
}

}  // namespace loom::apps
