#!/usr/bin/env bash
# Rebuilds every table docs/benchmarks/ computes from docs/data, one file per
# table under OUT, with the commands docs/data/README.md gives:
#
#   scripts/data-tables.sh OUT [NAME...]
#
# NAME picks tables by name (the files' stems; default all). Besides the
# tables, each kept pilot folder's convergence profile is made again with
# `sparsecomm convergence` and compared with the profile docs/data keeps
# (OUT/<profile>.diff, empty when equal), and scripts/scaling-table.py's
# output with src/sparsecomm/perf/builtin_scaling.cc. It exits 1 when one of
# those differs or a command fails. Use it to check that a change to the
# scripts, the model or docs/data leaves the tables as they are: run it
# before and after, then `diff -r BEFORE AFTER` (the performance model's
# tables move when the model does; the rest must not). SPARSECOMM_BIN names
# another binary than build/sparsecomm.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -ge 1 ]] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
shift
BIN="${SPARSECOMM_BIN:-$ROOT/build/sparsecomm}"
[[ -x "$BIN" ]] || { echo "data-tables: $BIN is not an executable: build first, or name it in SPARSECOMM_BIN" >&2; exit 2; }
export SPARSECOMM_BIN="$BIN"
D="$ROOT/docs/data"
PY=/usr/bin/python3
failed=0

