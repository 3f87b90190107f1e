#!/usr/bin/env bash
# The check for a machine with an NVIDIA GPU and a current PyTorch (issue
# 42; docs/python.md, "Any PyTorch"). It needs no network: cmake, a C++20
# compiler, the interpreter's torch (with CUDA), pytest, and the headers of
# fmt, spdlog, nlohmann-json and zlib: the machine's, or those
# scripts/vendor-deps.sh unpacked into .deps/ on a Debian machine (carry
# .deps with the working tree; scripts/hidden-deps-check.sh shows the build
# needs no more). Each step
# reports on its own line and the script goes on after a failed one; the
# exit status counts the failed steps. Well under 10 minutes on one H100.
#
#   scripts/gpu-check.sh [OUT]      (default OUT: gpu-check-out)
#     PYTHON=/path/to/python        the interpreter (default: python3 on PATH)
#     JOBS=16                       build parallelism
#
# Steps:
#  1. what the machine has (GPU, driver, torch, CUDA, nvcc);
#  2. the Python package built standalone against this interpreter's torch
#     (python/CMakeLists.txt: torch's CMake prefix, pybind11 and C++ ABI);
#  3. the package's tests on that torch (gloo, 2 and 4 processes: the DDP
#     hook's density-1 equality with DDP's default, overlap, resume, ...);
#  4. the CNN example with ExDyna on 2 processes for one epoch, on the GPU
#     and on the CPU;
#  5. selection on the GPU against its copy bandwidth and torch.topk, at
#     25M, 100M and 1B elements (scripts/gpu-selection-bench.py).
# Everything goes to OUT/ (a log per step, OUT/summary.txt).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-gpu-check-out}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
failed=0

# step NAME COMMAND...: runs COMMAND with its output in OUT/NAME.log, and
# one line in the summary.
step() {
  local name=$1
  shift
  local begin=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "ok     $name ($((SECONDS - begin)) s)" | tee -a "$SUMMARY"
  else
    echo "FAILED $name ($((SECONDS - begin)) s): the end of $OUT/$name.log:" | tee -a "$SUMMARY"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    failed=$((failed + 1))
  fi
}

command -v "$PYTHON" > /dev/null ||
  { echo "gpu-check: no interpreter '$PYTHON'; set PYTHON=/path/to/python" >&2; exit 2; }
PYTHON=$(command -v "$PYTHON")

machine() {
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda,
      "cxx11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI, "GPUs", torch.cuda.device_count())
print("NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "none")'
  command -v nvcc && nvcc --version | tail -n 1 || echo "no nvcc"
  lscpu | grep -m1 'Model name'
}
step machine machine
cat "$OUT/machine.log" >> "$SUMMARY"

build() {
  local generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  cmake -S "$ROOT/python" -B "$OUT/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DSPARSECOMM_PYTHON_EXECUTABLE="$PYTHON" &&
    cmake --build "$OUT/build" -j "$JOBS"
}
step build build

step tests env PYTHONPATH="$OUT/build/python" OMP_NUM_THREADS=1 \
  "$PYTHON" -m pytest -q -rs -p no:cacheprovider "$ROOT/python/tests"

# The CNN example with ExDyna 1% on 2 processes, one epoch, on the GPU (the
# gradients selected on the host) and on the CPU: the same accuracy within
# the seeds' spread (docs/benchmarks/accuracy-sgd.md: about 0.1-0.3 points).
example() {
  local device data=()
  # Without Debian's dataset-fashion-mnist: the copy scripts/vendor-deps.sh made.
  [[ -d $ROOT/.deps/fashion-mnist ]] && data=(--data "$ROOT/.deps/fashion-mnist")
  for device in cuda cpu; do
    env PYTHONPATH="$OUT/build/python" OMP_NUM_THREADS=4 "$PYTHON" \
      "$ROOT/examples/ddp_fashion_mnist/train.py" --processes 2 --hook exdyna --epochs 1 \
      --device "$device" --out "$OUT/example-$device" "${data[@]}" || return 1
  done
}
step example example
grep -h "test accuracy" "$OUT"/example.log | sed 's/^/    example: /' >> "$SUMMARY"

step selection-bench "$PYTHON" "$ROOT/scripts/gpu-selection-bench.py" --sizes 25e6,100e6,1e9
cat "$OUT/selection-bench.log" >> "$SUMMARY"

echo "gpu-check: $failed step(s) failed; summary: $SUMMARY"
exit "$failed"
