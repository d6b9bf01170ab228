"""Check a consolidated checkpoint against the ground truth make_deepspeed_checkpoint.py took inside training.

    python scripts/check_against_truth.py OUTPUT TRUTH_DIR [--dtype fp32|bf16|fp16] [--json]

OUTPUT is what a consolidation wrote: a folder of safetensors files (``model.safetensors`` or shards) or of torch
``.bin`` files (what zero_to_fp32 writes by default), or one such file. TRUTH_DIR holds truth.safetensors and
truth.json. What a consolidation at --dtype must hold, name for name (every name of the module's state_dict, nothing
else): trainable parameters are the fp32 masters, frozen parameters their stored values, tied aliases a copy of their
source, each of these cast to --dtype; buffers and integer tensors exactly as stored, in their own dtype. Each
written tensor must have that dtype and be equal (torch.equal) to the truth cast the same way. Exit 1 and the
differences listed otherwise. benchmark_consolidate.py checks every tool's output with it before timing anything.
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from typing import Callable
from pathlib import Path

import click
import torch
from safetensors import safe_open

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TruthMismatch(Exception):
    """The output differs from the ground truth; the message lists how."""


def _output_files(output: Path) -> list[Path]:
    if output.is_file():
        return [output]
    files = sorted(output.glob("*.safetensors")) or sorted(output.glob("*.bin"))
    if not files:
        raise TruthMismatch(f"no .safetensors or .bin files in {output}")
    return files


def _open_output(files: list[Path], stack: ExitStack) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a function reading that tensor; safetensors are read one tensor at a time, .bin files mmapped."""
    readers = {}
    for path in files:
        if path.suffix == ".safetensors":
            handle = stack.enter_context(safe_open(path, framework="pt"))
            names = list(handle.keys())
            readers.update({name: (lambda handle=handle, name=name: handle.get_tensor(name)) for name in names})
        else:
            state_dict = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            readers.update({name: (lambda tensor=tensor: tensor) for name, tensor in state_dict.items()})
    return readers


def check_consolidated(output: Path, truth_dir: Path, dtype: str = "fp32") -> dict:
    """Compare ``output`` with the truth in ``truth_dir``; raise TruthMismatch listing every difference."""
    facts = json.loads((truth_dir / "truth.json").read_text())
    target, buffers, tied = DTYPES[dtype], set(facts["buffers"]), facts["tied"]
    problems = []
    with ExitStack() as stack:
        written = _open_output(_output_files(Path(output)), stack)
        truth = stack.enter_context(safe_open(truth_dir / "truth.safetensors", framework="pt"))
        problems += [f"{name}: missing" for name in facts["order"] if name not in written]
        problems += [f"{name}: not in the module's state_dict" for name in written if name not in facts["order"]]
        for name in facts["order"]:
            if name not in written:
                continue
            expected = truth.get_tensor(tied.get(name, name))
            if name not in buffers and expected.dtype.is_floating_point:
                expected = expected.to(target)
            got = written[name]()
            if got.dtype != expected.dtype:
                problems.append(f"{name}: dtype {got.dtype}, expected {expected.dtype}")
            elif got.shape != expected.shape:
                problems.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
            elif not torch.equal(got, expected):
                problems.append(f"{name}: values differ from the ground truth")
    if problems:
        raise TruthMismatch(f"{output} differs from the ground truth in {len(problems)} place(s): "
                            + "; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))
    exact = dtype == "fp32"
    return {"tensors": len(facts["order"]), "dtype": dtype,
            "summary": f"all {len(facts['order'])} tensors equal the ground truth taken inside the training process"
                       + (", bit for bit" if exact else f", cast to {dtype} as a {dtype} consolidation must be")}


@click.command()
@click.argument("output", type=click.Path(exists=True, path_type=Path))
@click.argument("truth_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="fp32", show_default=True,
              help="The --dtype the consolidation was made with.")
@click.option("--json", "as_json", is_flag=True)
def main(output: Path, truth_dir: Path, dtype: str, as_json: bool) -> None:
    try:
        result = check_consolidated(output, truth_dir, dtype)
    except TruthMismatch as mismatch:
        click.echo(f"MISMATCH: {mismatch}", err=True)
        sys.exit(1)
    click.echo(json.dumps(result) if as_json else f"checked: {result['summary']}")


if __name__ == "__main__":
    main()
