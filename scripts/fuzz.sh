#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS (default 600: the long profile) from its seed
# corpus, two at a time (this machine's 2 cores). Inputs found are kept in
# BUILD/fuzz-corpus/<target> (not committed); a crash leaves BUILD/fuzz-crash/<target>-* and
# fails the run. Regression inputs live in tests/fuzz/corpus and are run first every time.
#   bash scripts/fuzz.sh [BUILD=build-clang] [SECONDS=600]     (LOOM_FUZZ_JOBS=2 at a time)
# BUILD must be configured with clang and -DLOOM_FUZZ=ON (scripts/sanitize.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-clang}
seconds=${2:-600}
targets="store_wire_fuzz handshake_fuzz config_fuzz shard_fuzz data_manifest_fuzz
  ckpt_manifest_fuzz tokenizer_fuzz model_file_fuzz corpus_input_fuzz"
mkdir -p "$build/fuzz-crash" "$build/fuzz-log"
export LOOM_FUZZ_BUILD=$build LOOM_FUZZ_SECONDS=$seconds
one() {
  local t=$1 log=$LOOM_FUZZ_BUILD/fuzz-log/$1.log
  mkdir -p "$LOOM_FUZZ_BUILD/fuzz-corpus/$t"
  if "$LOOM_FUZZ_BUILD/tests/fuzz/$t" -max_total_time="$LOOM_FUZZ_SECONDS" -max_len=4096 \
      -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$LOOM_FUZZ_BUILD/fuzz-crash/$t-" \
      "$LOOM_FUZZ_BUILD/fuzz-corpus/$t" "tests/fuzz/corpus/$t" > "$log" 2>&1; then
    printf '%-20s ok   %s\n' "$t" "$(grep -E '^stat::number_of_executed_units' "$log" |
      awk '{print $2 " inputs"}')"
  else
    printf '%-20s FAIL (log: %s)\n' "$t" "$log"
    grep -E 'ERROR|SUMMARY|terminate|Test unit written' "$log" | head -8
    return 1
  fi
}
export -f one
echo $targets | tr " " "\n" | grep . | xargs -P "${LOOM_FUZZ_JOBS:-2}" -I{} bash -c "one {}"
