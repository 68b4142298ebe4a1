#include "loom/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "loom/core/error.h"

namespace loom::train {

namespace {

using FieldPtr = std::variant<int64_t*, double*, std::string*, bool*, std::vector<int64_t>*>;

struct Field {
  std::string key;
  FieldPtr ptr;
  // Returns what is wrong with the field's value, or "" when it is fine.
  std::function<std::string()> check;
};

std::string at_least(int64_t v, int64_t min) {
  return v >= min ? "" : "must be at least " + std::to_string(min);
}
std::string in_range(double v, double lo, double hi) {
  return v >= lo && v <= hi ? ""
                            : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}
std::string one_of(const std::string& v, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return "";
  std::string s = "must be one of";
  for (const auto& a : allowed) s += " " + a;
  return s;
}

std::vector<Field> fields_of(TrainConfig& c) {
  return {
      {"model.name", &c.model_name, [] { return std::string(); }},
      {"model.n_layer", &c.n_layer, [&] { return at_least(c.n_layer, 0); }},
      {"model.n_head", &c.n_head, [&] { return at_least(c.n_head, 0); }},
      {"model.n_embd", &c.n_embd, [&] { return at_least(c.n_embd, 0); }},
      {"model.vocab_size", &c.vocab_size, [&] { return in_range(c.vocab_size, 0, 65536); }},
      {"model.block_size", &c.block_size, [&] { return at_least(c.block_size, 0); }},
      {"data.path", &c.data_path, [] { return std::string(); }},
      {"train.steps", &c.steps, [&] { return at_least(c.steps, 1); }},
      {"train.micro_batch", &c.micro_batch, [&] { return at_least(c.micro_batch, 1); }},
      {"train.seq_len", &c.seq_len, [&] { return at_least(c.seq_len, 1); }},
      {"train.grad_accum", &c.grad_accum, [&] { return at_least(c.grad_accum, 0); }},
      {"train.global_batch", &c.global_batch, [&] { return at_least(c.global_batch, 0); }},
      {"train.seed", &c.seed, [&] { return at_least(c.seed, 0); }},
      {"train.dtype", &c.dtype,
       [&] {
         return one_of(c.dtype, {"auto", "fp32", "bf16"});
       }},
      {"train.threads", &c.threads, [&] { return at_least(c.threads, 0); }},
      {"train.backend", &c.backend,
       [&] {
         return one_of(c.backend, {"cpu", "reference"});
       }},
      {"train.on_nonfinite", &c.on_nonfinite,
       [&] {
         return one_of(c.on_nonfinite, {"stop", "skip", "rewind"});
       }},
      {"train.max_skips", &c.max_skips, [&] { return at_least(c.max_skips, 0); }},
      {"train.max_rewinds", &c.max_rewinds, [&] { return at_least(c.max_rewinds, 0); }},
      {"train.rewind_skip_samples", &c.rewind_skip_samples,
       [&] { return at_least(c.rewind_skip_samples, 0); }},
      {"train.spike_factor", &c.spike_factor,
       [&] {
         return c.spike_factor == 0 || (c.spike_factor > 1 && c.spike_factor <= 1e6)
                    ? ""
                    : "must be 0 (off) or a factor above 1, e.g. 4";
       }},
      {"train.recompute", &c.recompute,
       [&] {
         if (c.recompute == "none" || c.recompute == "all") return std::string();
         if (c.recompute.starts_with("every_")) {
           try {
             if (std::stoi(c.recompute.substr(6)) >= 1) return std::string();
           } catch (const std::exception&) {
           }
         }
         return std::string("must be none, all or every_K with K >= 1");
       }},
      {"train.zero", &c.zero,
       [&] { return c.zero >= 0 && c.zero <= 3 ? "" : "must be 0, 1, 2 or 3"; }},
      {"train.tp", &c.tp, [&] { return at_least(c.tp, 1); }},
      {"train.pp", &c.pp, [&] { return at_least(c.pp, 1); }},
      {"train.placement", &c.placement, [&] { return std::string(); }},  // checked by the mesh
      {"train.offload_activations", &c.offload_activations, [] { return std::string(); }},
      {"train.profile", &c.profile, [] { return std::string(); }},
      {"train.system_sample_s", &c.system_sample_s,
       [&] {
         return c.system_sample_s < 0 ? std::string("must be 0 (off) or a period in seconds")
                                      : std::string();
       }},
      {"train.activation_loading_horizon", &c.activation_loading_horizon,
       [&] { return at_least(c.activation_loading_horizon, 1); }},
      {"train.offload_dir", &c.offload_dir, [] { return std::string(); }},
      {"train.init_from", &c.init_from, [] { return std::string(); }},
      {"tp.sequence_parallel", &c.sequence_parallel, [] { return std::string(); }},
      {"pp.microbatches", &c.pp_microbatches, [&] { return at_least(c.pp_microbatches, 0); }},
      {"pp.schedule", &c.pp_schedule,
       [&] {
         return one_of(c.pp_schedule, {"gpipe", "1f1b", "interleaved", "zb-h1"});
       }},
      {"pp.virtual_stages", &c.pp_virtual_stages, [&] { return at_least(c.pp_virtual_stages, 1); }},
      {"pp.active_microbatches", &c.pp_active_microbatches,
       [&] { return at_least(c.pp_active_microbatches, 0); }},
      {"pp.head_split", &c.pp_head_split, [] { return std::string(); }},
      {"pp.split", &c.pp_split,
       [&] {
         for (int64_t n : c.pp_split)
           if (n < 1) return std::string("must list unit counts of at least 1");
         return std::string();
       }},
      {"zero.shard_group", &c.shard_group,
       [&] {
         return one_of(c.shard_group, {"world", "node"});
       }},
      {"zero.offload", &c.zero_offload,
       [&] {
         return one_of(c.zero_offload, {"none", "disk"});
       }},
      {"zero.offload_dir", &c.zero_offload_dir, [] { return std::string(); }},
      {"zero.overlap_step", &c.zero_overlap_step, [] { return std::string(); }},
      {"zero.offload_master", &c.zero_offload_master, [] { return std::string(); }},
      {"zero.comm_dtype", &c.comm_dtype,
       [&] {
         return one_of(c.comm_dtype, {"fp32", "bf16"});
       }},
      {"zero.shared_buffers", &c.shared_buffers,
       [&] {
         return one_of(c.shared_buffers, {"auto", "off"});
       }},
      {"zero.shared_gather", &c.shared_gather,
       [&] {
         return one_of(c.shared_gather, {"auto", "off"});
       }},
      {"optim.lr", &c.lr, [&] { return in_range(c.lr, 0, 10); }},
      {"optim.min_lr_ratio", &c.min_lr_ratio, [&] { return in_range(c.min_lr_ratio, 0, 1); }},
      {"optim.warmup_steps", &c.warmup_steps, [&] { return at_least(c.warmup_steps, 0); }},
      {"optim.beta1", &c.beta1, [&] { return in_range(c.beta1, 0, 0.999999); }},
      {"optim.beta2", &c.beta2, [&] { return in_range(c.beta2, 0, 0.999999); }},
      {"optim.eps", &c.eps, [&] { return in_range(c.eps, 0, 1); }},
      {"optim.weight_decay", &c.weight_decay, [&] { return in_range(c.weight_decay, 0, 10); }},
      {"optim.grad_clip", &c.grad_clip, [&] { return in_range(c.grad_clip, 0, 1e9); }},
      {"optim.lr_scale", &c.lr_scale,
       [&] {
         return one_of(c.lr_scale, {"none", "linear"});
       }},
      {"eval.every", &c.eval_every, [&] { return at_least(c.eval_every, 0); }},
      {"eval.batches", &c.eval_batches, [&] { return at_least(c.eval_batches, 1); }},
      {"eval.task", &c.eval_task, [] { return std::string(); }},
      {"ckpt.every", &c.ckpt_every, [&] { return at_least(c.ckpt_every, 0); }},
      {"ckpt.keep", &c.ckpt_keep, [&] { return at_least(c.ckpt_keep, 1); }},
      {"run.dir", &c.run_dir, [&] { return c.run_dir.empty() ? "must not be empty" : ""; }},
      {"run.log_every", &c.log_every, [&] { return at_least(c.log_every, 1); }},
      {"metrics.peak_gflops", &c.peak_gflops, [&] { return in_range(c.peak_gflops, 0, 1e9); }},
  };
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

UserError unknown_key(const std::string& key, const std::vector<Field>& fields,
                      const std::string& where) {
  std::string best;
  size_t best_d = 4;
  for (const auto& f : fields) {
    size_t d = edit_distance(key, f.key);
    if (d < best_d) best_d = d, best = f.key;
  }
  std::string hint = best.empty() ? "the keys are listed in docs/formats.md (training config)"
                                  : "did you mean '" + best + "'?";
  return UserError("unknown config key '" + key + "'" + where, hint);
}

// toml++ 3.3 (Debian 12) has undefined behaviour on some non-ASCII characters: its
// is_non_ascii_horizontal_whitespace() reaches __builtin_unreachable for U+00A1-U+0499,
// U+2C8E-U+3087 and U+FB66-U+FEFE (Latin-1 letters, Cyrillic, kana...) wherever it asks
// whether one is whitespace: outside strings, after a backslash in one, inside a bare
// token (found by tests/fuzz/config_fuzz.cc, three ways). So it never sees one: before
// parsing, every byte >= 0x80 and every '@' becomes "@XX" (two hex digits) — ASCII that
// TOML accepts inside strings and comments and nowhere else, as it does non-ASCII — and
// the strings read from the table are decoded back.
std::string ascii_encode(std::string_view text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char b : text) {
    if (b >= 0x80 || b == '@') {
      out += '@';
      out += hex[b >> 4];
      out += hex[b & 15];
    } else {
      out += static_cast<char>(b);
    }
  }
  return out;
}

std::string ascii_decode(std::string_view text) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'A' + 10; };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '@' && i + 2 < text.size() && std::isxdigit(text[i + 1]) &&
        std::isxdigit(text[i + 2])) {
      out += static_cast<char>(nibble(text[i + 1]) << 4 | nibble(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// The byte column in `text`'s line `line` of column `col` of its encoding (toml++'s error
// positions count the encoded text), and whether that byte is not ASCII.
std::pair<size_t, bool> original_column(std::string_view text, size_t line, size_t col) {
  size_t at = 0;
  for (size_t l = 1; l < line && at < text.size(); ++at)
    if (text[at] == '\n') ++l;
  size_t encoded = 1;
  for (size_t i = at; i < text.size() && text[i] != '\n'; ++i) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    encoded += (b >= 0x80 || b == '@') ? 3 : 1;
    if (encoded > col) return {i - at + 1, b >= 0x80};
  }
  return {col, false};
}

std::string describe(const toml::node& n) {
  std::ostringstream s;
  if (n.is_string())
    s << '"' << ascii_decode(*n.value<std::string>()) << '"';
  else if (n.is_table())
    s << "a table";
  else if (n.is_array())
    s << "an array";
  else
    n.visit([&](auto&& v) { s << v; });
  return s.str();
}

// Stores node `n` into field `f`, or throws naming the key and the expected type.
void assign(const Field& f, const toml::node& n) {
  auto wrong = [&](const char* want) {
    return UserError(f.key + " = " + describe(n) + " is invalid: expected " + want,
                     "fix the value in the config file or the --set override");
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!n.is_integer()) throw wrong("an integer");
          *p = *n.value<int64_t>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!n.is_number()) throw wrong("a number");
          *p = *n.value<double>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) throw wrong("true or false");
          *p = *n.value<bool>();
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          const toml::array* a = n.as_array();
          if (!a) throw wrong("an array of integers");
          p->clear();
          for (const toml::node& e : *a) {
            if (!e.is_integer()) throw wrong("an array of integers");
            p->push_back(*e.value<int64_t>());
          }
        } else {
          if (!n.is_string()) throw wrong("a string");
          *p = ascii_decode(*n.value<std::string>());
        }
      },
      f.ptr);
}

