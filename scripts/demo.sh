#!/usr/bin/env bash
# The main job on an embedded default, offline, on CPU: build a tiny CogVideoX pipeline, fine-tune its transformer
# two steps under real DeepSpeed ZeRO-2 (2 ranks, bf16) the way CogVideo's finetune/ does, export the checkpoint
# with `cogexport --model-type t2v`, verify it, then load it with CogVideoXPipeline.from_pretrained and render
# frames. Everything lands in demo-output/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
out=demo-output
rm -rf "$out"
export DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo; echo "== $*" >&2; }

step "building a tiny CogVideoX base pipeline in $out/base"
.venv/bin/python scripts/make_tiny_cogvideox.py "$out/base" --variant t2v >/dev/null 2>&1
step "fine-tuning its transformer under DeepSpeed ZeRO-2 (2 CPU ranks, bf16) into $out/run"
.venv/bin/python scripts/finetune_tiny_cogvideox.py "$out/base" "$out/run" --stage 2 --world-size 2 --steps 2 >/dev/null 2>&1
step "cogexport inspect $out/run/checkpoint-2"
.venv/bin/cogexport inspect "$out/run/checkpoint-2"
step "cogexport --model-type t2v $out/run/checkpoint-2 $out/exported --base $out/base"
.venv/bin/cogexport --model-type t2v "$out/run/checkpoint-2" "$out/exported" --base "$out/base"
step "cogexport verify $out/exported --against $out/run/checkpoint-2"
.venv/bin/cogexport verify "$out/exported" --against "$out/run/checkpoint-2"
step "loading $out/exported with CogVideoXPipeline.from_pretrained and rendering"
.venv/bin/python scripts/render_pipeline.py "$out/exported" --out "$out/frames.gif" --steps 2 2>/dev/null
