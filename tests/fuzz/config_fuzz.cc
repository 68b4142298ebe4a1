// libFuzzer target for the training configuration: arbitrary bytes as the TOML file, and
// each line after a NUL byte as a --set override. Every input must load, or be refused
// with a UserError; a configuration that loads must resolve its batch on 1-8 ranks or be
// refused the same way, and print back as TOML that loads to the same configuration.
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loom/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::train::TrainConfig;
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string file = in.substr(0, nul);
  std::vector<std::string> sets;
  if (nul != std::string::npos) {
    std::string rest = in.substr(nul + 1);
    for (size_t at = 0; at <= rest.size();) {
      const size_t end = std::min(rest.find('\n', at), rest.size());
      sets.push_back(rest.substr(at, end - at));
      at = end + 1;
    }
  }
  const std::string path = loom::fuzz::put("train.toml", file);
  loom::fuzz::expect_user_errors([&] {
    TrainConfig c = TrainConfig::load(path, sets);
    // What `loom train` writes into the run folder must read back as the same settings.
    const std::string again = c.to_toml();
    TrainConfig d = TrainConfig::load(loom::fuzz::put("resolved.toml", again), {});
    if (d.to_toml() != again) __builtin_trap();
    for (int dp = 1; dp <= 8; dp *= 2) {
      TrainConfig e = c;
      loom::fuzz::expect_user_errors([&] { e.resolve_batch(dp); });
    }
  });
  return 0;
}
