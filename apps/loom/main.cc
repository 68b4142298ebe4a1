// The loom command line. Subcommands register themselves here; user errors print one line
// and a hint and exit 2, peer failures exit 3, anything else is a bug and exits 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench.h"
#include "loom/core/error.h"
#include "loom/core/float_env.h"
#include "model_io.h"
#include "plan.h"
#include "prep.h"
#include "report.h"
#include "run.h"
#include "tokenize.h"
#include "train.h"

int main(int argc, char** argv) {
  CLI::App app{"loom: distributed training for GPT-style models"};
  app.require_subcommand(1);
  auto bench = loom::apps::add_bench_command(app);
  auto tokenize = loom::apps::add_tokenize_command(app);
  auto prep = loom::apps::add_prep_command(app);
  auto train = loom::apps::add_train_command(app);
  auto sample = loom::apps::add_sample_command(app);
  auto run = loom::apps::add_run_command(app);
  auto report = loom::apps::add_report_command(app);
  auto plan = loom::apps::add_plan_command(app);
  auto export_ = loom::apps::add_export_command(app);
  auto eval = loom::apps::add_eval_command(app);
  // `loom run [options] -- COMMAND...` as torchrun and srun users type it: the first `--`
  // after `run` ends its options; CLI11's prefix command stops at COMMAND's first word
  // already, and would refuse the words after a `--` as unexpected.
  std::vector<char*> args(argv, argv + argc);
  if (argc > 1 && std::strcmp(argv[1], "run") == 0)
    for (auto it = args.begin() + 2; it != args.end(); ++it)
      if (std::strcmp(*it, "--") == 0) {
        args.erase(it);
        break;
      }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // Before any thread starts, so that every thread inherits it (core/float_env.h).
    loom::flush_denormals_from_env();
    if (app.got_subcommand("bench")) return bench();
    if (app.got_subcommand("tokenize")) return tokenize();
    if (app.got_subcommand("prep")) return prep();
    if (app.got_subcommand("train")) return train();
    if (app.got_subcommand("sample")) return sample();
    if (app.got_subcommand("run")) return run();
    if (app.got_subcommand("report")) return report();
    if (app.got_subcommand("plan")) return plan();
    if (app.got_subcommand("export")) return export_();
    if (app.got_subcommand("eval")) return eval();
  } catch (const loom::UserError& e) {
    std::fprintf(stderr, "loom: error: %s\nhint: %s\n", e.what(), e.hint().c_str());
    return 2;
  } catch (const loom::PeerError& e) {
    std::fprintf(stderr, "loom: communication failed: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
