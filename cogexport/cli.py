"""The ``cogexport`` command line: parse, call the library, print. User mistakes exit 2 with one line."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from . import __version__
from .cli_common import (allow_nonfinite_option, checkpoint_paths, json_option, output_path, role_option, say,
                         tag_option, user_errors_exit_2, verbose_option, workers_option)
from .cli_json import print_failure, print_object, summarised_inspection, summarised_result
from .errors import ExtensionError, one_line
from .sizes import human_bytes


class ExportByDefault(click.Group):
    """``cogexport [OPTIONS] CHECKPOINT OUTPUT`` runs ``export``; named subcommands run themselves.

    The export command and this help are made from every family's data and LoRA format: they are loaded only when
    asked for, so that ``consolidate``, ``universal``, ``inspect`` and ``verify`` start without them."""

    LAZY = {"export": "cli_export"}

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.list_commands(ctx) and args[0] not in ("-h", "--help", "--version"):
            args = ["export", *args]
        ctx.meta["cogexport.json"] = "--json" in args  # a mistake on the command line is answered in JSON too
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.ClickException as error:  # a usage error: click prints it on stderr and exits with its code
            if ctx.meta.get("cogexport.json"):
                print_failure(one_line(error.format_message()), error.exit_code)
            raise

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            try:
                module = importlib.import_module(f".{self.LAZY[name]}", __package__)
            except ExtensionError as error:  # a malformed family or format, met as the command is built from them
                click.echo(f"cogexport: error: {error.kind}: {one_line(str(error))}", err=True)
                if ctx.meta.get("cogexport.json"):
                    print_failure(f"{error.kind}: {one_line(str(error))}", 2)
                ctx.exit(2)
            self.add_command(getattr(module, name), name)
        return super().get_command(ctx, name)

    @property
    def help(self) -> str:
        return _main_help()

    @help.setter
    def help(self, _value: str | None) -> None:
        pass  # made from the families when asked for (_main_help)


def _main_help() -> str:
    from .exporter.options import family_names

    return (f"Turn video-diffusion training checkpoints and releases ({family_names()}; DeepSpeed ZeRO, PyTorch "
            "distributed, SAT, original releases, Diffusers fine-tunes, LoRA files) into Hugging Face Diffusers "
            "folders, original release layouts and LoRA adapters.\n\n"
            "The main job, a checkpoint to Diffusers, is the default command:\n\n"
            "\b\n    cogexport --model-type t2v CHECKPOINT OUTPUT")


@click.group(cls=ExportByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cogexport")
def main() -> None:
    pass


@main.command()
@checkpoint_paths
@output_path
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Dtype of floating parameters (buffers keep their own).")
@tag_option
@role_option
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard file (decimal units).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@allow_nonfinite_option
@workers_option
@json_option
@verbose_option
@user_errors_exit_2
def consolidate(checkpoint, output, dtype, tag, role, max_shard_size, overwrite, allow_nonfinite, workers,
                as_json, verbose) -> None:
    """Consolidate a DeepSpeed ZeRO or PyTorch distributed (DCP) checkpoint into safetensors weights.

    CHECKPOINT is the save dir (with 'latest'), a tag dir or a checkpoint-N folder; give several folders
    when the rank files of a multi-node run sit on different disks. A DCP save, or a run folder of them (the
    newest step is read); a Megatron-Core run folder (the iteration its tracker names) or one iteration.
    OUTPUT is the folder to create.
    """
    from .consolidation import consolidate as run_consolidate

    result = run_consolidate(list(checkpoint), output, dtype=dtype, tag=tag, role=role, max_shard_size=max_shard_size,
                             overwrite=overwrite, workers=workers, allow_nonfinite=allow_nonfinite)
    for note in [*result.source["notes"], *result.notes]:
        say("warning", note)
    if as_json:
        print_object(True, result.as_dict() if verbose else summarised_result(result.as_dict()))
        return
    source = result.source
    click.echo(f"wrote {result.output}: {', '.join(result.files)}")
    click.echo(f"  {result.tensors} tensors, {human_bytes(result.total_bytes)} ({result.dtype} parameters), "
               f"from {source['origin'] or ', '.join(source['paths'])} ({source['weights_source']})")


@main.command()
@checkpoint_paths
@tag_option
@role_option
@click.option("--quick", is_flag=True,
              help="Read no tensor data: skip the CRC-32 checks and the masters' agreement with the module.")
@json_option
@verbose_option
@user_errors_exit_2
def inspect(checkpoint, tag, role, quick, as_json, verbose) -> None:
    """Describe a checkpoint: format, stage, dtype, ranks, step, parameters, and every problem found.

    Unless --quick, every byte of the checkpoint's files is read and checked as the exporters check what they
    read. Exit code 0 when the checkpoint is usable as it is, 1 when problems are listed (it is not), 2 when it
    cannot be read at all or the command line is wrong (one line on stderr).
    """
    from .inspect_report import inspect_paths, render_inspect_text

    report = inspect_paths(list(checkpoint), tag, check_data=not quick, role=role)
    if as_json:
        print_object(report["usable"], report if verbose else summarised_inspection(report))
    else:
        click.echo(render_inspect_text(report))
    if not report["usable"]:
        sys.exit(1)


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--against", "against", multiple=True, required=True, type=click.Path(path_type=Path),
              help="The checkpoint the folder was exported from (repeat for several rank folders).")
@tag_option
@click.option("--vae-against", type=click.Path(path_type=Path),
              help="For a pipeline folder: the VAE checkpoint its vae/ was exported from (else vae/ is not checked).")
@click.option("--base", type=click.Path(path_type=Path),
              help="The export's --base: for a LoRA saved without the model's weights, the folder it was fused into.")
@click.option("--ema", is_flag=True, help="The folder was exported from the EMA weights (--ema).")
@role_option
@click.option("--no-load", is_flag=True, help="Skip loading the folder with Diffusers.")
@click.option("--judge-limit", default="8GB", show_default=True,
              help="Largest source (decimal units) for which Diffusers' own converter is asked for a second opinion "
                   "(it holds the converted model in memory).")
@json_option
@user_errors_exit_2
def verify(output, against, vae_against, base, tag, ema, role, no_load, judge_limit, as_json) -> None:
    """Check what cogexport wrote (a model or pipeline folder, a fused LoRA model, a LoRA adapter, an original layout,
    GGUF or ComfyUI quantized files, a universal checkpoint) against what it came from.

    Says what it proves: the output holds what cogexport makes of the checkpoint, cast as declared (a consistency
    check); where there is an independent judge (Diffusers' own converter for the layout, PEFT's merge for a fused
    LoRA), its result agrees; and Diffusers loads a Diffusers folder. Exit code 0 when everything matches, 1 when
    something differs (listed), 2 for bad input (including a checkpoint that does not translate into the folder's model
    at all).
    """
    from .verify import is_pipeline, verify as run_verify
    from .write.shards import parse_size

    reports = run_verify(output, list(against), tag=tag, ema=ema, role=role, load=not no_load, vae_against=vae_against,
                         judge_limit=parse_size(judge_limit), base=base)
    vae_files = list((output / "vae").glob("*.safetensors")) if is_pipeline(output) else []
    # Hard-linked files came from --base as they were; only an exported (or copied) VAE deserves the reminder.
    checked = {Path(report.folder) for report in reports}
    notes = []
    if vae_against is None and output / "vae" not in checked and any(path.stat().st_nlink == 1 for path in vae_files):
        notes.append(f"{output / 'vae'} not checked (pass --vae-against with the VAE checkpoint it was exported from, "
                     "if it was not taken from --base)")
    for note in notes:
        say("note", note)
    if as_json:
        print_object(all(r.ok for r in reports), {"reports": [r.as_dict() for r in reports], "notes": notes})
    else:
        for report in reports:
            click.echo("\n".join(_verify_lines(report)))
    if not all(r.ok for r in reports):
        sys.exit(1)


def _verify_lines(report) -> list[str]:
    """One verify report as text: the verdict, what differs, the second opinion or why there is none, the proof."""
    loaded = {True: "loads with Diffusers", False: f"does NOT load with Diffusers ({report.load_error})",
              None: "loading skipped"}[report.loads_with_diffusers]
    counted = f"{report.exact} exact to the reference quantizer" if report.kind == "quantized file" else \
        f"{report.exact} exact, {report.cast_exact} equal to the cast source" + \
        ("" if report.kind == "original layout" else f"; {loaded}")
    lines = [f"{'ok' if report.ok else 'FAILED'}: {report.folder} ({report.kind}, {report.model_class}): "
             f"{report.tensors} tensors, {counted}"]
    lines += [f"  {mismatch}" for mismatch in [*report.mismatches[:20], *report.judge_mismatches[:20]]]
    if report.errors:
        worst = max(report.errors, key=lambda error: error["rms_relative"])
        lines.append(f"  cost of quantizing: worst RMS error {worst['rms_relative']:.2%} of the tensor "
                     f"({worst['name']}, {worst['type']}), largest difference "
                     f"{max(error['max_error'] for error in report.errors):.3g}")
    if report.judge:
        lines.append(f"  second opinion: {report.judge_title} makes the same {report.judged} tensors"
                     if not report.judge_mismatches else f"  second opinion: {report.judge_title} disagrees (above)")
    elif report.judge_note:
        lines.append(f"  no second opinion: {report.judge_note}")
    if report.ok:
        lines.append("  this proves: " + "; ".join(report.proves))
    return lines


def _split_output(arguments: tuple[Path, ...]) -> tuple[list[Path], Path | None]:
    """CHECKPOINT... [OUTPUT]: the last argument is OUTPUT when it is not a checkpoint folder itself."""
    from .checkpoint import is_deepspeed_folder

    if len(arguments) >= 2:
        last = arguments[-1]
        if not last.exists() or (last.is_dir() and (not any(last.iterdir()) or (last / "zero").is_dir()
                                                     or not is_deepspeed_folder(last))):
            return list(arguments[:-1]), last
    return list(arguments), None


@main.command()
@click.argument("arguments", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="CHECKPOINT... [OUTPUT]")
@tag_option
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@allow_nonfinite_option
@workers_option
@json_option
@verbose_option
@user_errors_exit_2
def universal(arguments, tag, overwrite, allow_nonfinite, workers, as_json, verbose) -> None:
    """Write DeepSpeed's universal checkpoint, to resume a ZeRO run on a different number of GPUs.

    OUTPUT defaults to TAG_universal next to the tag, and SAVE_DIR/latest_universal points at it; resume with
    {"checkpoint": {"load_universal": true}} and engine.load_checkpoint(SAVE_DIR).
    """
    from .universal import universal as run_universal

    checkpoint, output = _split_output(arguments)
    result = run_universal(checkpoint, output, tag=tag, overwrite=overwrite, workers=workers,
                           allow_nonfinite=allow_nonfinite)
    for note in result.notes:
        say("warning", note)
    if as_json:
        print_object(True, result.as_dict() if verbose else summarised_result(result.as_dict()))
        return
    source = result.source
    click.echo(f"wrote {result.output}: {result.parameters} trainable parameters with their fp32 masters and "
               f"{', '.join(result.optimizer_states) or 'no'} optimizer states, {result.frozen} frozen, "
               f"{result.buffers} buffers ({human_bytes(result.total_bytes)}), from ZeRO-{source['stage']} "
               f"tag {source['tag']} at world size {source['world_size']}"
               + (f" x {source['tensor_parallel']} tensor-parallel ranks" if source.get("tensor_parallel") else ""))
    click.echo(f"  {result.latest_universal} -> {Path(result.output).name}")
    click.echo(f"  DeepSpeed restores: {result.restored}")
    click.echo(f"  DeepSpeed does not restore: {result.not_restored}")
