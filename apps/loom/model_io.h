#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::apps {
// Registers `loom export` and `loom eval`; each returns the handler to call when chosen.
std::function<int()> add_export_command(CLI::App& app);
std::function<int()> add_eval_command(CLI::App& app);
}  // namespace loom::apps
