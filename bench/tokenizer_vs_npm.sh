#!/usr/bin/env bash
# GPT-2 tokenizer throughput: loom vs the npm package gpt-tokenizer@4.0.0 (the reference), on
# the King James Bible (Debian bible-kjv, ~4.4 MB), one thread each, encode time only (load
# excluded), 3 runs each, interleaved; prints both and the median ratio.
#   bash bench/tokenizer_vs_npm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=${LOOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loom}/gpt-tokenizer-4.0.0/package
text=$(mktemp)
trap 'rm -f "$text"' EXIT
bible -f gen1:1-rev22:21 > "$text"
cat > "$text.js" <<JS
const fs = require('fs');
const tok = require('$pkg/cjs/encoding/r50k_base.js');
const s = fs.readFileSync(process.argv[2], 'utf8');
const t0 = process.hrtime.bigint();
const ids = tok.encode(s);
const sec = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({impl: 'npm', bytes: Buffer.byteLength(s), tokens: ids.length, seconds: sec, mb_per_s: Buffer.byteLength(s) / sec / 1e6}));
JS
for i in 1 2 3; do
  build/apps/loom/loom tokenize --stats - < "$text"
  node "$text.js" "$text"
done | tee /dev/stderr | /usr/bin/python3 -c '
import json, sys, statistics
rows = [json.loads(l) for l in sys.stdin]
med = {k: statistics.median(r["mb_per_s"] for r in rows if r["impl"] == k) for k in ("loom", "npm")}
toks = {r["impl"]: r["tokens"] for r in rows}
same = "identical counts" if toks["loom"] == toks["npm"] else "DIFFERENT counts"
print("median MB/s: loom %.1f, npm %.1f, ratio %.2fx; tokens loom %d, npm %d (%s)"
      % (med["loom"], med["npm"], med["loom"] / med["npm"], toks["loom"], toks["npm"], same))'
rm -f "$text.js"
