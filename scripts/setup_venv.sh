#!/usr/bin/env bash
# Create .venv in the repo root with cogexport (editable) and its test tools.
# torch goes in first and pinned: on our build machines pip finds this CPU wheel on local disk, and nothing
# later can pull a multi-GB CUDA build as a side effect. Set TORCH_SPEC to install another build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[test]"
# DiffSynth-Studio's Wan VAE module (torch, einops, tqdm only) is the tests' independent reader of the Wan 2.2 VAE's
# original layout, which no Diffusers converter reads; the rest of the package (and its heavy dependencies) is unused.
.venv/bin/python -m pip install --quiet --no-deps "diffsynth==2.1.12"
# megatron-core's own dist_checkpointing.save writes the tests' Megatron-Core checkpoints (cogexport never imports it).
# It declares Python >= 3.12 but saves on 3.11, and is installed without its dependencies so that torch stays as
# pinned above; `import megatron.core` also needs triton (its MoE ops import it unconditionally), likewise alone.
.venv/bin/python -m pip install --quiet --no-deps --ignore-requires-python "megatron-core==0.19.2" "triton==3.9.0"
