"""``cogexport inspect``: what a checkpoint is and holds, as a dict (for --json) or as aligned text."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from .checkpoint import LazyCheckpoint, open_checkpoint
from .checkpoint.copies import placeholders
from .checkpoint.readers import Reader, format_row, info_dict, reader_of_format
from .checkpoint.deepspeed_zero import DTYPE_NAMES
from .errors import CogExportError
from .finite_values import count_nonfinite, nonfinite_problem
from .exporter.output_formats import ReadBack, output_format, output_formats
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .lora import read_adapter
from .models.family import ModelFamily, families
from .models.lookalikes import lookalike_variants
from .models.recognize import (component_tables, config_beside, expert_folders, family_beside, lora_key,
                               preferred_tables, read_facts)
from .models.told_apart import told_apart
from .progress import byte_progress


def inspect_paths(paths: list[Path], tag: str | None = None, check_data: bool = True,
                  progress: bool | None = None, role: str | None = None) -> dict:
    """``inspect_checkpoint`` of the checkpoint, or of each expert of a release holding several (Wan 2.2 A14B's
    high_noise_model/ and low_noise_model/), under ``experts`` by the pipeline component each becomes."""
    if len(paths) == 1 and Path(paths[0]).is_dir():  # a folder of an output format (a Diffusers pipeline, ...)
        for fmt in output_formats():
            report = fmt.inspects_folder(Path(paths[0]), check_data) if fmt.inspects_folder else None
            if report is not None:
                return {**report, "output_format": fmt.name}
    experts = expert_folders([Path(p) for p in paths])
    if not experts:
        return inspect_checkpoint(paths, tag, check_data, progress, role)
    reports = {component: inspect_checkpoint([folder], tag, check_data, progress, role)
               for component, folder in experts.items()}
    return {"paths": [str(p) for p in paths], "experts": reports, "usable": all(r["usable"] for r in reports.values())}


def inspect_checkpoint(paths: list[Path], tag: str | None = None, check_data: bool = True,
                       progress: bool | None = None, role: str | None = None) -> dict:
    """Everything ``inspect`` reports. Problems (missing ranks, ...) are listed, not raised.

    ``check_data`` reads every tensor the way the readers do (so the same checks run: CRC-32s, masters against
    the module's copy, ...) and then every remaining byte of the files; ``report["usable"]`` says whether the
    checkpoint can be exported as it is."""
    with open_checkpoint(paths, tag, strict=False, entry=role) as checkpoint:
        nonfinite = _check_data(checkpoint, progress) if check_data else None
        info = checkpoint.info
        report = {**info_dict(info), "data_checked": check_data, "data_check": _data_check(info.format),
                  "nonfinite_tensors": nonfinite, "usable": not info.problems and len(checkpoint) > 0,
                  "tensors": _tensor_rows(checkpoint), **_sizes(checkpoint)}
        folders = [Path(p) if Path(p).is_dir() else Path(p).parent for p in paths]
        folders += [f for folder in checkpoint.own_folders() for f in (folder, folder.parent)]
        # ZeRO-3's empty placeholders (a problem already) have no shapes to tell a model by
        readable = len(checkpoint) and not placeholders(checkpoint)
        report["models"] = recognise_models(checkpoint, info.header_metadata, folders) if readable else {}
        back = read_back(checkpoint)
        if back is not None:  # a quantized file: say what it holds, and read the model in the weights it stands for
            info.notes += back.notes
            report["notes"] = info.notes
            report["models"] = recognise_models(back.weights, info.header_metadata, folders)
        if "problem" in report["models"].get("lora", {}):
            report["usable"] = False  # an adapter nothing reads
    return report


def read_back(checkpoint: LazyCheckpoint) -> ReadBack | None:
    """What an output format's file stands for (ComfyUI's scaled fp8: its weights dequantized), or None."""
    if not len(checkpoint):
        return None
    return next((back for fmt in output_formats() if fmt.reads_back and (back := fmt.reads_back(checkpoint))), None)


def _dtype_name(dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _tensor_rows(checkpoint: LazyCheckpoint) -> list[dict]:
    info = checkpoint.info
    kinds = {**{n: "trainable" for n in info.trainable}, **{n: "frozen" for n in info.frozen},
             **{n: "tied" for n in info.tied}, **{n: "buffer" for n in info.buffers}}
    return [{"name": name, "kind": kinds.get(name, "parameter"), "shape": list(tensor.shape),
             "dtype": _dtype_name(tensor.dtype)} for name, tensor in checkpoint.items()]


def _sizes(checkpoint: LazyCheckpoint) -> dict:
    """Parameter count, the bytes as fp32 and as stored (a tied tensor counted once), the stored dtypes."""
    info = checkpoint.info
    unique = [checkpoint[n] for n in checkpoint if n not in info.tied]
    if not unique:
        return {"parameter_count": None, "fp32_bytes": None, "stored_bytes": None, "stored_dtypes": []}
    parameters = [checkpoint[n] for n in checkpoint if n not in info.tied and n not in info.buffers]
    return {"parameter_count": sum(t.numel for t in parameters),
            "fp32_bytes": sum(t.numel * 4 if t.dtype.is_floating_point else t.nbytes for t in unique),
            "stored_bytes": sum(t.nbytes for t in unique),
            "stored_dtypes": sorted({_dtype_name(t.dtype) for t in unique})}


def _check_data(checkpoint: LazyCheckpoint, progress: bool | None) -> int:
    """Load every tensor once (each problem recorded once) and count its NaN and infinite values, then check the bytes
    no tensor needed. Returns how many tensors hold such values."""
    problems = checkpoint.info.problems
    unique = [name for name in checkpoint if name not in checkpoint.info.tied]
    nonfinite = 0
    with byte_progress(sum(checkpoint[n].nbytes for n in unique), "checking", progress) as bar:
        for name in unique:
            try:
                count = count_nonfinite(checkpoint[name].load())
            except CogExportError as error:
                problems.append(str(error))
            else:
                problems += [nonfinite_problem(name, count)] if count else []
                nonfinite += bool(count)
            bar.update(checkpoint[name].nbytes)
    problems += checkpoint.check_stored_data()
    problems[:] = list(dict.fromkeys(problems))
    return nonfinite


def _data_check(format: str) -> str:
    """What the reader of ``format`` checks as it reads every byte (its declaration says), and what it cannot see."""
    reader = reader_of_format(format)
    return reader.data_check if reader else Reader.data_check


def _data_row(report: dict) -> str:
    if not report["data_checked"]:
        return f"not read (--quick): not checked ({report['data_check']}), nor whether every value is finite"
    found = report["nonfinite_tensors"]
    values = f"{found} tensor{'s hold' if found > 1 else ' holds'} NaN or infinite values (see problems)" if found \
        else "every value finite"
    return f"every byte read; checked: {report['data_check']}; {values}"


def recognise_models(source: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None = None,
                     folders: Sequence = ()) -> dict:
    """A description of the models in a checkpoint, for ``inspect`` (never raises for unknown content)."""
    keys = list(source)
    if lora_key(keys) is not None:
        return {"lora": _adapter_entry(source, metadata, folders)}
    found: dict = {}
    for component in model_components():
        # the layout export would take (the most specific one; a shared layout under its owner family)
        named = family_beside(folders) if component == "transformer" else None
        preferred = preferred_tables(keys, component_tables(component, named)) if named else []
        for family, table in _told_apart(preferred or preferred_tables(keys, component_tables(component)), source)[:1]:
            selected, ignored = table.select(keys)
            entry = {"family": family.name, "layout": table.name, "description": table.source, "keys": len(selected),
                     "other_keys": len(ignored)}
            if component == "transformer":
                entry.update(_transformer_facts(source, family, table, metadata, folders))
            found[component] = entry
    return found


def _told_apart(fitting: list, source: Mapping[str, LazyTensor]) -> list:
    """Look-alike layouts as export tells them apart by the input's files; as they are where nothing says which
    (export refuses such an input; inspect still describes it)."""
    try:
        return told_apart(fitting, source, "the checkpoint")
    except CogExportError:
        return fitting


def _adapter_entry(source: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None, folders: Sequence) -> dict:
    try:
        adapter = read_adapter(source, "the checkpoint", folders=folders, metadata=metadata)
    except CogExportError as error:
        return {"marker": lora_key(list(source)), "problem": str(error)}
    return {**adapter.summary(), "alpha": adapter.alpha if adapter.alpha_recorded else None,
            "assumed_alpha": None if adapter.alpha_recorded else adapter.alpha}


def _transformer_facts(source: Mapping[str, LazyTensor], family: ModelFamily, table: KeyMapTable,
                       metadata: Mapping[str, str] | None, folders: Sequence) -> dict:
    """The transformer's model, task and sizes as its shapes show them (or the problem that stops reading them)."""
    try:
        recognised = read_facts(family, table, {k: tensor.shape for k, tensor in source.items()}, metadata=metadata)
    except CogExportError as error:
        return {"problem": str(error)}
    model, layout = recognised.model, recognised.variant
    try:
        config = config_beside(family, folders, recognised.facts)
    except CogExportError:
        config = None
    if layout is None and config is not None:  # a custom size: the published variant its own config is built like
        layout = family.layout_variant(config)
        model = f"custom-size {family.name} ({layout.name} layout)"
    if config is None and family_beside(folders) is None:  # weights another family's model has too: say both
        model = " or ".join([model, *(variant.name for _, variant in lookalike_variants(recognised))])
    return dict(model=model, model_type=" or ".join(recognised.tasks),
                variant=recognised.variant.name if recognised.variant else None,
                layout_variant=layout.name if layout else None,
                description_of_shape=family.shapes.describe(recognised.facts),
                layers=recognised.facts.get("layers"), hidden_size=recognised.facts.get("hidden"),
                in_channels=recognised.facts.get("in_channels"))


