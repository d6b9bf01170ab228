"""Diffusers' Cosmos conversion script (huggingface/diffusers scripts/convert_cosmos_to_diffusers.py, not part of the
installed package) run from its own source at toy size on a Cosmos Transfer 2.5 file: the judge of cogexport's key
maps for the base transformer and the control branch.

The script's main block reads the file with torch.load, splits it by whether a name holds "control", converts the
base with ``convert_transformer`` and the control branch with ``convert_controlnet`` (which copies the base's shared
embedders into it), each into a model built from its config table, loaded strictly, and saves both. Here the module
is executed with the one release's config entries replaced by tiny configs, then the main block's own statements up
to the VAE step (which would download Wan 2.1's VAE from the Hub).

    python scripts/cosmos_transfer_judge.py SCRIPT RELEASE.pt TRANSFORMER_CONFIG.json CONTROLNET_CONFIG.json OUT
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

TRANSFER = "Cosmos-2.5-Transfer-General-2B"


def _module_and_main(script: str) -> tuple[ast.Module, list[ast.stmt]]:
    """The script without its main block, and the main block's statements before the VAE step."""
    tree = ast.parse(script)
    (main,) = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    body = []
    for statement in main.body:
        if isinstance(statement, ast.If) and "args.vae_type" in ast.unparse(statement.test):
            break
        body.append(statement)
    else:
        raise RuntimeError("the script's main block no longer has its VAE step; re-check the judge")
    module = ast.Module(body=[node for node in tree.body if node is not main], type_ignores=[])
    return module, body


def convert(script: Path, release: Path, transformer: dict[str, Any], controlnet: dict[str, Any], out: Path) -> Path:
    """The script's conversion of ``release`` into ``out``/transformer and ``out``/controlnet, in fp32."""
    module, main = _module_and_main(script.read_text())
    namespace: dict[str, Any] = {"__name__": "convert_cosmos_to_diffusers"}
    exec(compile(module, str(script), "exec"), namespace)
    namespace["TRANSFORMER_CONFIGS"][TRANSFER] = transformer
    namespace["CONTROLNET_CONFIGS"][TRANSFER] = controlnet
    argv = sys.argv
    sys.argv = [str(script), "--transformer_type", TRANSFER, "--transformer_ckpt_path", str(release),
                "--output_path", str(out), "--dtype", "fp32"]
    try:
        exec(compile(ast.Module(body=main, type_ignores=[]), str(script), "exec"), namespace)
    finally:
        sys.argv = argv
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("script", "release", "transformer_config", "controlnet_config", "out"):
        parser.add_argument(name, type=Path)
    args = parser.parse_args()
    configs = [{k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
               for path in (args.transformer_config, args.controlnet_config)]
    convert(args.script, args.release, *configs, args.out)


if __name__ == "__main__":
    main()
