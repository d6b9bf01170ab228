"""The ``cogexport`` command line: parse, call the library, print. User mistakes exit 2 with one line."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from contextlib import contextmanager, redirect_stdout
from functools import wraps
from pathlib import Path

import click

from . import __version__
from .allocation import reuse_freed_tensor_memory
from .errors import CogExportError, one_line
from .export.experts import expert_names
from .export.options import DIRECTIONS, FP8_DTYPES, FP8_LAYOUTS, component_choices, lora_format_help, quant_help, \
    task_help
from .inspect_report import inspect_paths, render_inspect_text
from .keymap.table import TableError
from .models.family import FamilyError
from .sizes import human_bytes
from .write.ranks import join_job, launched_by_torchrun


def _user_errors_exit_2(command):
    """Print a CogExportError as one line on stderr and exit 2; let real bugs keep their traceback."""

    @wraps(command)
    def run(*args, **kwargs):
        # A killed run (or a closed terminal) must clean up its staging folder like Ctrl-C does.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda number, _frame: sys.exit(128 + number))
        reuse_freed_tensor_memory()
        try:
            with join_job() as ranks:
                with _quiet_unless(ranks.leader):
                    result = command(*args, **kwargs)
        except CogExportError as error:
            click.echo(f"cogexport: error: {error}", err=True)
            _exit(2)
        except (FamilyError, TableError) as error:  # a family's data (maybe another package's) is malformed
            click.echo(f"cogexport: error: key maps: {one_line(str(error))}", err=True)
            _exit(2)
        except OSError as error:  # the machine's answer about a path (permissions, disk full): not a bug of ours
            where = f": {error.filename}" if error.filename else ""
            click.echo(f"cogexport: error: {one_line(f'{error.strerror or error}{where}')}", err=True)
            _exit(2)
        except KeyboardInterrupt:
            click.echo("cogexport: interrupted; nothing was written", err=True)
            _exit(130)
        if launched_by_torchrun():
            _exit(0)
        return result

    return run


def _exit(code: int) -> None:
    """End the command. A rank of a torchrun job leaves at once, its output flushed, once its part and the job's
    collectives are done: gloo's threads, torn down with the interpreter, now and then abort the process
    ("terminate called without an active exception", about one run in fifteen on a loaded 2-core machine), which
    would fail a job whose output is already published."""
    if not launched_by_torchrun():
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def _quiet_unless(speaking: bool):
    """The ranks of a torchrun job but rank 0 print no report (their errors still go to stderr)."""
    if speaking:
        yield
        return
    with open(os.devnull, "w") as devnull, redirect_stdout(devnull):
        yield


class ExportByDefault(click.Group):
    """``cogexport [OPTIONS] CHECKPOINT OUTPUT`` runs ``export``; named subcommands run themselves."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help", "--version"):
            args = ["export", *args]
        return super().parse_args(ctx, args)


def _main_help() -> str:
    from .export.options import family_names

    return (f"Turn video-diffusion training checkpoints and releases ({family_names()}; DeepSpeed ZeRO, PyTorch "
            "distributed, SAT, original releases, Diffusers fine-tunes, LoRA files) into Hugging Face Diffusers "
            "folders, original release layouts and LoRA adapters.\n\n"
            "The main job, a checkpoint to Diffusers, is the default command:\n\n"
            "\b\n    cogexport --model-type t2v CHECKPOINT OUTPUT")


@click.group(cls=ExportByDefault, context_settings={"help_option_names": ["-h", "--help"]}, help=_main_help())
@click.version_option(__version__, prog_name="cogexport")
def main() -> None:
    pass


