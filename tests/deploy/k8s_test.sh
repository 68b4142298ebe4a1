#!/usr/bin/env bash
# deploy/: the Kubernetes manifests validate offline against the Kubernetes schemas (npm
# kubernetes-models) and the Volcano Job schema kept in deploy/k8s/schemas, a broken copy of
# each job is refused (the check can fail), yamllint passes, `loom run` accepts the
# manifests' command line, and the Dockerfile's runtime packages exist in Debian 12.
#   k8s_test.sh LOOM WORKDIR
set -euo pipefail
loom=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
k8s=$src/deploy/k8s
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work"

# The validator and its pinned dependencies (package-lock.json), installed outside the tree.
cp -r "$k8s/package.json" "$k8s/package-lock.json" "$k8s/validate.mjs" "$k8s/schemas" "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error > npm.log 2>&1) ||
  fail "npm ci of the validator's dependencies failed (npm registry reachable?): $(tail -3 "$work/npm.log")"
node "$work/validate.mjs" "$k8s"/*.yaml || fail "the manifests do not validate"
echo "ok  every manifest validates"

# A broken copy of each job must be refused.
sed 's/^  completions: 4$/  completions: four/' "$k8s/train-job.yaml" > "$work/bad-train-job.yaml"
sed '0,/^  minAvailable: 2$/s//  minAvailabel: 2/' "$k8s/volcano-job.yaml" > "$work/bad-volcano-job.yaml"
for bad in bad-train-job bad-volcano-job; do
  if cmp -s "$work/$bad.yaml" "$k8s/${bad#bad-}.yaml"; then fail "$bad.yaml: the test's edit did not apply"; fi
  if node "$work/validate.mjs" "$work/$bad.yaml" > "$work/$bad.out"; then
    fail "$bad.yaml validated: $(cat "$work/$bad.out")"
  fi
  grep -q "INVALID" "$work/$bad.out" || fail "$bad.yaml: no INVALID line"
done
echo "ok  a wrong type in the Job and a misspelt Volcano field are refused"

yamllint -s -c "$k8s/.yamllint" "$k8s" || fail "yamllint"
echo "ok  yamllint"

# The loom command of each job, its variables filled in and etcd pointed at a port nobody
# serves: loom must accept every flag and fail only at reaching etcd (exit 3).
for job in train-job volcano-job; do
  mapfile -t args < <(/usr/bin/python3 "$src/tests/deploy/job_command.py" "$k8s/$job.yaml")
  set +e
  LOOM_JOB_TOKEN=0123456789abcdef0123456789abcdef "$loom" "${args[@]}" > "$work/$job.out" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 3 ] || ! grep -q "etcd" "$work/$job.out"; then
    fail "$job.yaml: loom should accept the command line and fail at etcd (exit 3), got $rc: $(cat "$work/$job.out")"
  fi
done
echo "ok  loom accepts both jobs' command lines"

# The Dockerfile's runtime stage installs packages that exist in Debian 12.
pkgs=$(sed -n '/^FROM debian:12$/,$p' "$src/deploy/docker/Dockerfile" | sed -n '/apt-get install/,/rm -rf/p' |
  tr ' \\' '\n\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' |
  grep -vxE 'apt-get|install|rm|update|y|qq|no|var|lib|apt|lists' || true)
[ -n "$pkgs" ] || fail "no runtime packages found in the Dockerfile"
for p in $pkgs; do
  apt-cache show "$p" > /dev/null 2>&1 || fail "Dockerfile: no Debian package '$p'"
done
echo "ok  the Dockerfile's runtime packages exist:" $pkgs
