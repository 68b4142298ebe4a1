// `loom report RUN_DIR [--out FILE] [--step N]`: one self-contained HTML page about a run.
#include "report.h"

#include <cstdio>

#include "loom/profile/report.h"

namespace loom::apps {

std::function<int()> add_report_command(CLI::App& app) {
  auto a = std::make_shared<profile::ReportOptions>();
  CLI::App* p = app.add_subcommand(
      "report", "write one self-contained HTML page (charts, memory, timeline) about a run");
  p->add_option("run_dir", a->run_dir, "the run's folder (run.dir: holds metrics.jsonl)")
      ->required();
  p->add_option("--out,-o", a->out, "the page to write (default RUN_DIR/report.html)");
  p->add_option("--step", a->step, "the step the timeline shows (default: the trace's last)");
  return [a]() -> int {
    const std::string out = profile::write_report(*a);
    std::printf("report: %s\n", out.c_str());
    return 0;
  };
}

}  // namespace loom::apps
