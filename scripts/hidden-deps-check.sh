#!/usr/bin/env bash
# Shows that the Python package's standalone build (scripts/gpu-check.sh's
# build step) needs nothing of fmt, spdlog, nlohmann-json and zlib but what
# .deps/ carries (scripts/vendor-deps.sh): on this Debian machine it hides
# their headers and CMake files in a private mount namespace, then builds
# the package against the interpreter's torch and imports it.
#
#   scripts/hidden-deps-check.sh [OUT]     (root; default OUT: hidden-deps-out)
#     PYTHON=/usr/bin/python3  JOBS=2
#
# Exit 0 when the build and the import pass with the packages hidden.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-hidden-deps-out}"
PYTHON="${PYTHON:-/usr/bin/python3}"
JOBS="${JOBS:-$(nproc)}"
[[ $(id -u) -eq 0 ]] || { echo "hidden-deps-check: needs root (a private mount namespace)" >&2; exit 2; }
[[ -f $ROOT/.deps/include/spdlog/spdlog.h ]] ||
  { echo "hidden-deps-check: no .deps/include: run scripts/vendor-deps.sh first" >&2; exit 2; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# Inside the namespace: /usr/include becomes a copy without those headers,
# and the packages' CMake folders empty ones.
inner() {
  set -euo pipefail
  local include="$OUT/usr-include" empty="$OUT/empty"
  rm -rf "$include" "$empty"
  mkdir -p "$empty"
  cp -a /usr/include "$include"
  rm -rf "$include"/{fmt,spdlog,nlohmann} "$include"/zlib.h "$include"/zconf.h
  mount --bind "$include" /usr/include
  for folder in /usr/lib/x86_64-linux-gnu/cmake/fmt /usr/lib/x86_64-linux-gnu/cmake/spdlog \
                /usr/share/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json; do
    [[ -d $folder ]] && mount --bind "$empty" "$folder"
  done
  for header in fmt/format.h spdlog/spdlog.h nlohmann/json.hpp zlib.h; do
    [[ ! -e /usr/include/$header ]] || { echo "hidden-deps-check: /usr/include/$header still seen" >&2; exit 1; }
  done
  rm -rf "$OUT/build"
  cmake -S "$ROOT/python" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DSPARSECOMM_PYTHON_EXECUTABLE="$PYTHON"
  cmake --build "$OUT/build" -j "$JOBS"
  PYTHONPATH="$OUT/build/python" "$PYTHON" -c \
    'import sparsecomm, torch; print("imported", sparsecomm.__file__, "torch", torch.__version__)'
}
export -f inner
export ROOT OUT PYTHON JOBS
unshare --mount --propagation private bash -c inner 2>&1 | tee "$OUT/build.log"
status=${PIPESTATUS[0]}
rm -rf "$OUT/usr-include" "$OUT/empty"
exit "$status"
