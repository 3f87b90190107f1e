#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the main job on the
# embedded default (4 ranks as threads in one process). Until the trainer
# lands, the main job is the collectives benchmark. Extra arguments go to it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "${SPARSECOMM_BUILD_DIR:-$ROOT/build}/sparsecomm" bench collectives "$@"