// An override's value as TOML ("3e-4", "true", "\"x\"", "[1,2]"); anything that does not
// parse as a TOML value is taken as a bare string (run.dir=runs/a).
toml::table override_value(const std::string& value) {
  try {
    toml::table t = toml::parse("v = " + ascii_encode(value));
    return t;
  } catch (const std::exception&) {
    toml::table t;
    t.insert("v", ascii_encode(value));  // (read back through ascii_decode, like all strings)
    return t;
  }
}

}  // namespace

TrainConfig TrainConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table root;
  if (!path.empty()) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream text;
    if (!f) throw UserError("cannot read config " + path, "check that the file exists");
    text << f.rdbuf();  // (an empty file inserts nothing and sets failbit: not an error)
    try {
      root = toml::parse(ascii_encode(text.str()), path);
    } catch (const toml::parse_error& e) {
      const auto& at = e.source().begin;
      const auto [column, non_ascii] = original_column(text.str(), at.line, at.column);
      throw UserError("cannot read config " + path + " (line " + std::to_string(at.line) +
                          ", column " + std::to_string(column) + "): " +
                          (non_ascii ? std::string("a non-ASCII character outside a string")
                                     : ascii_decode(e.description())),
                      "check that the file is valid TOML (keys are ASCII; put other text in "
                      "quotes)");
    }
  }
  TrainConfig c;
  std::vector<Field> fields = fields_of(c);
  std::map<std::string, const Field*> by_key;
  for (const auto& f : fields) by_key[f.key] = &f;

  // Every key in the file must be known.
  std::set<std::string> seen;
  for (auto&& [section, node] : root) {
    const std::string s = ascii_decode(section.str());
    if (!node.is_table()) throw unknown_key(s, fields, " in " + path);
    for (auto&& [key, value] : *node.as_table()) {
      const std::string full = s + "." + ascii_decode(key.str());
      auto it = by_key.find(full);
      if (it == by_key.end()) throw unknown_key(full, fields, " in " + path);
      assign(*it->second, value);
      c.model_name_set |= full == "model.name";
    }
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError("--set '" + o + "' is not key=value", "write it like --set optim.lr=3e-4");
    const std::string key = o.substr(0, eq);
    auto it = by_key.find(key);
    if (it == by_key.end()) throw unknown_key(key, fields, " (in --set)");
    toml::table v = override_value(o.substr(eq + 1));
    assign(*it->second, *v.get("v"));
    c.model_name_set |= key == "model.name";
  }
  for (const auto& f : fields)
    if (std::string what = f.check(); !what.empty()) {
      std::string shown;
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>)
              shown = '"' + *p + '"';
            else if constexpr (std::is_same_v<T, bool>)
              shown = *p ? "true" : "false";
            else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
              for (int64_t x : *p) shown += (shown.empty() ? "[" : ", ") + std::to_string(x);
              shown += shown.empty() ? "[]" : "]";
            } else
              shown = std::to_string(*p);
          },
          f.ptr);
      throw UserError(f.key + " = " + shown + " is invalid: " + what,
                      "fix the value in the config file or the --set override");
    }
  if (c.data_path.empty())
    throw UserError("data.path is not set",
                    "point it at a folder made by `loom prep` (--set data.path=DIR)");
  return c;
}

