#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the main job: `sparsecomm
# train` on its embedded default (4 ranks as threads in one process, the CNN
# on Fashion-MNIST, ExDyna at density 1%). Extra arguments go to it, e.g.
# `scripts/main.sh --compare dense,topk,exdyna --epochs 3`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "${SPARSECOMM_BUILD_DIR:-$ROOT/build}/sparsecomm" train "$@"
