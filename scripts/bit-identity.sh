#!/usr/bin/env bash
# Shows that a change kept the behaviour of every synchronization method:
# builds tests/sync/sync_fingerprint at BASE (default HEAD) in a temporary
# worktree and in the build directory (the working tree), runs both over
# worlds of 1..8 thread ranks, and compares every case's hash (outputs,
# residuals, bytes and saved state of every method, pattern, memory and
# value format; tests/sync/sync_fingerprint.cc).
#
#   scripts/bit-identity.sh [BASE]
#
# Exit 0 when every line agrees; 1 with the differing lines otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${1:-HEAD}"
build="${SPARSECOMM_BUILD_DIR:-$ROOT/build}"
work="$(mktemp -d /tmp/sparsecomm-bit-identity.XXXXXX)"
cleanup() {
  git -C "$ROOT" worktree remove --force "$work/src" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git -C "$ROOT" worktree add --detach "$work/src" "$base" >/dev/null 2>&1 || {
  echo "bit-identity.sh: '$base' is not a revision of this repository" >&2
  exit 2
}
if [[ ! -f "$work/src/tests/sync/sync_fingerprint.cc" ]]; then
  echo "bit-identity.sh: $base predates tests/sync/sync_fingerprint.cc; give a later revision" >&2
  exit 2
fi
if [[ ! -f "$build/build.ninja" ]]; then
  echo "bit-identity.sh: no build in $build; run scripts/setup.sh first" >&2
  exit 2
fi
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSPARSECOMM_WITH_TORCH=OFF -DSPARSECOMM_WITH_MPI=OFF -DSPARSECOMM_BUILD_TOOLS=OFF >/dev/null
cmake --build "$work/build" --target sync_fingerprint -j "$(nproc)" >/dev/null
cmake --build "$build" --target sync_fingerprint -j "$(nproc)" >/dev/null
"$work/build/tests/sync/sync_fingerprint" > "$work/base.txt"
"$build/tests/sync/sync_fingerprint" > "$work/now.txt"
if diff "$work/base.txt" "$work/now.txt" > "$work/diff.txt"; then
  echo "bit-identical to $base: $(wc -l < "$work/now.txt") cases"
else
  echo "bit-identity.sh: differs from $base:" >&2
  cat "$work/diff.txt" >&2
  exit 1
fi