checkpoint_paths = click.argument("checkpoint", nargs=-1, required=True, type=click.Path(path_type=Path))
output_path = click.argument("output", type=click.Path(path_type=Path))
tag_option = click.option("--tag", help="Tag to read instead of the one named by 'latest' (e.g. global_step500), or "
                                         "the step of a DCP run folder instead of the newest (e.g. checkpoint-500).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
workers_option = click.option("--workers", type=click.IntRange(1), metavar="N",
                              help="Threads reading, checking and casting tensors ahead of the writer (1: one thread "
                                   "does all in turn) [default: one per core but the writer's]. Under torchrun, each "
                                   "process writes its share of the files.")


@main.command()
@checkpoint_paths
@output_path
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Dtype of floating parameters (buffers keep their own).")
@tag_option
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard file (decimal units).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@workers_option
@json_option
@_user_errors_exit_2
def consolidate(checkpoint, output, dtype, tag, max_shard_size, overwrite, workers, as_json) -> None:
    """Consolidate a DeepSpeed ZeRO or PyTorch distributed (DCP) checkpoint into safetensors weights.

    CHECKPOINT is the save dir (with 'latest'), a tag dir or a checkpoint-N folder; give several folders
    when the rank files of a multi-node run sit on different disks. A DCP save, or a run folder of them (the
    newest step is read). OUTPUT is the folder to create.
    """
    from .consolidate import consolidate as run_consolidate

    result = run_consolidate(list(checkpoint), output, dtype=dtype, tag=tag, max_shard_size=max_shard_size,
                             overwrite=overwrite, workers=workers)
    for note in result.source["notes"]:
        click.echo(f"cogexport: warning: {note}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    source = result.source
    click.echo(f"wrote {result.output}: {', '.join(result.files)}")
    click.echo(f"  {result.tensors} tensors, {human_bytes(result.total_bytes)} ({result.dtype} parameters), "
               f"from {source['origin'] or ', '.join(source['paths'])} ({source['weights_source']})")


@main.command()
@checkpoint_paths
@tag_option
@click.option("--quick", is_flag=True,
              help="Read no tensor data: skip the CRC-32 checks and the masters' agreement with the module.")
@json_option
@_user_errors_exit_2
def inspect(checkpoint, tag, quick, as_json) -> None:
    """Describe a checkpoint: format, stage, dtype, ranks, step, parameters, and every problem found.

    Unless --quick, every byte of the checkpoint's files is read and checked as the exporters check what they
    read. Exit code 0 when the checkpoint is usable as it is, 1 when problems are listed (it is not), 2 when it
    cannot be read at all or the command line is wrong (one line on stderr).
    """
    report = inspect_paths(list(checkpoint), tag, check_data=not quick)
    click.echo(json.dumps(report, indent=2) if as_json else render_inspect_text(report))
    if not report["usable"]:
        sys.exit(1)


def _export_help() -> str:
    from .export.options import family_names

    return (f"Export a training checkpoint or release ({family_names()}) to a Diffusers folder, or Diffusers weights "
            "back to the family's original layout (--to original).")


def _model_name_examples() -> str:
    from .models.family import families

    return ", ".join(family.variants[0].name for family in families() if family.variants)


@main.command(help=_export_help())
@checkpoint_paths
@output_path
@click.option("--model-type", metavar="TASK",
              help=f"The model's task, checked against the checkpoint (and choosing between variants of the same "
                   f"shapes): {task_help()}.")
@click.option("--component", type=click.Choice(component_choices()),
              help="What to write [default: pipeline when --base is a pipeline folder (except with --lora fuse), "
                   "else transformer].")
@click.option("--base", type=click.Path(path_type=Path),
              help="Local Diffusers pipeline or model folder: configs, and a pipeline's text encoder and tokenizer.")
@click.option("--vae", "vae_path", type=click.Path(path_type=Path),
              help="VAE checkpoint for a pipeline (original or Diffusers weights) [default: the base's VAE].")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", *FP8_DTYPES]), default="bf16", show_default=True,
              help="Dtype of floating tensors (each family keeps its fp32 allowlist); fp8 (e4m3fn) and fp8_e5m2 write "
                   "ComfyUI's scaled-fp8 file with --to original.")
@click.option("--keep-fp32", multiple=True, metavar="GLOB",
              help="Also keep tensors matching GLOB (on dotted name components) in fp32; repeatable.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard file (decimal units).")
@click.option("--variant", help="File-name variant, as save_pretrained(variant=...) (e.g. bf16).")
@tag_option
@click.option("--ema", is_flag=True,
              help="Export the EMA weights: SAT's TAG-ema folder, or an 'ema' state dict beside 'module'.")
@click.option("--lora", type=click.Choice(["adapter", "fuse"]),
              help="A LoRA run: write the adapter (the default for LoRA runs) or fuse it into the model.")
@click.option("--lora-alpha", type=float, help="The run's lora_alpha, when the checkpoint does not record it.")
@click.option("--lora-expert", metavar="EXPERT",
              help=f"For one adapter of a model with several experts: the expert it was trained for ("
                   f"{' or '.join(expert_names())}, or the pipeline component), when its file name, folder or "
                   "metadata does not say.")
@click.option("--lora-format", metavar="FORMAT",
              help=f"The adapter file's layout: {lora_format_help()} [default: diffusers].")
@click.option("--model-name", help=f"The published model this is (e.g. {_model_name_examples()}); needed for a VAE "
                                   "alone.")
@click.option("--base-model", help="Hub id the model card names as the base model [default: the published one].")
@click.option("--to", "layout", type=click.Choice(list(DIRECTIONS)), default="diffusers", show_default=True,
              help="Write Diffusers folders; the family's original layout (the files its own repository and ComfyUI "
                   "load); or a GGUF file of the transformer (--quant) for ComfyUI-GGUF and Diffusers. A LoRA run is "
                   "fused first for the last two.")
@click.option("--quant", metavar="TYPE", help=f"With --to gguf: the quantization ({quant_help()}).")
@click.option("--fp8-layout", type=click.Choice(list(FP8_LAYOUTS)), default="comfy_quant", show_default=True,
              help="With --dtype fp8: ComfyUI's per-layer comfy_quant markers, the header's _quantization_metadata, or "
                   "the legacy scaled_fp8 / scale_weight layout.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@click.option("--push-to-hub", metavar="REPO", help="Upload the finished folder to this Hub repository.")
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repository private.")
@workers_option
@json_option
@_user_errors_exit_2
def export(checkpoint, output, model_type, component, base, vae_path, dtype, keep_fp32, max_shard_size, variant,
           tag, ema, lora, lora_alpha, lora_expert, lora_format, model_name, base_model, layout, quant, fp8_layout,
           overwrite, push_to_hub, private, workers, as_json) -> None:
    from .export import ExportOptions, command_line, export as run_export, export_gguf, export_original

    options = ExportOptions(model_type=model_type, component=component, base=base, vae=vae_path, dtype=dtype,
                            keep_fp32=tuple(keep_fp32), max_shard_size=max_shard_size, variant=variant, tag=tag,
                            ema=ema, lora=lora, lora_alpha=lora_alpha, lora_expert=lora_expert,
                            lora_format=lora_format, model_name=model_name,
                            base_model=base_model, overwrite=overwrite, quant=quant, fp8_layout=fp8_layout,
                            push_to_hub=push_to_hub, private=private, command=command_line(),
                            workers=workers)
    run = {"original": export_original, "gguf": export_gguf}.get(layout, run_export)
    result = run(list(checkpoint), output, options)
    for note in result.notes:
        click.echo(f"cogexport: note: {note}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"wrote {result.output}: {result.model} {result.component}, {result.tensors} tensors, "
               f"{human_bytes(result.total_bytes)} ({result.precision})")
    if result.lora:
        for expert, lora in (result.lora.get("experts") or {"": result.lora}).items():
            click.echo(f"  {expert + ': ' if expert else ''}{lora['family']} {lora['type']} ({lora['format_title']}), rank "
                       f"{lora['rank']}, alpha {lora['alpha']:g} ({lora['alpha_source']}), scale {lora['scale']:g}, "
                       f"{lora['modules']} modules in {lora['layers']} layers"
                       + (f"; written as {result.lora['written_as']}" if "written_as" in result.lora else ""))
    if result.dropped:
        # One reason a line: a reason may itself contain "; " or ", ".
        click.echo(f"  dropped {len(result.dropped)} source key(s):")
        for reason, count in sorted(Counter(result.dropped.values()).items()):
            click.echo(f"    {reason} ({count} key{'' if count == 1 else 's'})")
    if result.ignored:
        click.echo(f"  ignored {result.ignored} key(s) outside the exported model (T5, VAE, ...)")
    if result.linked:
        click.echo("  " + ", ".join(f"{name} {how} from --base" for name, how in result.linked.items()))
    if result.pushed_to:
        click.echo(f"  uploaded to https://huggingface.co/{result.pushed_to}")


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--against", "against", multiple=True, required=True, type=click.Path(path_type=Path),
              help="The checkpoint the folder was exported from (repeat for several rank folders).")
@tag_option
@click.option("--vae-against", type=click.Path(path_type=Path),
              help="For a pipeline folder: the VAE checkpoint its vae/ was exported from (else vae/ is not checked).")
@click.option("--ema", is_flag=True, help="The folder was exported from the EMA weights (--ema).")
@click.option("--no-load", is_flag=True, help="Skip loading the folder with Diffusers.")
@click.option("--judge-limit", default="8GB", show_default=True,
              help="Largest source (decimal units) for which Diffusers' own converter is asked for a second opinion "
                   "(it holds the converted model in memory).")
@json_option
@_user_errors_exit_2
def verify(output, against, vae_against, tag, ema, no_load, judge_limit, as_json) -> None:
    """Check an exported folder (model, pipeline or LoRA adapter) against the checkpoint it came from.

    Says what it proves: the folder holds what cogexport's key map makes of the checkpoint, cast as declared (a
    consistency check); where Diffusers ships its own converter for the source layout, that converter's result agrees
    (an independent check); and Diffusers loads the folder. Exit code 0 when everything matches, 1 when something
    differs (listed), 2 for bad input (including a checkpoint that does not translate into the folder's model at all).
    """
    from .verify import is_pipeline, verify as run_verify
    from .write.shards import parse_size

    reports = run_verify(output, list(against), tag=tag, ema=ema, load=not no_load, vae_against=vae_against,
                         judge_limit=parse_size(judge_limit))
    vae_files = list((output / "vae").glob("*.safetensors")) if is_pipeline(output) else []
    # Hard-linked files came from --base as they were; only an exported (or copied) VAE deserves the reminder.
    checked = {Path(report.folder) for report in reports}
    if vae_against is None and output / "vae" not in checked and any(path.stat().st_nlink == 1 for path in vae_files):
        click.echo(f"cogexport: note: {output / 'vae'} not checked (pass --vae-against with the VAE checkpoint it was "
                   "exported from, if it was not taken from --base)", err=True)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
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
        f"{report.exact} exact, {report.cast_exact} equal to the cast source; {loaded}"
    lines = [f"{'ok' if report.ok else 'FAILED'}: {report.folder} ({report.kind}, {report.model_class}): "
             f"{report.tensors} tensors, {counted}"]
    lines += [f"  {mismatch}" for mismatch in [*report.mismatches[:20], *report.judge_mismatches[:20]]]
    if report.errors:
        worst = max(report.errors, key=lambda error: error["rms_relative"])
        lines.append(f"  cost of quantizing: worst RMS error {worst['rms_relative']:.2%} of the tensor "
                     f"({worst['name']}, {worst['type']}), largest difference "
                     f"{max(error['max_error'] for error in report.errors):.3g}")
    if report.judge:
        lines.append(f"  second opinion: Diffusers' {report.judge} makes the same {report.judged} tensors"
                     if not report.judge_mismatches else f"  second opinion: Diffusers' {report.judge} disagrees (above)")
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
@workers_option
@json_option
@_user_errors_exit_2
def universal(arguments, tag, overwrite, workers, as_json) -> None:
    """Write DeepSpeed's universal checkpoint, to resume a ZeRO run on a different number of GPUs.

    OUTPUT defaults to TAG_universal next to the tag, and SAVE_DIR/latest_universal points at it; resume with
    {"checkpoint": {"load_universal": true}} and engine.load_checkpoint(SAVE_DIR).
    """
    from .universal import universal as run_universal

    checkpoint, output = _split_output(arguments)
    result = run_universal(checkpoint, output, tag=tag, overwrite=overwrite, workers=workers)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    source = result.source
    click.echo(f"wrote {result.output}: {result.parameters} trainable parameters with their fp32 masters and "
               f"{', '.join(result.optimizer_states) or 'no'} optimizer states, {result.frozen} frozen, "
               f"{result.buffers} buffers ({human_bytes(result.total_bytes)}), from ZeRO-{source['stage']} "
               f"tag {source['tag']} at world size {source['world_size']}")
    click.echo(f"  {result.latest_universal} -> {Path(result.output).name}")
    click.echo(f"  DeepSpeed restores: {result.restored}")
    click.echo(f"  DeepSpeed does not restore: {result.not_restored}")
