"""``cogexport inspect`` of a Diffusers folder, as cogexport writes them and the Hub holds them: a pipeline folder
(its components and their classes, and for each model its dtypes, size, file-name variant and shards) or one model
folder, and what the model card says produced it. Weights are read through the checkpoint readers, so with data
checks on, every byte is read as an export would read it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .checkpoint import open_checkpoint
from .checkpoint.deepspeed_zero import DTYPE_NAMES
from .errors import CogExportError
from .finite_values import count_nonfinite, nonfinite_problem
from .models.base_folder import read_json
from .models.family import family_of_class
from .write.diffusers_folders import variant_of

MODEL_INDEX, CONFIG, CARD = "model_index.json", "config.json", "README.md"
_CARD_LINE = re.compile(r"^- (Command|Source|Precision): (.+)$")


def diffusers_folder_kind(path: Path) -> str | None:
    """"pipeline" for a pipeline folder, "model" for a Diffusers model folder (config.json naming a class of a family,
    and weights), else None."""
    if not path.is_dir():
        return None
    if (path / MODEL_INDEX).is_file():
        return "pipeline"
    if (path / CONFIG).is_file() and any(path.glob("*.safetensors")):
        try:
            class_name = json.loads((path / CONFIG).read_text()).get("_class_name")
        except (OSError, ValueError, AttributeError):
            return None
        # a Diffusers class of a family (an original release's config names its own class: WanModel)
        return "model" if isinstance(class_name, str) and family_of_class(class_name) is not None else None
    return None


def inspect_diffusers_folder(path: Path, check_data: bool = True) -> dict:
    kind = diffusers_folder_kind(path)
    if kind == "pipeline":
        return _pipeline_report(path, check_data)
    model = _model_report(path, check_data)
    return {"paths": [str(path)], "kind": "diffusers model", **model, "card": _card(path),
            "usable": not model["problems"]}


def _pipeline_report(path: Path, check_data: bool) -> dict:
    index = read_json(path / MODEL_INDEX)
    components, problems = {}, []
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or entry[:1] == [None]:
            continue
        library, class_name = (entry + [None, None])[:2]
        component = {"library": library, "class": class_name}
        folder = path / name
        if not folder.is_dir():
            problems.append(f"{name}/ is missing, which model_index.json names")
        elif library == "diffusers" and diffusers_folder_kind(folder) == "model":
            component.update(_model_report(folder, check_data))
            problems += [f"{name}: {problem}" for problem in component["problems"]]
        components[name] = component
    settings = {k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)}
    return {"paths": [str(path)], "kind": "diffusers pipeline", "class": index.get("_class_name"),
            "diffusers_version": index.get("_diffusers_version"), "settings": settings, "components": components,
            "card": _card(path), "problems": problems, "usable": not problems}


def _model_report(folder: Path, check_data: bool) -> dict:
    config = read_json(folder / CONFIG)
    class_name = config.get("_class_name")
    found = family_of_class(class_name) if isinstance(class_name, str) else None
    report = {"class": class_name, "family": found[0].name if found else None, "model": _model_name(found, config),
              "variant": variant_of(folder), "files": [], "notes": [], "problems": []}
    try:
        with open_checkpoint(folder, strict=False) as weights:
            if check_data:
                for name in weights:
                    count = count_nonfinite(weights[name].load())
                    report["problems"] += [nonfinite_problem(name, count)] if count else []
            tensors = list(weights.values())
            # the files read, as from_pretrained names them; any other weight file beside them is in a note
            report.update(files=sorted(Path(file).name for file in weights.info.files), notes=weights.info.notes)
            report.update(tensors=len(tensors), parameter_count=sum(t.numel for t in tensors),
                          stored_bytes=sum(t.nbytes for t in tensors),
                          dtypes=_dtype_counts(tensors), data_checked=check_data)
            report["problems"] += weights.info.problems  # what the reader found wrong (ZeRO-3's placeholders, ...)
    except CogExportError as error:
        report["problems"].append(str(error))
    return report


def _model_name(found, config: dict) -> str | None:
    """A transformer's published variant when its config is that variant's, else the layout it is built like."""
    if found is None or found[1] != "transformer":
        return None
    family = found[0]
    try:
        variant = family.layout_variant(config)
    except CogExportError:
        return None
    return variant.name if family.has_config(variant, config) else f"custom-size {family.name} ({variant.name} layout)"


def _dtype_counts(tensors) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tensor in tensors:
        name = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).replace("torch.", ""))
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def _card(folder: Path) -> dict:
    """What the model card says of the folder: its metadata, and for a cogexport card how it was made."""
    path = folder / CARD
    if not path.is_file():
        return {}
    from huggingface_hub import ModelCard

    try:
        card = ModelCard.load(path)
    except Exception as error:  # a card is text from anywhere: its problems are reported, never raised
        return {"problem": f"{CARD} could not be read as a model card: {type(error).__name__}"}
    data = card.data.to_dict()
    made = {match.group(1).lower(): match.group(2).strip("`") for line in card.text.splitlines()
            if (match := _CARD_LINE.match(line.strip()))}
    return {"base_model": data.get("base_model"), "tags": data.get("tags") or [],
            "library": data.get("library_name"), "made_by": "cogexport" if "cogexport" in (data.get("tags") or [])
            else None, **made}


def _model_line(component: dict) -> str:
    if "tensors" not in component:
        return f"{component['class']}" + (f" ({component['library']})" if component.get("library") else "")
    dtypes = ", ".join(f"{count} {dtype}" for dtype, count in component["dtypes"].items())
    variant = f", variant {component['variant']}" if component.get("variant") else ""
    files = f", {len(component['files'])} shards" if len(component["files"]) > 1 else ""
    model = f" ({component['model']})" if component.get("model") else ""
    return (f"{component['class']}{model}: {component['parameter_count']:,} parameters in {component['tensors']} tensors "
            f"({dtypes}), {component['stored_bytes']:,} bytes{variant}{files}")


def render_folder_text(report: dict) -> str:
    rows = [("folder", report["paths"][0]), ("kind", report["kind"] + (f" ({report['class']})"
                                                                       if report["kind"] == "diffusers pipeline" else ""))]
    if report["kind"] == "diffusers pipeline":
        rows += [(name, _model_line(component)) for name, component in report["components"].items()]
        rows += [("settings", ", ".join(f"{k}={v}" for k, v in report["settings"].items()))] if report["settings"] \
            else []
    else:
        rows += [("model", _model_line(report))]
    card = report.get("card") or {}
    if card.get("made_by"):
        rows += [("made by", f"cogexport: {card.get('command', '?')}"), ("from", card.get("source", "?"))]
    if card.get("base_model"):
        rows.append(("base model", str(card["base_model"])))
    notes = report.get("notes", []) + [note for component in report.get("components", {}).values()
                                       for note in component.get("notes", [])]
    rows += [("note", note) for note in notes]
    rows += [("problem", problem) for problem in report["problems"]] or [("problems", "none")]
    rows.append(("usable", "yes" if report["usable"] else "no (see problems)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
