# Sourced by scripts/build.sh and scripts/sanitize.sh: ccache as the compiler launcher when it
# is installed (scripts/setup.sh installs it; LOOM_CCACHE=0 turns it off). Paths are hashed
# relative to the checkout (CCACHE_BASEDIR) and the build folder's own path is left out
# (CCACHE_NOHASHDIR), so a fresh clone elsewhere on the same machine — CI's — finds the
# objects an earlier build of the same sources left in ~/.cache/ccache. Cold, it costs a few
# percent; the sources' hashes decide every hit, so a changed file always recompiles.
LOOM_LAUNCHER=()
if [ "${LOOM_CCACHE:-1}" = 1 ] && command -v ccache > /dev/null; then
  CCACHE_BASEDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  export CCACHE_BASEDIR CCACHE_NOHASHDIR=1
  LOOM_LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
