#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan into
# $SPARSECOMM_FUZZ_BUILD_DIR (default build-fuzz/) and runs each for a
# given time on a copy of its seed corpus (fuzz/corpus/<target>/).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default: 60, all)
#   scripts/fuzz.sh --runs N [TARGET ...]                 (N executions each)
#
# --runs is CI's smoke and is reproducible: libFuzzer's seed is fixed
# (SPARSECOMM_FUZZ_SEED, default 1). A timed run draws a new seed each time,
# exploring further (what found the float counts of fuzz_trace_meta).
#
# Needs clang and libclang-rt-14-dev (scripts/setup.sh installs them). Ends
# non-zero when a target crashes, leaks or trips a sanitizer; the input that
# did it is kept in the run's directory (printed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SPARSECOMM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
ALL=(fuzz_idx fuzz_state_file fuzz_trace_meta fuzz_exchange_block)

limit=(-max_total_time=60)
if [[ "${1:-}" == "--runs" ]]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --runs needs a number of executions" >&2; exit 2; }
  limit=(-runs="$2" -seed="${SPARSECOMM_FUZZ_SEED:-1}"); shift 2
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  limit=(-max_total_time="$1"); shift
fi
targets=("$@")
((${#targets[@]} > 0)) || targets=("${ALL[@]}")
for target in "${targets[@]}"; do
  [[ " ${ALL[*]} " == *" $target "* ]] || { echo "fuzz.sh: unknown target '$target' (one of: ${ALL[*]})" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is missing; run scripts/setup.sh" >&2; exit 1; }
# Precompiled headers are off here: a source that leans on them for an
# include it does not write fails to build (cmake/common_pch.cmake).
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSPARSECOMM_FUZZ=ON \
  -DSPARSECOMM_BUILD_TESTS=OFF -DSPARSECOMM_BUILD_TOOLS=OFF -DSPARSECOMM_WITH_MPI=OFF \
  -DSPARSECOMM_WITH_TORCH=OFF -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"

status=0
for target in "${targets[@]}"; do
  work="$BUILD_DIR/fuzz-runs/$target"
  rm -rf "$work" && mkdir -p "$work/corpus"
  cp "$ROOT/fuzz/corpus/$target/"* "$work/corpus/"
  echo "== $target (${limit[*]})"
  if (cd "$work" && "$BUILD_DIR/fuzz/$target" "${limit[@]}" -print_final_stats=1 corpus \
        >"$work/log.txt" 2>&1); then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/log.txt" | sed 's/^/   /'
  else
    status=1
    echo "   FAILED: see $work/log.txt (the failing input is in $work)" >&2
    tail -30 "$work/log.txt" >&2
  fi
done
exit $status
