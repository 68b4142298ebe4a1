#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::apps {
// Registers `loom plan`; returns the handler to call when it was chosen.
std::function<int()> add_plan_command(CLI::App& app);
}  // namespace loom::apps
