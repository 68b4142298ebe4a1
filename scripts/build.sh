#!/usr/bin/env bash
# Configures and builds loom into build/ (or $1 with extra CMake arguments after it): the
# Release type users build (-O3), with warnings as errors.
set -euo pipefail
dir=${1:-build}; shift || true
cmake -S "$(dirname "$0")/.." -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON "$@" > /dev/null
cmake --build "$dir" -j "$(nproc)"
