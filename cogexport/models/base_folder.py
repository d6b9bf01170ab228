"""``--base``: a local Diffusers pipeline folder (or one model folder with config.json) that supplies configs,
and for pipeline exports the text encoder, tokenizer and, unless exported, the VAE. Nothing is downloaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError

TRANSFORMER_CLASS = "CogVideoXTransformer3DModel"
VAE_CLASS = "AutoencoderKLCogVideoX"


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
    pipeline_class: str | None = None
    components: dict[str, list] = field(default_factory=dict)  # model_index.json entries: name -> [library, class]
    configs: dict[str, dict] = field(default_factory=dict)  # component name -> its config.json

    @property
    def is_pipeline(self) -> bool:
        return self.pipeline_class is not None

    def config(self, component: str) -> dict | None:
        return self.configs.get(component)

    def component_dir(self, component: str) -> Path:
        folder = self.path / component
        if not folder.is_dir():
            raise CogExportError(f"--base {self.path} has no {component}/ folder; a CogVideoX pipeline folder has "
                                 "text_encoder/, tokenizer/, transformer/, vae/ and scheduler/")
        return folder

    def check_pipeline(self, linked: tuple[str, ...]) -> None:
        """Before anything is written: the components a pipeline export takes from here are all present."""
        for component in linked:
            self.component_dir(component)
            if component in ("text_encoder", "tokenizer") and component not in self.components:
                raise CogExportError(f"--base {self.path}/model_index.json has no {component} entry, so Diffusers could "
                                     "not load the pipeline; give a complete CogVideoX pipeline folder")


def open_base(path: Path) -> BaseFolder:
    path = Path(path)
    if not path.is_dir():
        raise CogExportError(f"--base {path} is not a folder (give a local Diffusers pipeline or model folder)")
    if (path / "model_index.json").is_file():
        index = read_json(path / "model_index.json")
        if not isinstance(index.get("_class_name"), str):
            raise CogExportError(f"--base {path}/model_index.json names no pipeline class (_class_name)")
        base = BaseFolder(path, index["_class_name"],
                          {k: v for k, v in index.items() if not k.startswith("_") and isinstance(v, list)})
        for component in ("transformer", "vae"):
            config_path = path / component / "config.json"
            if config_path.is_file():
                base.configs[component] = read_json(config_path)
        return base
    if (path / "config.json").is_file():
        config = read_json(path / "config.json")
        component = {TRANSFORMER_CLASS: "transformer", VAE_CLASS: "vae"}.get(config.get("_class_name"))
        if component is None:
            raise CogExportError(f"--base {path}/config.json describes {config.get('_class_name')!r}, not a "
                                 f"{TRANSFORMER_CLASS} or {VAE_CLASS}")
        return BaseFolder(path, configs={component: config})
    raise CogExportError(f"--base {path} has neither model_index.json (a pipeline) nor config.json (a model folder)")
