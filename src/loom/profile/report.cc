#include "loom/profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/stats.h"
#include "loom/profile/metrics_fields.h"

namespace loom::profile {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_jsonl(const std::string& path, bool required) {
  std::vector<json> rows;
  std::ifstream in(path);
  if (!in) {
    if (required)
      throw UserError("no " + path,
                      "give the run.dir of a `loom train` run (it holds metrics.jsonl)");
    return rows;
  }
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      rows.push_back(json::parse(line));
    } catch (const json::exception&) {
      throw UserError(path + " line " + std::to_string(n) + " is not JSON",
                      "the file was cut or edited; remove the line and run again");
    }
  }
  return rows;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

// JSON inside <script>: "</" would end the element.
std::string script_json(const json& j) {
  std::string s = j.dump();
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/')
      o += "<\\/", ++i;
    else
      o += s[i];
  }
  return o;
}

// The spans of one step from the merged trace: every rank's "step N" span gives the
// window; spans overlapping it are kept (the longest max_spans of them), with times in
// milliseconds from the window's start.
json timeline(const std::string& path, int64_t want_step, size_t max_spans) {
  if (!fs::exists(path)) return nullptr;
  json trace;
  try {
    trace = json::parse(read_file(path));
  } catch (const json::exception&) {
    throw UserError(path + " is not JSON",
                    "the run was cut while writing it; run with "
                    "train.profile = true again or move the file away");
  }
  const json& events = trace.contains("traceEvents") ? trace["traceEvents"] : trace;
  std::map<int64_t, std::pair<double, double>> steps;  // step -> window over every rank
  std::map<std::pair<int, int>, std::string> names;    // (pid, tid) -> thread name
  for (const json& e : events) {
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "thread_name")
      names[{e.value("pid", 0), e.value("tid", 0)}] = e["args"].value("name", "");
    if (ph != "X" || e.value("cat", "") != "step") continue;
    const std::string name = e.value("name", "");
    if (name.rfind("step ", 0) != 0) continue;
    const int64_t s = std::stoll(name.substr(5));
    const double t0 = e.value("ts", 0.0), t1 = t0 + e.value("dur", 0.0);
    auto [it, fresh] = steps.emplace(s, std::make_pair(t0, t1));
    if (!fresh) it->second = {std::min(it->second.first, t0), std::max(it->second.second, t1)};
  }
  if (steps.empty()) return nullptr;
  int64_t step = want_step > 0 ? want_step : steps.rbegin()->first;
  if (!steps.count(step))
    throw UserError("the trace has no step " + std::to_string(want_step),
                    "it holds steps " + std::to_string(steps.begin()->first) + " to " +
                        std::to_string(steps.rbegin()->first) + "; pick one of them with --step");
  const auto [w0, w1] = steps[step];
  struct Span {
    int pid, tid;
    double t, d;
    std::string name, cat;
    json args;
  };
  std::vector<Span> spans;
  for (const json& e : events) {
    if (e.value("ph", "") != "X") continue;
    const double t0 = e.value("ts", 0.0), d = e.value("dur", 0.0);
    if (t0 + d < w0 || t0 > w1) continue;
    spans.push_back({e.value("pid", 0), e.value("tid", 0), t0, d, e.value("name", ""),
                     e.value("cat", ""), e.contains("args") ? e["args"] : json(nullptr)});
  }
  if (spans.size() > max_spans) {
    std::nth_element(spans.begin(), spans.begin() + static_cast<long>(max_spans), spans.end(),
                     [](const Span& a, const Span& b) { return a.d > b.d; });
    spans.resize(max_spans);
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.pid, a.tid, a.t) < std::tie(b.pid, b.tid, b.t);
  });
  std::set<std::pair<int, int>> tracks;
  for (const Span& s : spans) tracks.insert({s.pid, s.tid});
  json jt = json::array(), js = json::array();
  std::map<std::pair<int, int>, int> index;
  for (const auto& k : tracks) {
    index[k] = static_cast<int>(jt.size());
    const auto n = names.find(k);
    jt.push_back({{"rank", k.first},
                  {"name", n != names.end() ? n->second : "thread " + std::to_string(k.second)}});
  }
  for (const Span& s : spans)
    js.push_back({index[{s.pid, s.tid}], (s.t - w0) / 1e3, s.d / 1e3, s.name, s.cat, s.args});
  return {{"step", step},
          {"ms", (w1 - w0) / 1e3},
          {"tracks", jt},
          {"spans", js},
          {"steps", json(std::vector<int64_t>{steps.begin()->first, steps.rbegin()->first})}};
}

}  // namespace