def _names(names: list[str], limit: int = 6) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def model_components() -> tuple[str, ...]:
    """Every model any family exports (transformer, vae, audio_vae, ...), the transformer first."""
    return tuple(dict.fromkeys(name for family in families() for name in family.components))


def _model_rows(models: dict) -> list[tuple[str, str]]:
    rows = []
    for component in model_components():
        entry = models.get(component)
        if entry:
            what = entry.get("model", "") + (f" ({_size(entry)})" if "layers" in entry else "")
            rows.append((component, f"{what + ', ' if what else ''}{entry['description']}: {entry['keys']} keys"
                                    + (f", {entry['other_keys']} other keys ignored" if entry["other_keys"] else "")))
    lora = models.get("lora")
    if lora:
        rows.append(("lora", _adapter_row(lora)))
    return rows


def _size(entry: dict) -> str:
    """The task and its layers and width, or, for a family whose shape facts count no single kind of layer (Kandinsky's
    text and visual blocks), their own description."""
    if entry["layers"] is None or entry["hidden_size"] is None:
        return f"{entry['model_type']}; {entry['description_of_shape']}"
    return f"{entry['model_type']}, {entry['layers']} layers, hidden {entry['hidden_size']}"


def _adapter_row(lora: dict) -> str:
    """The adapter's type, layout, rank and alpha, and what it adapts."""
    if "problem" in lora:
        return f"LoRA run ({lora['marker']}), but: {lora['problem']}"
    alpha = f"alpha {lora['alpha']:g} ({lora['alpha_source']})" if lora["alpha"] is not None else \
        f"alpha not recorded ({lora['alpha_source']}, {lora['assumed_alpha']:g}, would be assumed: pass --lora-alpha)"
    alpha += (", other alphas for some modules" if lora["per_module_alphas"] else "") + \
        (", rank-stabilised (alpha / sqrt(r))" if lora["use_rslora"] else "")
    word = "rank" if set(lora.get("kinds", {})) <= {"LoRA"} else "factor rank"
    ranks = f"{word} {lora['rank']}" if len(lora["ranks"]) == 1 else \
        f"{word} {lora['rank']} (others: {', '.join(str(r) for r in lora['ranks'] if r != lora['rank'])})"
    if lora.get("whole_factors"):
        whole = f"{lora['whole_factors']} modules with whole factors (scale 1 unless the trainer says otherwise)"
        ranks = f"{ranks}, {whole}" if lora["ranks"] else whole
    deltas = "".join(f", {count} modules with {part}" for part, count in lora["deltas"].items())
    return (f"{lora['family']} {lora.get('type', 'LoRA')} adapter, layout {lora['description']}: {ranks}, {alpha}, "
            f"targets {', '.join(lora['target_modules'])}, {lora['modules']} modules in {lora['layers']} layers"
            + deltas + ("" if lora["base_weights"] else ", adapter only (no base weights)"))


