// `loom export --ckpt RUN_OR_STEP --format hf|gguf --out PATH` and
// `loom eval --model PATH --data PREP_DIR [--split val] [--task FILE.jsonl]`.
#include "model_io.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/comm/bootstrap.h"
#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/interop/export.h"
#include "loom/interop/model_files.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/gpt.h"
#include "loom/train/evaluate.h"

namespace loom::apps {

std::function<int()> add_export_command(CLI::App& app) {
  struct Args {
    std::string ckpt, format, out, dtype = "f32", vocab;
  };
  auto a = std::make_shared<Args>();
  CLI::App* e = app.add_subcommand(
      "export", "write a model as Hugging Face safetensors (hf) or a GGUF file for llama.cpp");
  e->add_option("--ckpt,--model", a->ckpt,
                "a checkpoint folder or run.dir (its newest checkpoint; any layout wrote it), or "
                "a Hugging Face GPT-2 folder / .safetensors file")
      ->required();
  e->add_option("--format", a->format, "hf: a from_pretrained() folder; gguf: one .gguf file")
      ->required()
      ->check(CLI::IsMember({"hf", "gguf"}));
  e->add_option("--out,-o", a->out, "the folder (hf) or file (gguf) to write; must not exist")
      ->required();
  e->add_option("--dtype", a->dtype,
                "f32, f16 or bf16: the matrices' and embeddings' type (norms and biases stay f32) "
                "(default f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  e->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  return [a]() -> int {
    const interop::ModelFile m = interop::open_model(a->ckpt);
    auto tok = data::Gpt2Tokenizer::load(a->vocab);
    const DType dtype = *parse_dtype(a->dtype);
    const interop::ExportSummary s = a->format == "hf"
                                         ? interop::export_hf(m, a->out, dtype, *tok)
                                         : interop::export_gguf(m, a->out, dtype, *tok);
    std::printf("export: %s (%s, %s) -> %s: %zu tensors, %.1f MB (%s), %.1f s\n",
                m.config.name.c_str(), m.kind.c_str(), m.path.c_str(), a->out.c_str(), s.tensors,
                s.bytes / 1e6, a->dtype.c_str(), s.seconds);
    if (a->format == "gguf")
      std::printf("export: run it with llama.cpp, e.g. llama-cli -m %s -p \"Hello\" -n 40\n",
                  a->out.c_str());
    return 0;
  };
}

std::function<int()> add_eval_command(CLI::App& app) {
  struct Args {
    std::string model, data, split = "val", task, vocab, dtype = "fp32", tokens, logits_out;
    int seq = 0, batch = 8, threads = 0;
    int64_t max_sequences = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* e = app.add_subcommand(
      "eval",
      "score a model: loss, perplexity and bits per byte over a split, and multiple-choice "
      "tasks (HellaSwag's layout)");
  e->add_option("--model,--ckpt", a->model,
                "a loom checkpoint or run.dir, a Hugging Face GPT-2 folder or .safetensors file")
      ->required();
  e->add_option("--data", a->data, "a `loom prep` folder: the loss over its --split");
  e->add_option("--split", a->split, "train or val (default val)")
      ->check(CLI::IsMember({"train", "val"}));
  e->add_option("--seq", a->seq, "tokens per sequence (default: the model's context)");
  e->add_option("--batch", a->batch, "sequences per forward (default 8)");
  e->add_option("--max-sequences", a->max_sequences, "score at most this many (default: all)");
  e->add_option("--task", a->task,
                "a multiple-choice file, one {\"ctx\", \"endings\", \"label\"} per line: acc and "
                "acc_norm");
  e->add_option("--dtype", a->dtype, "fp32 or bf16 products (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  e->add_option("--threads", a->threads, "OpenMP threads per rank (default: the cores / ranks)");
  e->add_option("--vocab", a->vocab, "r50k_base.tiktoken (default: the cached one)");
  e->add_flag("--json", a->json, "print the results as one JSON object");
  e->add_option("--tokens", a->tokens, "comma-separated token ids: with --logits-out");
  e->add_option("--logits-out", a->logits_out,
                "write the next-token logits after each of --tokens to this file: positions x "
                "vocabulary float32, row-major (a probe for comparing with other programs)");
  return [a]() -> int {
    if (a->data.empty() && a->task.empty() && a->logits_out.empty())
      throw UserError("nothing to evaluate", "pass --data PREP_DIR and/or --task FILE.jsonl");
    if (a->tokens.empty() != a->logits_out.empty())
      throw UserError("--tokens and --logits-out go together", "pass both, or neither");
    std::vector<int> probe;
    for (size_t at = 0; at < a->tokens.size();) {
      const size_t comma = std::min(a->tokens.find(',', at), a->tokens.size());
      try {
        probe.push_back(std::stoi(a->tokens.substr(at, comma - at)));
      } catch (const std::exception&) {
        throw UserError("--tokens '" + a->tokens + "' is not a list of ids",
                        "e.g. --tokens 464,3290");
      }
      at = comma + 1;
    }
    if (a->batch < 1) throw UserError("--batch must be at least 1", "e.g. --batch 8");
    const comm::LaunchInfo li = comm::launch_info_from_env();
    omp_set_num_threads(a->threads > 0 ? a->threads
                                       : std::max(1, cpus_available() / li.local_size));
    const interop::ModelFile mf = interop::open_model(a->model);
    const int T = a->seq > 0 ? a->seq : mf.config.block_size;
    if (T > mf.config.block_size)
      throw UserError("--seq " + std::to_string(T) + " exceeds the context of " + mf.config.name +
                          " (" + std::to_string(mf.config.block_size) + ")",
                      "lower --seq");
    // Everything that can be wrong with the input is checked before the ranks connect.
    std::vector<train::ChoiceItem> items;
    if (!a->task.empty()) items = train::read_choice_task(a->task);
    std::shared_ptr<const data::Gpt2Tokenizer> tok;
    if (!items.empty()) tok = data::Gpt2Tokenizer::load(a->vocab);
    std::shared_ptr<comm::Communicator> world;
    if (li.size > 1) world = comm::init_from_env();
    model::Gpt m(mf.config, true, {}, /*with_grads=*/false);
    m.set_precision(a->dtype == "bf16" ? kernels::cpu::Precision::kBF16
                                       : kernels::cpu::Precision::kF32);
    interop::load_params(*mf.weights, m);
    const train::NllFn nll = [&](const int* x, const int* y, int B, int Tn, float* out) {
      m.forward(x, y, B, Tn);
      std::copy_n(m.losses(), static_cast<size_t>(B) * Tn, out);
    };
    const train::GatherFn gather = [&](const std::vector<double>& mine) {
      if (!world) return mine;
      std::vector<double> all(mine.size() * li.size);
      world->allgather(mine.data(), all.data(), mine.size(), DType::kF64);
      return all;
    };
    nlohmann::json out = {{"model", mf.config.name}, {"source", mf.path}, {"ranks", li.size}};
    if (!a->data.empty()) {
      const train::SplitLoss s = train::split_loss(a->data, a->split, T, a->batch, a->max_sequences,
                                                   nll, li.rank, li.size, gather);
      out["split"] = {{"split", a->split},
                      {"sequences", s.sequences},
                      {"seq_len", T},
                      {"tokens", s.tokens},
                      {"loss", s.loss},
                      {"perplexity", s.perplexity},
                      {"bits_per_byte", s.bits_per_byte}};
      if (!a->json && li.rank == 0)
        std::printf(
            "eval: %s (%s) on %s/%s: %llu sequences x %d tokens: loss %.4f, perplexity %.3f, "
            "bits per byte %s\n",
            mf.config.name.c_str(), mf.path.c_str(), a->data.c_str(), a->split.c_str(),
            static_cast<unsigned long long>(s.sequences), T, s.loss, s.perplexity,
            s.bits_per_byte > 0 ? std::to_string(s.bits_per_byte).c_str()
                                : "n/a (the prep folder predates byte counts)");
    }
    if (!items.empty()) {
      const train::ChoiceScores c =
          train::score_choices(items, tok, T + 1, nll, li.rank, li.size, gather);
      out["task"] = {{"file", a->task},
                     {"items", c.items},
                     {"acc", c.acc},
                     {"acc_norm", c.acc_norm},
                     {"loglik", c.loglik}};
      if (!a->json && li.rank == 0)
        std::printf("eval: task %s: %lld items: acc %.4f, acc_norm %.4f\n", a->task.c_str(),
                    static_cast<long long>(c.items), c.acc, c.acc_norm);
    }
    if (!probe.empty() && li.rank == 0) {
      const int n = static_cast<int>(probe.size());
      if (n > mf.config.block_size)
        throw UserError("--tokens holds " + std::to_string(n) + " ids, more than the context",
                        "pass at most " + std::to_string(mf.config.block_size));
      m.forward(probe.data(), nullptr, 1, n);
      const int V = mf.config.vocab_size, Vp = mf.config.padded_vocab_size;
      AtomicFileWriter f(a->logits_out);
      for (int t = 0; t < n; ++t)
        f.write(m.logits() + static_cast<size_t>(t) * Vp, V * sizeof(float));
      f.commit();
      out["logits"] = {{"file", a->logits_out}, {"positions", n}, {"vocab", V}};
    }
    if (a->json && li.rank == 0) std::printf("%s\n", out.dump().c_str());
    return 0;
  };
}

}  // namespace loom::apps