std::string write_report(const ReportOptions& opt) {
  const std::string dir = opt.run_dir;
  if (!fs::is_directory(dir))
    throw UserError("'" + dir + "' is not a folder", "give the run.dir of a `loom train` run");
  std::vector<json> metrics = read_jsonl(dir + "/metrics.jsonl", true);
  namespace mf = loom::profile::metrics;
  using F = mf::PerRank;
  json steps = json::array(), vals = json::array();
  for (json& m : metrics) {
    if (m.contains(mf::kLoss.key))
      steps.push_back(std::move(m));
    else if (m.contains(mf::kValLoss))
      vals.push_back(std::move(m));
  }
  if (steps.empty())
    throw UserError(dir + "/metrics.jsonl has no training steps",
                    "run `loom train` until it logs a step, then report");
  json system = json::array();
  for (json& s : read_jsonl(dir + "/system.jsonl", false)) system.push_back(std::move(s));
  const json trace = timeline(dir + "/trace.json", opt.step, opt.max_spans);
  std::string config;
  if (fs::exists(dir + "/config.toml")) config = read_file(dir + "/config.toml");

  // The summary, from metrics.jsonl (the test reads these cells back).
  auto med = [&](const char* key, double scale) {
    std::vector<double> v;
    for (const json& s : steps)
      if (s.contains(key)) v.push_back(s[key].get<double>() * scale);
    return median(v);
  };
  auto max_over_ranks = [&](const char* key) {
    double m = NAN;
    for (const json& s : steps)
      if (s.contains(key))
        for (const json& x : s[key])
          m = std::isnan(m) ? x.get<double>() : std::max(m, x.get<double>());
    return m;
  };
  std::vector<double> share;  // exposed communication / step time, mean over ranks
  for (const json& s : steps) {
    const char* exposed = mf::key(F::kExposedCommMs);
    if (!s.contains(exposed)) continue;
    double sum = 0;
    for (const json& x : s[exposed]) sum += x.get<double>();
    share.push_back(sum / s[exposed].size() / s[mf::kStepMs.key].get<double>());
  }
  // Pipelines: the stages' idle share of the step, mean over the stages — measured (the step
  // less the stage's passes, optimizer and data) and the schedule's own with the measured
  // passes (pp_schedule_idle_ms): the rest is what transfers and the runtime add.
  std::vector<double> pp_idle, pp_schedule_idle;
  for (const json& s : steps) {
    const char* sched = mf::key(F::kPpScheduleIdleMs);
    if (!s.contains(sched)) continue;
    const double step = s[mf::kStepMs.key].get<double>();
    const size_t n = s[sched].size();
    double idle = 0, own = 0;
    for (size_t r = 0; r < n; ++r) {
      idle += step - s[mf::key(F::kComputeMs)][r].get<double>() -
              s[mf::key(F::kOptimMs)][r].get<double>() - s[mf::key(F::kDataMs)][r].get<double>();
      own += s[sched][r].get<double>();
    }
    pp_idle.push_back(idle / n / step), pp_schedule_idle.push_back(own / n / step);
  }
  double best_val = NAN;
  for (const json& v : vals)
    best_val = std::isnan(best_val) ? v[mf::kValLoss].get<double>()
                                    : std::min(best_val, v[mf::kValLoss].get<double>());
  const json& last = steps.back();
  const char* rss = mf::key(F::kRssPeakMb);
  const int ranks = last.contains(rss) ? static_cast<int>(last[rss].size()) : 1;
  struct Row {
    const char* key;
    const char* label;
    std::string value;
  };
  auto num = [](const char* f, double x) { return std::isnan(x) ? std::string("–") : fmt(f, x); };
  const std::vector<Row> rows = {
      {"steps", "steps", std::to_string(last[mf::kStep].get<int64_t>())},
      {"ranks", "ranks", std::to_string(ranks)},
      {"final_loss", "final training loss", num("%.4f", last[mf::kLoss.key].get<double>())},
      {"best_val_loss", "best validation loss", num("%.4f", best_val)},
      {"median_step_ms", "median step (ms)", num("%.1f", med(mf::kStepMs.key, 1))},
      {"median_tokens_per_s", "median tokens/s", num("%.0f", med(mf::kTokensPerS.key, 1))},
      {"median_mfu_pct", "median MFU (%)", num("%.2f", med(mf::kMfu.key, 100))},
      {"median_exposed_comm_pct", "median exposed communication (% of step)",
       num("%.1f", median(share) * 100)},
      {"median_pp_idle_pct", "median pipeline idle (% of step, mean of the stages)",
       num("%.1f", median(pp_idle) * 100)},
      {"median_pp_schedule_idle_pct",
       "of it, the schedule's own with the measured passes (% of step)",
       num("%.1f", median(pp_schedule_idle) * 100)},
      {"peak_state_mb", "peak model state per rank (MiB)",
       num("%.1f", max_over_ranks(mf::key(F::kStatePeakMb)))},
      {"peak_rss_mb", "peak RSS per rank (MiB)", num("%.1f", max_over_ranks(rss))},
  };

  std::ostringstream h;
  const std::string name = fs::path(fs::absolute(dir)).lexically_normal().filename().string();
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>loom report: "
    << html_escape(name) << "</title>\n<style>" << kReportCss << "</style></head><body>\n"
    << "<header><h1>loom report <span>" << html_escape(name) << "</span></h1></header>\n<main>\n"
    << "<section><h2>Summary</h2><table id=\"summary\">";
  for (const Row& r : rows)
    h << "<tr data-key=\"" << r.key << "\"><th>" << r.label << "</th><td class=\"v\">" << r.value
      << "</td></tr>";
  h << "</table></section>\n";
  struct Chart {
    const char* id;
    const char* title;
  };
  const std::vector<Chart> charts = {
      {"loss", "Loss (training, validation)"},
      {"tokens", "Tokens per second"},
      {"mfu", "MFU (% of measured peak)"},
      {"lr", "Learning rate"},
      {"gradnorm", "Gradient norm (before clipping)"},
      {"breakdown", "Time per step by kind (mean over ranks, ms)"},
      {"commshare", "Exposed communication per rank (median % of step)"},
      {"memory", "Memory per rank at the last step (MiB)"},
      {"cpu", "System: CPU (and GPU) busy per core (%), process RSS (MiB / 100)"},
      {"io", "System: disk and network (MB/s)"},
      {"timeline", "Timeline of one step"},
  };
  h << "<section><h2>Charts</h2><div class=\"grid\">\n";
  for (const Chart& c : charts)
    h << "<figure class=\"chart" << (std::string(c.id) == "timeline" ? " wide" : "")
      << "\" id=\"chart-" << c.id << "\"><figcaption>" << c.title
      << "</figcaption><div class=\"plot\"></div><div class=\"legend\"></div></figure>\n";
  h << "</div></section>\n";
  if (!config.empty())
    h << "<section><h2>Configuration</h2><pre id=\"config\">" << html_escape(config)
      << "</pre></section>\n";
  h << "</main>\n<script type=\"application/json\" id=\"data\">"
    << script_json({{"steps", steps}, {"vals", vals}, {"system", system}, {"trace", trace}})
    << "</script>\n<script>" << kReportJs << "</script>\n</body></html>\n";
  const std::string out = opt.out.empty() ? dir + "/report.html" : opt.out;
  try {
    write_file_atomic(out, h.str());
  } catch (const std::exception& e) {
    throw UserError("cannot write " + out + ": " + e.what(), "pass --out with a writable path");
  }
  return out;
}

}  // namespace loom::profile
