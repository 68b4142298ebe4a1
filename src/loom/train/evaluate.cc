#include "loom/train/evaluate.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::train {

namespace {

// Text bytes behind a split's tokens, from the prep manifest (0 when it predates them).
std::pair<uint64_t, uint64_t> split_counts(const std::string& dir, const std::string& split) {
  nlohmann::json m = nlohmann::json::parse(read_file(dir + "/manifest.json"), nullptr, false);
  if (m.is_discarded() || !m.contains("splits") || !m["splits"].contains(split)) return {0, 0};
  const auto& s = m["splits"][split];
  return {s.value("tokens", uint64_t{0}), s.value("text_bytes", uint64_t{0})};
}

// UTF-8 characters of s (what Python's len() counts on the decoded string).
double characters(const std::string& s) {
  double n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return std::max(n, 1.0);  // an empty ending: no division by zero
}

}  // namespace

SplitLoss split_loss(const std::string& dir, const std::string& split, int T, int batch,
                     int64_t max_sequences, const NllFn& nll, int rank, int world,
                     const GatherFn& gather) {
  const data::TokenDataset d = data::TokenDataset::open(dir, split);
  if (d.tokens() < static_cast<uint64_t>(T) + 1)
    throw UserError("the " + split + " split of " + dir + " holds " + std::to_string(d.tokens()) +
                        " tokens, fewer than one sequence of " + std::to_string(T + 1),
                    "use a shorter --seq, or prepare more text (loom prep --val-fraction)");
  uint64_t S = (d.tokens() - 1) / static_cast<uint64_t>(T);
  if (max_sequences > 0) S = std::min<uint64_t>(S, static_cast<uint64_t>(max_sequences));
  const uint64_t batches = (S + batch - 1) / batch;
  const uint64_t per_rank = (batches + world - 1) / world;
  std::vector<double> mine(per_rank, 0.0);
  std::vector<int32_t> window(static_cast<size_t>(batch) * (T + 1));
  std::vector<int> x(static_cast<size_t>(batch) * T), y(x.size());
  std::vector<float> out(x.size());
  for (uint64_t k = 0; k < per_rank; ++k) {
    const uint64_t b = k * world + rank;
    if (b >= batches) break;
    const int n = static_cast<int>(std::min<uint64_t>(batch, S - b * batch));
    for (int i = 0; i < n; ++i) {
      const uint64_t j = b * batch + i;
      int32_t* w = window.data() + static_cast<size_t>(i) * (T + 1);
      d.read(j * T, static_cast<size_t>(T) + 1, w);
      for (int t = 0; t < T; ++t) x[i * T + t] = w[t], y[i * T + t] = w[t + 1];
    }
    nll(x.data(), y.data(), n, T, out.data());
    double sum = 0;
    for (int i = 0; i < n * T; ++i) sum += out[i];
    mine[k] = sum;
  }
  const std::vector<double> all = gather(mine);  // rank-major: batch b is all[(b%W)*per + b/W]
  double total = 0;
  for (uint64_t b = 0; b < batches; ++b) total += all[(b % world) * per_rank + b / world];
  SplitLoss r;
  r.sequences = S;
  r.tokens = S * static_cast<uint64_t>(T);
  r.loss = total / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  const auto [tokens, bytes] = split_counts(dir, split);
  if (bytes > 0) r.bits_per_byte = r.loss * static_cast<double>(tokens) / bytes / std::log(2.0);
  return r;
}

