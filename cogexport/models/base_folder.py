"""``--base``: a local Diffusers pipeline folder (or one model folder with config.json) that supplies configs, and for
pipeline exports the components a fine-tune does not change (text encoders, tokenizers, image encoder, and unless
exported, the VAE). Nothing is downloaded. Which family it is comes from the classes its configs name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError
from .family import ModelFamily, families, family_of_class


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CogExportError(f"cannot read {path}: {error.strerror}") from None
    except ValueError:
        raise CogExportError(f"{path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise CogExportError(f"{path} is not a JSON object")
    return data


@dataclass
class BaseFolder:
    path: Path
    family: ModelFamily
    pipeline_class: str | None = None
    components: dict[str, list] = field(default_factory=dict)  # model_index.json entries: name -> [library, class]
    configs: dict[str, dict] = field(default_factory=dict)  # component name -> its config.json
    settings: dict = field(default_factory=dict)  # the pipeline's own config values (boundary_ratio, ...)
    # a modular pipeline's index files (modular_model_index.json, and model_index.json when it has one too): each
    # component's loading spec is in them, so an export into the pipeline keeps them as they are
    modular_index: tuple[str, ...] = ()

    @property
    def is_pipeline(self) -> bool:
        return self.pipeline_class is not None

    def config(self, component: str) -> dict | None:
        return self.configs.get(component)

    def counts(self, component: str = "transformer") -> dict[str, int] | None:
        """The sizes of the model the folder describes (rules may count by them: a fused layer's heads), or None."""
        from .target import build_target

        config = self.config(component)
        return None if config is None else build_target(self.family.transformer.class_name, config).counts

    def config_file(self, component: str) -> Path:
        """Where ``config(component)`` was read: a pipeline's component folder, or the model folder itself."""
        return self.path / component / "config.json" if self.is_pipeline else self.path / "config.json"

    def component_dir(self, component: str) -> Path:
        folder = self.path / component
        if not folder.is_dir():
            raise CogExportError(f"--base {self.path} has no {component}/ folder, which a {self.family.name} pipeline "
                                 "export takes from it; give the full Diffusers pipeline folder of the base model")
        return folder

    def weight_files(self, component: str) -> list[Path] | None:
        """Where the folder keeps a model's weights (its safetensors, or an older save_pretrained's .bin), or None
        when it holds the config alone."""
        folder = self.component_dir(component) if self.is_pipeline else self.path
        if any(folder.glob("*.safetensors")):
            return [folder]
        older = folder / "diffusion_pytorch_model.bin"
        return [older] if older.is_file() else None

    def check_pipeline(self, linked: tuple[str, ...]) -> None:
        """Before anything is written: the components a pipeline export takes from here are all present."""
        for component in linked:
            self.component_dir(component)
            if component != "vae" and component not in self.components:
                raise CogExportError(f"--base {self.path}/model_index.json has no {component} entry, so Diffusers could "
                                     f"not load the pipeline; give a complete {self.family.name} pipeline folder")


def _family_of_pipeline(pipeline_class: str) -> ModelFamily | None:
    return next((family for family in families()
                 if any(task.pipeline == pipeline_class for task in family.tasks.values())), None)


def _known_classes() -> str:
    return ", ".join(dict.fromkeys(name for f in families() for spec in f.components.values() for name in spec.classes))


# A modular pipeline's index (Diffusers' ModularPipeline: MiniMax-H3) names each component as [library, class,
# loading spec]; a classic pipeline's model_index.json as [library, class].
MODULAR_INDEX = "modular_model_index.json"


def _open_pipeline(path: Path) -> BaseFolder:
    modular = (path / MODULAR_INDEX).is_file()
    index_name = MODULAR_INDEX if modular else "model_index.json"
    index = read_json(path / index_name)
    if not isinstance(index.get("_class_name"), str):
        raise CogExportError(f"--base {path}/{index_name} names no pipeline class (_class_name)")
    index = {k: v[:2] if isinstance(v, list) and len(v) == 3 and modular else v for k, v in index.items()}
    # every Diffusers model component's config (transformer, transformer_2, vae, ...): what cogexport exports into
    # (Diffusers' own models, and a pipeline's own models a family exports: LTX-2's ["ltx2", "LTX2TextConnectors"])
    configs = {component: read_json(path / component / "config.json") for component, entry in index.items()
               if isinstance(entry, list) and len(entry) == 2 and (entry[0] == "diffusers" or family_of_class(entry[1]))
               and (path / component / "config.json").is_file()}
    found = [family_of_class(config.get("_class_name")) for config in configs.values()]
    family = next((f[0] for f in found if f), None) or _family_of_pipeline(index["_class_name"])
    if family is None:
        raise CogExportError(f"--base {path} is a {index['_class_name']}, which cogexport does not export into "
                             f"(its models: {_known_classes()})")
    index_files = (MODULAR_INDEX, *(["model_index.json"] if (path / "model_index.json").is_file() else [])) \
        if modular else ()
    return BaseFolder(path, family, index["_class_name"],
                      {k: v for k, v in index.items() if not k.startswith("_") and isinstance(v, list)}, configs,
                      {k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)},
                      index_files)


def _open_model(path: Path) -> BaseFolder:
    config = read_json(path / "config.json")
    found = family_of_class(config.get("_class_name"))
    if found is None:
        return _open_original_model(path, config)
    family, component = found
    return BaseFolder(path, family, configs={component: config})


def _open_original_model(path: Path, config: dict) -> BaseFolder:
    """A release folder in its original layout whose config.json a family claims and translates without the
    weights (FramePack's): the transformer of that family, with the translated config."""
    for family in families():
        translated = family.shapes.base_config(config, path / "config.json") if family.shapes.claims_config(config) \
            else None
        if translated is not None:
            return BaseFolder(path, family, configs={"transformer": translated})
    raise CogExportError(f"--base {path}/config.json describes {config.get('_class_name')!r}, not a model "
                         f"cogexport exports into ({_known_classes()})")


def open_base(path: Path) -> BaseFolder:
    path = Path(path)
    if not path.is_dir():
        raise CogExportError(f"--base {path} is not a folder (give a local Diffusers pipeline or model folder)")
    if (path / "model_index.json").is_file() or (path / MODULAR_INDEX).is_file():
        return _open_pipeline(path)
    if (path / "config.json").is_file():
        return _open_model(path)
    # A folder holding one model folder (base/transformer/config.json) stands for that model.
    inside = sorted(p.parent for p in path.glob("*/config.json"))
    if len(inside) == 1:
        return _open_model(inside[0])
    if inside:
        raise CogExportError(f"--base {path} holds several model folders ({', '.join(p.name for p in inside)}) and no "
                             f"model_index.json; pass one of them, e.g. --base {inside[0]}")
    raise CogExportError(f"--base {path} has neither model_index.json (a pipeline) nor config.json (a model folder)")