def render_inspect_text(report: dict) -> str:
    if "output_format" in report:  # a folder report, rendered by the format that made it
        return output_format(report["output_format"]).renders_folder(report)
    if "experts" in report:
        return "\n\n".join(f"== {component}: {Path(expert['paths'][0]).name}\n{render_inspect_text(expert)}"
                             for component, expert in report["experts"].items())
    tags = report["tags"]
    rows = [
        ("checkpoint", ", ".join(report["paths"])),
        *([("tag", f"{report['tag']}" + (f" (tags here: {', '.join(tags)})" if len(tags) > 1 else ""))]
          if report["tag"] else []),
        ("format", format_row(report)),
        *([("step", str(report["step"]))] if report["step"] is not None else []),
        ("weights", report["weights_source"] or "cannot be assembled (see problems)"),
        *([("holds", "; ".join(report["contents"]))] if report.get("contents") else []),
        *_model_rows(report.get("models", {})),
    ]
    if report["parameter_count"] is not None:
        stored = f"{report['stored_bytes']:,} bytes as saved ({', '.join(report['stored_dtypes'])})"
        rows.append(("parameters", f"{report['parameter_count']:,} elements in {len(report['tensors'])} tensors, "
                                   + (stored if report["stored_bytes"] == report["fp32_bytes"] else
                                      f"{stored}, {report['fp32_bytes']:,} bytes as fp32")))
    rows += [
        ("trainable", f"{len(report['trainable'])} tensors"),
        ("frozen", _names(report["frozen"])),
        ("tied", _names([f"{alias} -> {source}" for alias, source in report["tied"].items()])),
        ("buffers", _names(report["buffers"])),
        ("client state", _names([f"{k}={v}" for k, v in report["client_state"].items()])),
        ("files", f"{len(report['files'])} read"),
    ]
    rows += [("note", note) for note in report["notes"]]
    rows += [("problem", problem) for problem in report["problems"]] or [("problems", "none")]
    rows.append(("data", _data_row(report)))
    rows.append(("usable", "yes" if report["usable"] else "no (see problems)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
