#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::apps {
// Registers `loom run -n N [--max-restarts K] [--] COMMAND...`.
std::function<int()> add_run_command(CLI::App& app);
}  // namespace loom::apps
