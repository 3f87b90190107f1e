#!/usr/bin/env bash
# Installs every Debian package sparsecomm needs (only what is missing, so it
# is idempotent), then configures and builds into $SPARSECOMM_BUILD_DIR
# (default: build/). Works as root on a fresh Debian 12; as another user it
# uses sudo for the install step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SPARSECOMM_BUILD_DIR:-$ROOT/build}"

PACKAGES=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libopenmpi-dev openmpi-bin                     # the MPI backend and mpirun
  libcli11-dev nlohmann-json3-dev                # command line, JSON output
  libspdlog-dev libfmt-dev                       # logging, formatting
  libgtest-dev libgmock-dev                      # tests
  zlib1g-dev dataset-fashion-mnist               # gzip IDX reader, the training data
  fortunes                                       # the text corpus of --dataset fortunes
  gnuplot-nox                                    # the PNG plots of a run
  libtorch-dev                                   # LibTorch (torch::topk baseline, training)
  libopenblas0-openmp                            # LibTorch's BLAS; else the reference BLAS (20x slower)
  clang libclang-rt-14-dev                       # libFuzzer and the sanitizers (scripts/fuzz.sh)
  python3-torch pybind11-dev python3-pytest      # the Python package (python/) and its tests
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo)
  fi
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
fi

cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSECOMM_WERROR=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