void TrainConfig::resolve_batch(int dp_size) {
  const int64_t per_accum = micro_batch * dp_size;
  if (global_batch == 0) {
    if (grad_accum == 0) grad_accum = 1;
    global_batch = per_accum * grad_accum;
    return;
  }
  if (global_batch % per_accum != 0)
    throw UserError("train.global_batch = " + std::to_string(global_batch) +
                        " is not a multiple of train.micro_batch (" + std::to_string(micro_batch) +
                        ") x data-parallel size (" + std::to_string(dp_size) + ")",
                    "choose a global batch that divides, or change micro_batch or the rank count");
  const int64_t derived = global_batch / per_accum;
  if (grad_accum != 0 && grad_accum != derived)
    throw UserError("train.grad_accum = " + std::to_string(grad_accum) +
                        " disagrees with train.global_batch = " + std::to_string(global_batch) +
                        " (micro_batch " + std::to_string(micro_batch) + " x " +
                        std::to_string(dp_size) + " ranks needs grad_accum " +
                        std::to_string(derived) + ")",
                    "set only one of train.global_batch and train.grad_accum");
  grad_accum = derived;
}

std::string TrainConfig::resolve_dtype(const std::string& requested, double fp32_gflops,
                                       double bf16_gflops, bool native_bf16) {
  if (requested != "auto") return requested;
  return native_bf16 && bf16_gflops >= 1.1 * fp32_gflops ? "bf16" : "fp32";
}

