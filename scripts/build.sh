#!/usr/bin/env bash
# Configures and builds loom into build/ (or $1 with extra CMake arguments after it).
set -euo pipefail
dir=${1:-build}; shift || true
cmake -S "$(dirname "$0")/.." -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > /dev/null
cmake --build "$dir" -j "$(nproc)"
