#!/usr/bin/env bash
# Runs an MPI job that must abort: passes only if the job exits non-zero well
# before the wall limit (not killed by `timeout`) and its output contains
# every expected string.
#
# Usage: expect_abort.sh MPIEXEC PROGRAM MODE EXPECTED...
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 MPIEXEC PROGRAM MODE EXPECTED..." >&2
  exit 2
fi
mpiexec=$1
program=$2
mode=$3
shift 3

wall_limit=60   # seconds before `timeout` kills the job
max_seconds=30  # "well before" the wall limit

start=$(date +%s)
output=$(timeout -k 5 "$wall_limit" "$mpiexec" -n 4 --oversubscribe --allow-run-as-root \
  "$program" "$mode" 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$output"
echo "--- exit code $rc after ${elapsed}s"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# timeout exits 124 (137 when it had to SIGKILL); mpiexec itself exits 137
# when a rank died by SIGKILL, so the elapsed time tells which.
if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "$elapsed" -ge "$wall_limit" ]; }; then
  fail "the job hung: killed by timeout after ${wall_limit}s"
fi
[ "$rc" -ne 0 ] || fail "the job exited 0; it should have aborted"
[ "$elapsed" -lt "$max_seconds" ] || fail "the job took ${elapsed}s to abort (limit ${max_seconds}s)"
for expected in "$@"; do
  grep -qF -- "$expected" <<<"$output" || fail "the output does not contain '$expected'"
done
echo "PASS: the job aborted with exit code $rc in ${elapsed}s"