int TrainConfig::recompute_every() const {
  if (recompute == "none") return 0;
  if (recompute == "all") return 1;
  return std::stoi(recompute.substr(6));
}

std::string TrainConfig::to_toml() const {
  TrainConfig copy = *this;
  std::map<std::string, toml::table> sections;
  for (const auto& f : fields_of(copy)) {
    const size_t dot = f.key.find('.');
    toml::table& t = sections[f.key.substr(0, dot)];
    std::visit(
        [&](auto* p) {
          if constexpr (std::is_same_v<std::remove_pointer_t<decltype(p)>, std::vector<int64_t>>) {
            toml::array a;
            for (int64_t x : *p) a.push_back(x);
            t.insert(f.key.substr(dot + 1), std::move(a));
          } else if constexpr (std::is_same_v<std::remove_pointer_t<decltype(p)>, std::string>) {
            t.insert(f.key.substr(dot + 1), ascii_encode(*p));  // toml++ sees ASCII only
          } else {
            t.insert(f.key.substr(dot + 1), *p);
          }
        },
        f.ptr);
  }
  toml::table root;
  for (auto& [name, t] : sections) root.insert(name, std::move(t));
  std::ostringstream s;
  s << root << "\n";
  return ascii_decode(s.str());
}

optim::AdamWParams TrainConfig::adamw() const {
  return {static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps),
          static_cast<float>(weight_decay)};
}

optim::LrSchedule TrainConfig::schedule(double peak_lr) const {
  return {peak_lr, warmup_steps, steps, min_lr_ratio};
}

}  // namespace loom::train
