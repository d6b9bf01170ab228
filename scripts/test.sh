#!/usr/bin/env bash
# Set up .venv and run the whole test suite. The real checkpoints the tests train and save (DeepSpeed, DCP, tiny
# pipelines) are made once per machine, not once per clone: tests/.fixtures links to the user's cache
# (COGEXPORT_TEST_FIXTURES to choose another folder), where each fixture's key covers the scripts that make it and
# the versions of torch, deepspeed, diffusers and transformers, so a clone never reads a fixture made by other code.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
if [ ! -e tests/.fixtures ] && [ ! -L tests/.fixtures ]; then
    fixtures="${COGEXPORT_TEST_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/cogexport/test-fixtures}"
    mkdir -p "$fixtures" && ln -s "$fixtures" tests/.fixtures
fi
# llama.cpp's reference K quantizers, the judge of ours (a few seconds; kept with the fixtures)
[ -f tests/.fixtures/ggml-reference/libggml_quants_ref.so ] || ./scripts/build_ggml_reference.sh
exec .venv/bin/python -m pytest -n 2 "$@"
