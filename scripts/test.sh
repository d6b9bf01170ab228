#!/usr/bin/env bash
# Set up .venv and run the whole test suite (real DeepSpeed checkpoints are made once and cached in tests/.fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
# llama.cpp's reference K quantizers, the judge of ours (a few seconds; kept in the fixture cache)
[ -f tests/.fixtures/ggml-reference/libggml_quants_ref.so ] || ./scripts/build_ggml_reference.sh
exec .venv/bin/python -m pytest -n 2 "$@"
