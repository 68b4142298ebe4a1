#!/usr/bin/env bash
# loom's main job on one machine: the King James Bible (Debian bible-kjv, public domain)
# -> GPT-2 token shards -> train the `tiny` model on 2 local ranks with ZeRO (2,000 steps,
# 3-13 minutes on 2 cores: docs/perf.md) -> sample from it.
# Rerunnable: existing data is reused and an existing run is resumed (or just sampled).
#   LOOM_DEMO_STEPS=N overrides train.steps (configs/tiny.toml: 2000).
set -euo pipefail
cd "$(dirname "$0")/.."
loom=build/apps/loom/loom
mkdir -p data
if [ ! -f data/kjv/manifest.json ]; then
  bible -f gen1:1-rev22:21 > data/kjv.txt
  "$loom" prep -i data/kjv.txt -o data/kjv
fi
steps=()
[ -n "${LOOM_DEMO_STEPS:-}" ] && steps=(--set "train.steps=$LOOM_DEMO_STEPS")
# Two ranks on this machine (shared memory between them), ZeRO stage 2: optimizer state
# and gradients sharded. One process trains the same way: loom train -c configs/tiny.toml
"$loom" run -n 2 "$loom" train -c configs/tiny.toml --set data.path=data/kjv --set run.dir=runs/tiny \
  --set train.zero=2 "${steps[@]}" --resume
echo
echo "--- sample (loom sample --ckpt runs/tiny --prompt 'And God said') ---"
"$loom" sample --ckpt runs/tiny --prompt "And God said" --tokens 80 --seed 1
