"""``cogexport export`` (the default command): its options, made from the families and LoRA formats, and its
report. Imported only when the export command runs or help is asked for, so the other commands start without
loading every family's data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from .cli_common import (allow_nonfinite_option, checkpoint_paths, json_option, output_path, role_option, say,
                         tag_option, user_errors_exit_2, verbose_option, workers_option)
from .cli_json import print_object, summarised_result
from .exporter.experts import expert_names
from .exporter.options import DTYPES, component_choices, lora_format_help, quant_help, task_help, to_help
from .exporter.output_formats import chosen_format, to_choices
from .sizes import human_bytes
from .write.comfy_quant_file import LAYOUTS as FP8_LAYOUTS


def _export_help() -> str:
    from .exporter.options import family_names

    others = ", ".join(f"--to {name}" for name in to_choices() if name != "diffusers")
    return (f"Export a training checkpoint or release ({family_names()}) to a Diffusers folder (or a LoRA run to an "
            f"adapter), or to another format: {others}.")


def _model_name_examples() -> str:
    from .models.family import families

    return ", ".join(family.variants[0].name for family in families() if family.variants)


@click.command(help=_export_help())
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
@click.option("--vae", "vae_path", type=click.Path(path_type=Path), multiple=True,
              help="VAE checkpoint for a pipeline (original or Diffusers weights), or a release file holding other "
                   "models of the pipeline (an audio VAE and a vocoder: the family pages say which); repeatable "
                   "[default: the base's].")
@click.option("--dtype", type=click.Choice([*DTYPES, "fp8", "fp8_e5m2"]),
              help="Dtype of floating tensors (each family keeps its fp32 allowlist) [default: bf16; a LoRA adapter "
                   "keeps the dtype it was trained in]; with --to original, fp8 (e4m3fn) and fp8_e5m2 are the older "
                   "spelling of --to comfyui --quant fp8 / fp8_e5m2.")
@click.option("--keep-fp32", multiple=True, metavar="GLOB",
              help="Also keep tensors matching GLOB (on dotted name components) in fp32; repeatable.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard file (decimal units).")
@click.option("--variant", help="File-name variant, as save_pretrained(variant=...) (e.g. bf16).")
@tag_option
@click.option("--ema", is_flag=True,
              help="Export the EMA weights: SAT's TAG-ema folder, an 'ema' state dict beside 'module', imaginaire's "
                   "net_ema.* (a run's model/, NVIDIA's model.pt), or a FastVideo run's EMA (its ema role, else its "
                   "EMA callback's when whole).")
@role_option
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
@click.option("--to", "layout", type=click.Choice(to_choices()), default="diffusers", show_default=True,
              help=f"What to write: {to_help()}. A LoRA run is fused first for all but diffusers.")
@click.option("--quant", metavar="TYPE", help=f"The quantization of a quantized file ({quant_help()}).")
@click.option("--fp8-layout", type=click.Choice(FP8_LAYOUTS),
              help="With --to comfyui: how the file marks its quantized layers: ComfyUI's per-layer comfy_quant "
                   "markers, the header's _quantization_metadata, or the legacy scaled_fp8 / scale_weight layout "
                   "(--quant fp8 only) [default: comfy_quant].")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists and is not empty.")
@click.option("--push-to-hub", metavar="REPO", help="Upload the finished folder to this Hub repository.")
@click.option("--private", is_flag=True, help="With --push-to-hub: create the repository private.")
@allow_nonfinite_option
@workers_option
@json_option
@verbose_option
@user_errors_exit_2
def export(checkpoint, output, model_type, component, base, vae_path, dtype, keep_fp32, max_shard_size, variant,
           tag, ema, role, lora, lora_alpha, lora_expert, lora_format, model_name, base_model, layout, quant,
           fp8_layout, overwrite, push_to_hub, private, allow_nonfinite, workers, as_json, verbose) -> None:
    from .exporter import ExportOptions, command_line

    options = ExportOptions(model_type=model_type, component=component, base=base, vae=vae_path, dtype=dtype,
                            keep_fp32=tuple(keep_fp32), max_shard_size=max_shard_size, variant=variant, tag=tag,
                            ema=ema, role=role, lora=lora, lora_alpha=lora_alpha, lora_expert=lora_expert,
                            lora_format=lora_format, model_name=model_name,
                            base_model=base_model, overwrite=overwrite, quant=quant, fp8_layout=fp8_layout,
                            push_to_hub=push_to_hub, private=private, command=command_line(),
                            workers=workers, allow_nonfinite=allow_nonfinite)
    fmt, options = chosen_format(layout, options)
    result = fmt.export(list(checkpoint), output, options)
    for note in result.notes:
        say("note", note)
    if as_json:
        print_object(True, result.as_dict() if verbose else summarised_result(result.as_dict()))
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
