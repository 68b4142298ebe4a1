#pragma once

#include <CLI/CLI.hpp>

namespace loom::apps {
// Registers `loom bench` on the app; returns the handler to call when it was chosen.
std::function<int()> add_bench_command(CLI::App& app);
}  // namespace loom::apps
