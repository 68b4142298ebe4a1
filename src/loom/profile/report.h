// `loom report RUN_DIR`: one self-contained HTML page about a run (no network needed to open
// it: the data, the CSS and the JavaScript that draws the SVG charts are inline).
//
// It reads what the run left in its folder: metrics.jsonl (per step: loss, lr, grad norm,
// tokens/s, MFU, per-rank memory and time by kind; per evaluation: val_loss), system.jsonl
// (the 500 ms samples), trace.json (the timeline, with train.profile = true) and
// config.toml. The summary table's numbers are computed here, from metrics.jsonl, and
// written as text; the charts are drawn in the browser from the same rows.
#pragma once

#include <cstdint>
#include <string>

namespace loom::profile {

struct ReportOptions {
  std::string run_dir;
  std::string out;           // "" = RUN_DIR/report.html
  int64_t step = 0;          // the timeline's step; 0 = the last one the trace holds
  size_t max_spans = 20000;  // the timeline's spans at most (the longest kept)
};

// Writes the page (atomically) and returns its path. UserError when the folder has no
// metrics.jsonl or a file in it is not what loom writes.
std::string write_report(const ReportOptions& opt);

// The page's static parts (report_page.cc).
extern const char* const kReportCss;
extern const char* const kReportJs;

}  // namespace loom::profile
