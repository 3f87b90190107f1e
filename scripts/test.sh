#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the whole test suite:
# the in-process suites, the suites under `mpiexec -n 4`, the MPI failure
# test and the find_package(sparsecomm) consumer build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
ctest --test-dir "${SPARSECOMM_BUILD_DIR:-$ROOT/build}" --output-on-failure -j "$(nproc)" "$@"
