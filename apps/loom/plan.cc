// `loom plan`: the layouts of a model on a cluster that fit, with predicted memory and step
// time, best first; --out writes the best (or --pick N) as a config to start from.
#include "plan.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/plan/calibrate.h"
#include "loom/plan/planner.h"

namespace loom::apps {

std::function<int()> add_plan_command(CLI::App& app) {
  struct Args {
    std::string model = "gpt2-124m", device = "cpu", out;
    int seq = 0, nodes = 1, per_node = 0, global_batch = 0, top = 10, pick = 1, explain = 0,
        layers = 0, hidden = 0, heads = 0, vocab = 0, context = 0;
    bool flash = false, bf16 = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* p = app.add_subcommand(
      "plan",
      "list the layouts of a model on a cluster that fit, with predicted memory and step "
      "time, best first");
  p->add_option("--model,-m", a->model, "a named model (tiny, small, gpt2-124m ... gpt2-1558m)");
  p->add_option("--layers", a->layers, "override the model's layers");
  p->add_option("--hidden", a->hidden, "override the model's hidden size");
  p->add_option("--heads", a->heads, "override the model's heads");
  p->add_option("--vocab", a->vocab,
                "override the model's vocabulary (padded to a multiple of 128)");
  p->add_option("--context", a->context, "override the model's context (longest sequence)");
  p->add_option("--seq", a->seq, "sequence length (default: the model's context)");
  p->add_option("--nodes", a->nodes, "machines (default 1)");
  p->add_option("--per-node", a->per_node,
                "devices (GPUs) or ranks (cpu) per machine (default: 8 GPUs, or this machine's "
                "cores)");
  p->add_option("--device", a->device, "cpu (measured here), a100-40, a100-80, h100, h200");
  p->add_option("--global-batch,-b", a->global_batch, "sequences per optimizer step")->required();
  p->add_option("--top", a->top, "layouts to list (default 10)");
  p->add_option("--out,-o", a->out, "write the chosen layout as a config (TOML) here");
  p->add_option("--pick", a->pick, "which listed layout --out writes (default 1, the best)");
  p->add_option("--explain", a->explain,
                "break listed layout N's step and memory into their terms (0: none)");
  p->add_flag("--flash-attention", a->flash, "GPUs: attention keeps no s x s scores");
  p->add_flag("--bf16", a->bf16, "cpu: bf16 GEMMs (train.dtype = bf16)");
  return [a]() -> int {
    const model::GptConfig g = model::GptConfig::named(a->model).reshaped(
        a->layers, a->hidden, a->heads, a->vocab, a->context);
    g.validate();
    if (a->seq > g.block_size)
      throw UserError("--seq " + std::to_string(a->seq) + " exceeds " + g.name + "'s context " +
                          std::to_string(g.block_size),
                      "use --seq " + std::to_string(g.block_size) +
                          " or less, or give the model a longer context with --context " +
                          std::to_string(a->seq));
    plan::ModelShape m = plan::model_shape(g, a->seq > 0 ? a->seq : g.block_size);
    m.flash_attention = a->flash;
    if (a->global_batch < 1 || a->nodes < 1 || a->top < 1)
      throw UserError("--global-batch, --nodes and --top must be >= 1", "e.g. -b 16 --nodes 1");
    if (a->explain < 0)
      throw UserError("--explain " + std::to_string(a->explain) + " is not a listed layout",
                      "give the number the list shows, e.g. --explain 1");
    plan::Cluster c;
    c.nodes = a->nodes;
    const bool cpu = a->device == "cpu";
    const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    c.per_node = a->per_node > 0 ? a->per_node : (cpu ? cores : 8);
    if (cpu && c.nodes > 1)
      throw UserError("the cpu device is measured on this machine only",
                      "plan several machines with a GPU device (a100-80, h100, h200)");
    const int threads = std::max(1, cores / c.per_node);
    if (cpu) omp_set_num_threads(threads);
    c.device = cpu ? plan::cpu_device(c.per_node) : plan::gpu_device(a->device);
    std::map<std::tuple<int, int, bool>, plan::CpuCosts> measured;
    auto costs = [&](const plan::Layout& l) {
      auto key = std::make_tuple(l.micro_batch, l.tp, l.recompute);
      auto it = measured.find(key);
      if (it == measured.end()) {
        const plan::CpuShape s{g,           l.micro_batch,       m.seq,   l.tp,
                               l.recompute, l.sequence_parallel, a->bf16, threads};
        it = measured.emplace(key, plan::measure_cpu(s, c.per_node, 2)).first;
      }
      return it->second;
    };
    if (cpu)
      std::printf("plan: measuring loom's kernels at each shape (%d thread(s) per rank)...\n",
                  threads);
    const auto all = plan::enumerate(m, c, a->global_batch, costs);
    int fitting = 0;
    for (const auto& p : all) fitting += p.fits;
    std::printf(
        "plan: %s (%.1fM parameters, seq %d) on %d x %d %s (%.0f GB each), global batch %d: "
        "%d layouts, %d fit\n",
        m.name.c_str(), m.params() / 1e6, m.seq, c.nodes, c.per_node, c.device.name.c_str(),
        c.device.mem_gb, a->global_batch, static_cast<int>(all.size()), fitting);
    std::printf("%4s  %-52s %9s %9s %9s %10s %10s\n", "#", "layout", "state GB", "act GB", "step s",
                "tokens/s", "TFLOP/s/d");
    const double tokens = static_cast<double>(a->global_batch) * m.seq;
    for (int i = 0; i < std::min<int>(a->top, static_cast<int>(all.size())); ++i) {
      const auto& p = all[i];
      std::printf("%4d  %-52s %9.3f %9.3f %9.4f %10.0f %10.2f%s\n", i + 1,
                  p.layout.describe().c_str(), p.state() / 1e9, p.activations / 1e9, p.step_s(),
                  tokens / p.step_s(), p.tflops_per_device, p.fits ? "" : "  (does not fit)");
    }
    if (a->explain != 0) {
      if (a->explain < 1 || a->explain > static_cast<int>(all.size()))
        throw UserError("--explain " + std::to_string(a->explain) + " is not a listed layout",
                        "explain 1 to " + std::to_string(all.size()));
      std::printf("plan: layout %d, term by term\n%s", a->explain,
                  plan::explain(all[a->explain - 1]).c_str());
    }
    if (!a->out.empty()) {
      if (a->pick < 1 || a->pick > static_cast<int>(all.size()))
        throw UserError("--pick " + std::to_string(a->pick) + " is not a listed layout",
                        "pick 1 to " + std::to_string(all.size()));
      const auto& best = all[a->pick - 1];
      if (!best.fits)
        throw UserError("layout " + std::to_string(a->pick) + " does not fit in memory",
                        "use more devices, a smaller model or batch");
      write_file_atomic(a->out, plan::layout_toml(m, best.layout, a->global_batch));
      std::printf("plan: wrote layout %d (%s) to %s\n", a->pick, best.layout.describe().c_str(),
                  a->out.c_str());
    }
    return 0;
  };
}

}  // namespace loom::apps