std::vector<ChoiceItem> read_choice_task(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UserError("cannot read task file " + path, "check the path");
  std::vector<ChoiceItem> items;
  std::string line;
  for (int lineno = 1; std::getline(f, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto bad = [&](const std::string& why) {
      return UserError(path + ":" + std::to_string(lineno) + ": " + why,
                       "a line is {\"ctx\": \"...\", \"endings\": [\"...\", ...], \"label\": N} "
                       "(HellaSwag's layout)");
    };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    if (!j.contains("ctx") || !j["ctx"].is_string()) throw bad("no string \"ctx\"");
    if (!j.contains("endings") || !j["endings"].is_array() || j["endings"].size() < 2)
      throw bad("no \"endings\" array of two or more");
    ChoiceItem it;
    it.ctx = j["ctx"];
    for (const auto& e : j["endings"]) {
      if (!e.is_string()) throw bad("an ending is not a string");
      it.endings.push_back(e);
    }
    const nlohmann::json& label = j.contains("label") ? j["label"] : nlohmann::json();
    // HellaSwag's own files write the label as a string ("2").
    if (label.is_number_integer()) {
      it.label = label;
    } else if (label.is_string() && !label.get<std::string>().empty() &&
               label.get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
      it.label = std::stoi(label.get<std::string>());
    } else {
      throw bad("no integer \"label\"");
    }
    if (it.label < 0 || it.label >= static_cast<int>(it.endings.size()))
      throw bad("label " + std::to_string(it.label) + " is not an ending's index");
    items.push_back(std::move(it));
  }
  if (items.empty()) throw UserError("task file " + path + " holds no items", "check the file");
  return items;
}

ChoiceScores score_choices(const std::vector<ChoiceItem>& items,
                           std::shared_ptr<const data::Gpt2Tokenizer> tok, int context,
                           const NllFn& nll, int rank, int world, const GatherFn& gather) {
  data::Gpt2Tokenizer::Encoder enc(std::move(tok));
  size_t most = 0;
  for (const auto& it : items) most = std::max(most, it.endings.size());
  const size_t per_rank = (items.size() + world - 1) / world;
  std::vector<double> mine(per_rank * most, 0.0);
  // Every rank makes per_rank calls of `most` rows each (a rank past the last item scores
  // item 0 again and drops it; an item with fewer endings repeats its first), so ranks that
  // share collectives inside nll (a parallel layout's forward) stay in step.
  const int B = static_cast<int>(most);
  for (size_t k = 0; k < per_rank; ++k) {
    const size_t i = k * world + rank;
    const ChoiceItem& it = items[i < items.size() ? i : 0];
    const size_t n_ctx = enc.encode(it.ctx).size();
    std::vector<std::vector<int>> seqs;
    std::vector<int> cont;  // continuation tokens of each ending
    int T = 1;
    for (const auto& e : it.endings) {
      std::vector<int> s = enc.encode(it.ctx + " " + e);
      cont.push_back(static_cast<int>(s.size() - std::min(s.size(), n_ctx)));
      if (static_cast<int>(s.size()) > context) s.erase(s.begin(), s.end() - context);
      cont.back() = std::min<int>(cont.back(), static_cast<int>(s.size()) - 1);
      T = std::max(T, static_cast<int>(s.size()) - 1);
      seqs.push_back(std::move(s));
    }
    std::vector<int> x(static_cast<size_t>(B) * T, 0), y(x.size(), 0);
    for (int b = 0; b < B; ++b) {
      const std::vector<int>& seq = seqs[b < static_cast<int>(seqs.size()) ? b : 0];
      for (size_t t = 0; t + 1 < seq.size(); ++t) x[b * T + t] = seq[t], y[b * T + t] = seq[t + 1];
    }
    std::vector<float> out(x.size());
    nll(x.data(), y.data(), B, T, out.data());
    if (i >= items.size()) continue;
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int len = static_cast<int>(seqs[b].size()) - 1;
      double ll = 0;
      for (int t = len - cont[b]; t < len; ++t) ll -= out[b * T + t];
      mine[k * most + b] = ll;
    }
  }
  const std::vector<double> all = gather(mine);
  ChoiceScores s;
  s.items = static_cast<int64_t>(items.size());
  double correct = 0, correct_norm = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const double* ll = all.data() + ((i % world) * per_rank + i / world) * most;
    const ChoiceItem& it = items[i];
    s.loglik.emplace_back(ll, ll + it.endings.size());
    size_t best = 0, best_norm = 0;
    for (size_t e = 1; e < it.endings.size(); ++e) {
      if (ll[e] > ll[best]) best = e;
      if (ll[e] / characters(it.endings[e]) > ll[best_norm] / characters(it.endings[best_norm]))
        best_norm = e;
    }
    correct += best == static_cast<size_t>(it.label);
    correct_norm += best_norm == static_cast<size_t>(it.label);
  }
  s.acc = correct / static_cast<double>(items.size());
  s.acc_norm = correct_norm / static_cast<double>(items.size());
  return s;
}

}  // namespace loom::train
