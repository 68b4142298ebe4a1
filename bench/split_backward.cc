// The split backward's own cost, without a pipeline around it: one process runs a run of
// blocks' backward whole (BW) and split into its input part and its weight part (B, then W:
// zero-bubble schedules), alternating on the same microbatch, and prints the medians and the
// timeline's products by pass (docs/perf.md, "ZB-H1's split backward").
//
//   build/bench/split_backward [MODEL] [BLOCKS] [B] [T] [REPEATS] [GAP]   (OMP_NUM_THREADS threads)
//
// Default gpt2-124m, 8 blocks (a pp 2 first stage), 2 x 256 tokens, 12 repeats. With GAP 1
// another microbatch's forward runs (untimed) between B and W and before BW, as a pipeline
// runs other passes between them: what they read has left the caches. Prints one JSON line
// per repeat and a summary: BW ms, B ms, W ms, (B + W) / BW.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "loom/model/gpt.h"
#include "loom/profile/trace.h"

using loom::model::Activations;
using loom::model::BackwardPart;
using loom::model::Gpt;
using loom::model::GptConfig;

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "gpt2-124m";
  const int blocks = argc > 2 ? std::atoi(argv[2]) : 8;
  const int B = argc > 3 ? std::atoi(argv[3]) : 2;
  const int T = argc > 4 ? std::atoi(argv[4]) : 256;
  const int repeats = argc > 5 ? std::atoi(argv[5]) : 12;
  const bool gap = argc > 6 && std::atoi(argv[6]) != 0;
  GptConfig cfg = GptConfig::named(model);
  Gpt gpt(cfg);
  gpt.init(1);
  // Units: 0 the embedding, 1..n_layer the blocks. A run of `blocks` blocks after the
  // embedding, as a first pipeline stage holds them; its output gradient is a fixed tensor.
  const int last = std::min(blocks, cfg.n_layer);
  std::vector<int> tokens(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7919) % 50000);
  std::vector<float> dout(static_cast<size_t>(B) * T * cfg.n_embd);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = 1e-3f * static_cast<float>((i % 97) - 48);
  Activations a, other;
  std::map<std::string, std::vector<double>> t;
  std::map<std::string, double> products;  // pass and shape -> ms over the timed repeats
  for (int rep = 0; rep < repeats + 1; ++rep) {
    const bool timed = rep > 0;  // the first repeat sizes the buffers
    loom::Trace::get().enable(timed);
    for (const std::string how : {"BW", "B+W"}) {
      const bool whole = how == "BW";
      gpt.forward_units(a, 0, last, tokens.data(), nullptr, B, T, nullptr);
      gpt.zero_grad();
      auto between = [&] {  // another microbatch's forward, untimed
        if (gap) gpt.forward_units(other, 0, last, tokens.data(), nullptr, B, T, nullptr);
      };
      if (whole) {
        between();
        const auto t0 = std::chrono::steady_clock::now();
        gpt.backward_units(a, 1.0f, dout.data(), BackwardPart::kWhole);
        if (timed) t["BW"].push_back(ms_since(t0));
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        gpt.backward_units(a, 1.0f, dout.data(), BackwardPart::kInput);
        const double b = ms_since(t0);
        between();
        const auto t1 = std::chrono::steady_clock::now();
        gpt.backward_units(a, 1.0f, nullptr, BackwardPart::kWeight);
        if (timed) t["B"].push_back(b), t["W"].push_back(ms_since(t1));
      }
      for (const auto& e : loom::Trace::get().take())
        if (e.ph == 'X' && std::string(e.cat) == "kernel")
          products[how + " " + e.name] += e.dur_us / 1e3;
    }
    if (timed)
      std::printf("{\"rep\":%d,\"bw_ms\":%.2f,\"b_ms\":%.2f,\"w_ms\":%.2f}\n", rep, t["BW"].back(),
                  t["B"].back(), t["W"].back());
  }
  const double bw = median(t["BW"]), b = median(t["B"]), w = median(t["W"]);
  std::printf(
      "# %s, %d blocks, %d x %d tokens, %d threads, %s, medians of %d: BW %.1f ms, B %.1f, "
      "W %.1f, (B + W) / BW %.3f\n",
      model.c_str(), last, B, T, omp_get_max_threads(), gap ? "a forward between" : "back to back",
      repeats, bw, b, w, (b + w) / bw);
  for (const auto& [name, ms] : products)
    std::printf("#   %-36s %8.1f ms a repeat\n", name.c_str(), ms / repeats);
  return 0;
}
