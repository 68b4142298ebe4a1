#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::apps {
// Registers `loom report`; returns the handler to call when it was chosen.
std::function<int()> add_report_command(CLI::App& app);
}  // namespace loom::apps
