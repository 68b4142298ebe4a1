#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (Release, GCC, warnings as
# errors) and runs every unit, multi-process and end-to-end test and PyTorch's own
# distributed suite (20-30 minutes on 2 cores from a fresh clone, by the host's speed and
# the compiler cache). The sanitizer builds and the fuzzer are scripts/sanitize.sh (25-38
# minutes more); CI (.ci/run) runs both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$(date +%s)
step() { printf '\n=== %s (%ds)\n' "$1" $(( $(date +%s) - start )); }

step "formatting (.clang-format)"
git ls-files '*.cc' '*.h' '*.c' | xargs clang-format --dry-run --Werror

step "release build"
bash scripts/build.sh build
step "unit and multi-process tests"
ctest --test-dir build --output-on-failure -j 1
step "all tests passed"
