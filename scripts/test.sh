#!/usr/bin/env bash
# Set up .venv and run the whole test suite (real DeepSpeed checkpoints are made once and cached in tests/.fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
exec .venv/bin/python -m pytest -n 2 "$@"
