"""The ``cogexport`` command line: parse, call the library, print. User mistakes exit 2 with one line."""

from __future__ import annotations

import json
import signal
import sys
from functools import wraps
from pathlib import Path

import click

from . import __version__
from .errors import CogExportError
from .inspect_report import inspect_checkpoint, render_inspect_text


def _user_errors_exit_2(command):
    """Print a CogExportError as one line on stderr and exit 2; let real bugs keep their traceback."""

    @wraps(command)
    def run(*args, **kwargs):
        # A killed run must clean up its staging folder like Ctrl-C does.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return command(*args, **kwargs)
        except CogExportError as error:
            click.echo(f"cogexport: error: {error}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("cogexport: interrupted; nothing was written", err=True)
            sys.exit(130)

    return run


def _human_bytes(count: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count} B"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cogexport")
def main() -> None:
    """Turn training checkpoints (DeepSpeed ZeRO, SAT, Diffusers fine-tunes) into Hugging Face folders."""


checkpoint_paths = click.argument("checkpoint", nargs=-1, required=True, type=click.Path(path_type=Path))
output_path = click.argument("output", type=click.Path(path_type=Path))
tag_option = click.option("--tag", help="Tag to read instead of the one named by 'latest' (e.g. global_step500).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")


@main.command()
@checkpoint_paths
@output_path
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Dtype of floating parameters (buffers keep their own).")
@tag_option
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard file (decimal units).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@json_option
@_user_errors_exit_2
def consolidate(checkpoint, output, dtype, tag, max_shard_size, overwrite, as_json) -> None:
    """Consolidate a DeepSpeed ZeRO checkpoint into safetensors weights.

    CHECKPOINT is the save dir (with 'latest'), a tag dir or a checkpoint-N folder; give several folders
    when the rank files of a multi-node run sit on different disks. OUTPUT is the folder to create.
    """
    from .consolidate import consolidate as run_consolidate

    result = run_consolidate(list(checkpoint), output, dtype=dtype, tag=tag, max_shard_size=max_shard_size,
                             overwrite=overwrite)
    for note in result.source["notes"]:
        click.echo(f"cogexport: warning: {note}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    source = result.source
    click.echo(f"wrote {result.output}: {', '.join(result.files)}")
    click.echo(f"  {result.tensors} tensors, {_human_bytes(result.total_bytes)} ({result.dtype} parameters), "
               f"from tag {source['tag']} (step {source['step']}, {source['weights_source']})")


@main.command()
@checkpoint_paths
@tag_option
@json_option
@_user_errors_exit_2
def inspect(checkpoint, tag, as_json) -> None:
    """Describe a checkpoint: format, stage, dtype, ranks, step, parameters, and anything missing."""
    report = inspect_checkpoint(list(checkpoint), tag)
    click.echo(json.dumps(report, indent=2) if as_json else render_inspect_text(report))
