#!/usr/bin/env bash
# Configures and builds loom into build/ (or $1 with extra CMake arguments after it): the
# Release type users build (-O3), with warnings as errors.
set -euo pipefail
dir=${1:-build}; shift || true
source "$(dirname "$0")/compiler_cache.sh"
cmake -S "$(dirname "$0")/.." -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON \
  "${LOOM_LAUNCHER[@]}" "$@" > /dev/null
((${#LOOM_LAUNCHER[@]})) && ccache --zero-stats > /dev/null
cmake --build "$dir" -j "$(nproc)"
if ((${#LOOM_LAUNCHER[@]})); then  # how much the compiler cache saved, for CI's log
  echo "ccache (${CCACHE_DIR:-~/.cache/ccache}): $(ccache --print-stats | awk -F'\t' \
    '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" {h += $2}
     $1 == "cache_miss" {m = $2} END {printf "%d hits, %d misses in this build", h, m}')"
fi