wanted() { [[ ${#PICK[@]} -eq 0 ]] || [[ " ${PICK[*]} " == *" $1 "* ]]; }
PICK=("$@")

# table NAME COMMAND...: the command's output is OUT/NAME.txt.
table() {
  local name="$1"
  shift
  wanted "$name" || return 0
  if ! "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"; then
    echo "data-tables: $name failed: $*" >&2
    sed 's/^/  /' "$OUT/$name.err" >&2
    failed=1
  fi
  [[ -s "$OUT/$name.err" ]] || rm -f "$OUT/$name.err"
}

# profile NAME PILOTS PROFILE: `sparsecomm convergence` on the kept pilots
# against the kept profile.
profile() {
  local name="$1" pilots="$2" kept="$3"
  wanted "$name" || return 0
  # From the repository's root, as the kept profiles name their pilots.
  if ! (cd "$ROOT" && "$BIN" convergence docs/data/"$pilots"/*/seed1 -o "$OUT/$name.json") \
    2> "$OUT/$name.err"; then
    echo "data-tables: sparsecomm convergence on $pilots failed" >&2
    failed=1
    return 0
  fi
  rm -f "$OUT/$name.err"
  if ! diff "$D/$kept" "$OUT/$name.json" > "$OUT/$name.diff"; then
    echo "data-tables: $pilots makes a profile other than $kept (see $OUT/$name.diff)" >&2
    failed=1
  fi
}

# tt NAME FOLDER PROFILE PILOTS TARGET VALUE: scripts/time-to-target.py on
# docs/data/FOLDER with the convergence profile PROFILE.json, the pilots of
# docs/data/PILOTS ("-": none) and --target-TARGET VALUE.
tt() {
  local name="$1" folder="$2" profile="$3" pilots="$4" target="$5" value="$6"
  local with_pilots=()
  [[ $pilots == - ]] || with_pilots=(--pilots "$D/$pilots")
  table "$name" $PY "$ROOT/scripts/time-to-target.py" "$D/$folder" \
    --convergence "$D/$profile.json" "${with_pilots[@]}" "--target-$target" "$value"
}
# docs/benchmarks/time-to-target.md
tt tt-cnn-4hosts time-to-target-2026-11-29 convergence-cnn-5ep - accuracy 91.5
tt tt-cnn-8hosts time-to-target-2026-11-29-cnn-8hosts convergence-cnn-5ep-n8 - accuracy 90.52
tt tt-cnn-8hosts-lower time-to-target-2026-11-29-cnn-8hosts convergence-cnn-5ep-n8 - accuracy 89.52
tt tt-wide-mlp-4hosts time-to-target-2026-11-29-wide-mlp convergence-wide-mlp-3ep \
  time-to-target-2026-11-29-wide-mlp/pilots accuracy 87.27
tt tt-wide-mlp-8hosts time-to-target-2026-12-06-wide-mlp-8hosts convergence-wide-mlp-3ep-n8 \
  pilots-wide-mlp-3ep-n8 accuracy 83.25
tt tt-char-transformer-4hosts time-to-target-2026-12-01-char-transformer \
  convergence-char-transformer-300 - loss 2.33
tt tt-char-transformer-4hosts-higher time-to-target-2026-12-01-char-transformer \
  convergence-char-transformer-300 - loss 2.65
tt tt-char-transformer-8hosts time-to-target-2026-12-05-char-transformer-8hosts \
  convergence-char-transformer-300-n8 - loss 2.31
tt tt-char-transformer-8hosts-higher time-to-target-2026-12-05-char-transformer-8hosts \
  convergence-char-transformer-300-n8 - loss 2.62
# docs/benchmarks/local-steps.md
tt tt-cnn-local-8hosts time-to-target-2026-12-06-cnn-local-8hosts convergence-cnn-5ep-n8-local \
  pilots-cnn-5ep-n8-local accuracy 90.47
tt tt-cnn-local-8hosts-lower time-to-target-2026-12-06-cnn-local-8hosts convergence-cnn-5ep-n8-local \
  pilots-cnn-5ep-n8-local accuracy 89.47
tt tt-char-transformer-local-8hosts time-to-target-2026-12-06-char-transformer-local-8hosts \
  convergence-char-transformer-300-n8-local pilots-char-transformer-300-n8-local loss 2.62
tt tt-char-transformer-local-8hosts-lower time-to-target-2026-12-06-char-transformer-local-8hosts \
  convergence-char-transformer-300-n8-local pilots-char-transformer-300-n8-local loss 2.31
tt tt-cnn-local-4hosts time-to-target-2026-12-06-cnn-local-4hosts convergence-cnn-5ep-n4-local \
  pilots-cnn-5ep-n4-local accuracy 90.63
tt tt-cnn-local-4hosts-lower time-to-target-2026-12-06-cnn-local-4hosts convergence-cnn-5ep-n4-local \
  pilots-cnn-5ep-n4-local accuracy 89.63
tt tt-char-transformer-local-4hosts time-to-target-2026-12-06-char-transformer-local-4hosts \
  convergence-char-transformer-300-n4-local pilots-char-transformer-300-n4-local loss 2.65

# The accuracy tables whose per-seed results docs/data/accuracy keeps
# (scripts/accuracy-table.py --save), each page's table printed again.
for saved in "$D"/accuracy/*.json; do
  table "accuracy-$(basename "$saved" .json)" $PY "$ROOT/scripts/accuracy-table.py" show "$saved"
done

# docs/benchmarks/performance-model.md: every grid against today's model.
for grid in "$D"/validation-*/; do
  grid="${grid%/}"
  table "$(basename "$grid")" $PY "$ROOT/scripts/validate-model.py" "$grid" --measured-stats
done
table scaling-synthetic $PY "$ROOT/scripts/scaling-table.py" "$D/scaling-synthetic"
# Its initializers stand, word for word, in the built-in table.
if wanted scaling-synthetic && [[ -s "$OUT/scaling-synthetic.txt" ]] &&
  ! $PY -c 'import sys; sys.exit(open(sys.argv[2]).read().rstrip("\n") not in open(sys.argv[1]).read())' \
    "$ROOT/src/sparsecomm/perf/builtin_scaling.cc" "$OUT/scaling-synthetic.txt"; then
  echo "data-tables: src/sparsecomm/perf/builtin_scaling.cc does not hold what scripts/scaling-table.py prints" >&2
  failed=1
fi

# The convergence profiles whose pilots docs/data keeps.
profile profile-cnn-5ep-n8-local pilots-cnn-5ep-n8-local convergence-cnn-5ep-n8-local.json
profile profile-cnn-5ep-n4-local pilots-cnn-5ep-n4-local convergence-cnn-5ep-n4-local.json
profile profile-char-transformer-300-n8 pilots-char-transformer-300-n8 convergence-char-transformer-300-n8.json
profile profile-char-transformer-300-n8-local pilots-char-transformer-300-n8-local \
  convergence-char-transformer-300-n8-local.json
profile profile-char-transformer-300-n4-local pilots-char-transformer-300-n4-local \
  convergence-char-transformer-300-n4-local.json
profile profile-wide-mlp-3ep-n8 pilots-wide-mlp-3ep-n8 convergence-wide-mlp-3ep-n8.json

exit $failed
