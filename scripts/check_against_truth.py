"""Compare a consolidated folder with the ground truth make_deepspeed_checkpoint.py took inside training.

    python scripts/check_against_truth.py CONSOLIDATED_DIR RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(consolidated: Path, run: Path) -> None:
    truth = json.loads((run / "truth.json").read_text())
    expected = load_file(run / "truth.safetensors")
    written = {}
    for path in sorted(consolidated.glob("*.safetensors")):
        written.update(load_file(path))
    mismatched = [name for name in truth["order"]
                  if not torch.equal(written[name], expected[truth["tied"].get(name, name)].to(written[name].dtype))]
    if mismatched or set(written) != set(truth["order"]):
        sys.exit(f"MISMATCH: {mismatched or sorted(set(written) ^ set(truth['order']))}")
    print(f"checked: all {len(written)} tensors equal the fp32 masters taken inside the training process, bit for bit")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
