#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::apps {
// Registers `loom train` and `loom sample`; each returns the handler to call when chosen.
std::function<int()> add_train_command(CLI::App& app);
std::function<int()> add_sample_command(CLI::App& app);
}  // namespace loom::apps
