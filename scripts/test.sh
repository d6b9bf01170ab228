#!/usr/bin/env bash
# Set up .venv and run the whole test suite. The real checkpoints the tests train and save (DeepSpeed, DCP, tiny
# pipelines) are made once per machine, not once per clone: tests/.fixtures links to the user's cache
# (COGEXPORT_TEST_FIXTURES to choose another folder), where each fixture's key covers the scripts that make it and
# the versions of torch, deepspeed, diffusers and transformers, so a clone never reads a fixture made by other code.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
if [ ! -e tests/.fixtures ] && [ ! -L tests/.fixtures ]; then
    cache="${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}"
    fixtures="${COGEXPORT_TEST_FIXTURES:-${cache:+$cache/cogexport/test-fixtures}}"
    # no cache folder to share (no HOME) or none writable: the clone keeps its own, as before
    if [ -n "$fixtures" ] && mkdir -p "$fixtures" 2>/dev/null; then
        ln -s "$fixtures" tests/.fixtures
    else
        mkdir -p tests/.fixtures
    fi
fi
# llama.cpp's reference K quantizers, the judge of ours (a few seconds; kept with the fixtures)
[ -f tests/.fixtures/ggml-reference/libggml_quants_ref.so ] || ./scripts/build_ggml_reference.sh
# the install above builds the compiled K quantizer: its tests fail rather than skip should the build have been lost
export COGEXPORT_REQUIRE_KERNEL=1
exec .venv/bin/python -m pytest -n 2 "$@"
