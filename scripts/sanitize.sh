#!/usr/bin/env bash
# The second half of CI (.ci/run runs it after scripts/test.sh): the AddressSanitizer +
# UBSan build and its tests, the ThreadSanitizer build's thread-rank tests, the Release build
# with clang (warnings as errors) and 20 s of libFuzzer per parser of outside input.
# ~18 minutes on 2 cores with the compiler cache warm (Zen 5, 2026-12-06); CI with all
# four builds compiled from nothing took ~18 minutes more. Needs what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$(date +%s)
step() { printf '\n=== %s (%ds)\n' "$1" $(( $(date +%s) - start )); }

step "address + undefined-behaviour sanitizer build"
bash scripts/build.sh build-asan -DLOOM_SANITIZE=address
step "tests under ASan/UBSan"
# Every unit and multi-process test and the end-to-end modes that reach the training code
# (dp/tp/pp equivalence: each parallel code path once, LOOM_E2E_SANITIZED; train_e2e
# resume: checkpoints, TensorBoard, signals, sampling). Left to the release pass
# (scripts/test.sh), to keep this one near 20 minutes on 2 cores: the benchmarks, the
# 200-step bf16 convergence check, the dp/tp/pp resume and launcher modes, whose code
# paths the modes above run too, and the planner's end-to-end check (its formulas run
# under ASan in plan_test; it trains 10 layouts), and the fault campaign (its deadlines are
# set for the release build's speed), and the emulated machines (their code paths, TCP
# between hosts and the hierarchical algorithms, run here in the multi-process tests with
# LOOM_HOST_ID), and the model-file export check (its C++ paths run here in interop_test;
# the rest is llama.cpp and PyTorch reading the files).
# (The soak's short form runs in the release pass only, and so do the reference backend's
# whole-model cases on `small`, its bf16 whole-model cases (their yardstick is the Release
# build's numerics, backend_test.cc says why) and its end-to-end training run: the tiny
# fp32 case and the kernel cases of backend_test run every reference kernel here.
# The collective sweep runs here on worlds 1, 2, 3, 5 and 8 over shared memory, 2 and 3
# over TCP, 4 and 5 hierarchical (every algorithm and both transports; the release pass runs
# every world, and this was the longest test here at ~380 s), and the streaming-copy sweep
# sends its 70001-element heap messages on 2 ranks only (collectives_test.cc says why: it
# was 260-320 s of this pass, now ~120 s); the Kubernetes manifests'
# check runs no loom code that other tests do not.
# GTEST_FILTER, -E.)
sweep=Layouts/CollectiveSweep.ClosedFormResults
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  GTEST_FILTER="-Soak.*:Backends.WholeModelSmall*:Backends.WholeModel*Bf16*:$sweep/shm_n4:$sweep/shm_n6:$sweep/shm_n7:$sweep/tcp_n4:$sweep/tcp_n5:$sweep/hier_n6" \
  LOOM_E2E_SANITIZED=1 ctest --test-dir build-asan --output-on-failure -j 1 \
  -E 'bench_|train_e2e_bf16|train_e2e_backend|dp_e2e_resume|dp_e2e_launchers|tp_e2e_resume|pp_e2e_resume|observe_e2e_plan|chaos_|cluster_e2e|interop_e2e_export|deploy_k8s'

# GCC's ThreadSanitizer: clang 14's (Debian 12) crashes before main on this kernel (6.18,
# tried 2026-12-06, also with ASLR off), so the clang build below stays a separate one.
step "thread sanitizer build"  # only what the TSan pass runs
source scripts/compiler_cache.sh
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread \
  -DLOOM_WERROR=ON "${LOOM_LAUNCHER[@]}" > /dev/null
cmake --build build-tsan -j "$(nproc)" --target store_test core_test comm_features_test \
  collectives_test
step "thread-rank tests under TSan"
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
ctest --test-dir build-tsan --output-on-failure -j 1 -R 'store_test|core_test|comm_features_test'
./build-tsan/tests/collectives_test --gtest_brief=1 \
  --gtest_filter='*shm_n3*:*shm_n5*:*tcp_n2*:*hier_n4*:ReadInPlace.*:SharedBuffers.*:SharedAllreduce.*:ShmRing.*:ShmFutex.*:AllgatherShared.*:TcpSendThread.*'
unset TSAN_OPTIONS

# The Release build with clang too (the release build above is GCC's), warnings as errors;
# the same build holds the libFuzzer targets.
step "clang Release build + libFuzzer targets"
CC=clang CXX=clang++ cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLOOM_WERROR=ON -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF "${LOOM_LAUNCHER[@]}" > /dev/null
cmake --build build-clang -j "$(nproc)"
step "libFuzzer: every parser of outside input, 20 s each (scripts/fuzz.sh)"
bash scripts/fuzz.sh build-clang 20
step "sanitizer builds, clang build and fuzzer passed"
