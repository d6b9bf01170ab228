#!/usr/bin/env bash
# Set up .venv, train a small model two steps under real DeepSpeed ZeRO-2 on CPU (2 ranks, bf16),
# then inspect the checkpoint and consolidate it into safetensors with cogexport. Output: demo-output/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
out=demo-output
rm -rf "$out"
export DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore
echo "== training a small model under DeepSpeed ZeRO-2 (2 CPU ranks, bf16)" >&2
.venv/bin/python scripts/make_deepspeed_checkpoint.py "$out/run" --stage 2 --dtype bf16 --world-size 2 >/dev/null 2>&1
echo "== cogexport inspect $out/run/checkpoint" >&2
.venv/bin/cogexport inspect "$out/run/checkpoint"
echo "== cogexport consolidate $out/run/checkpoint $out/consolidated" >&2
.venv/bin/cogexport consolidate "$out/run/checkpoint" "$out/consolidated"
.venv/bin/python scripts/check_against_truth.py "$out/consolidated" "$out/run"
