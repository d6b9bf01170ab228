"""Run FastVideo's own converter, ``fastvideo/train/entrypoint/dcp_to_diffusers.py``, from its source on CPU, for
scripts/benchmark_training_stacks.py.

    FASTVIDEO_SRC=/path/to/FastVideo python scripts/fastvideo_dcp_to_diffusers.py --checkpoint RUN/checkpoint-1 \
        --output-dir OUT --config RUN.yaml

The arguments are the script's own; its ``main()`` runs unchanged (its DCP load of every trainable role's weights,
optimizer and scheduler, its ``get_model_state_dict``, its renaming and ``save_file``, its copy of the base folder).
FastVideo cannot be installed here (it pins torch 2.12 and CUDA-only kernels), so it runs from its source on this
venv's torch, in a venv of its own that sees this one's packages and adds the few FastVideo imports on the way
(docs/benchmarks.md#training-stacks has the commands), and two things are stood in for, nothing else:

- ``torchvision``: imported at module level by FastVideo's pipeline stages (image transforms); the export calls none
  of it, and PyPI has no torchvision built for this CPU torch. An empty module answers FastVideo's imports of it
  (others, transformers' probes, find none).
- ``build_from_config``: FastVideo's builder loads each role through its pipeline loader, which wants a GPU, the run's
  VAE and its preprocessed parquet data. The stand-in builds, for each role of the run's config, the transformer the
  run trained: the base's Diffusers Wan config, its parameters under FastVideo's names (the mapping
  make_fastvideo_checkpoint.py trains under), uninitialised fp32 storage (FastVideo would read the base's weights
  first: time and memory this row does not count), and ``reverse_param_names_mapping`` as FastVideo's loader records
  it; each trainable role an AdamW and a LambdaLR scheduler, as trained. The method is FastVideo's own
  ``TrainingMethod`` (its ``checkpoint_state`` names what is loaded), subclassed only to name those optimizers and
  schedulers. So the row is a lower bound of the script's cost.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
LEARNING_RATE = 1e-2  # make_fastvideo_checkpoint.py's; the optimizer's settings are overwritten by the load anyway


def _placeholder(attribute: str):
    if attribute.startswith("__"):  # a module's own dunders stay absent, as introspection expects
        raise AttributeError(attribute)
    return type(attribute, (), {})


class _EmptyTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``torchvision`` and its submodules with empty modules whose attributes are inert placeholders."""

    def __init__(self, source: str) -> None:
        self.source = source

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] != "torchvision" or not self._imported_by_fastvideo():
            return None  # others (transformers) probe for torchvision and must find none
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def _imported_by_fastvideo(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(("<frozen", os.path.dirname(os.__file__))):
            frame = frame.f_back  # the import machinery's own frames
        return frame is not None and frame.f_code.co_filename.startswith(self.source)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _placeholder
        return module

    def exec_module(self, module):
        pass


def stand_in_torchvision(source: str) -> None:
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.pop("torchvision", None)
        # transformers and Diffusers decide once, when first imported, whether torchvision is there: before the
        # stand-in (once FastVideo has imported it, it is in sys.modules for every later probe)
        import diffusers.utils.import_utils  # noqa: F401
        import transformers.utils.import_utils  # noqa: F401

        sys.meta_path.append(_EmptyTorchvision(source))


def role_transformer(config: dict, trainable: bool):
    """The trained transformer under FastVideo's parameter names, uninitialised fp32 on the CPU."""
    import torch
    from diffusers import WanTransformer3DModel

    from make_fastvideo_checkpoint import rename, to_diffusers_names
    from tiny_training import OriginalLayoutModule

    with torch.device("meta"):
        diffusers_model = WanTransformer3DModel.from_config(config)
    names = {rename(name, to_fastvideo=True): name for name in diffusers_model.state_dict()}
    state = {fastvideo: torch.empty(diffusers_model.get_parameter(name).shape) for fastvideo, name in names.items()}
    module = OriginalLayoutModule(state, diffusers_model, to_diffusers_names).requires_grad_(trainable)
    # what FastVideo's loader records: internal name -> (Hugging Face name, merge index, merged count)
    module.reverse_param_names_mapping = {fastvideo: (name, None, None) for fastvideo, name in names.items()}
    return module


def build_from_config(cfg):
    """Stands in for fastvideo.train.utils.builder.build_from_config (see the module docstring)."""
    import torch
    from fastvideo.train.methods.base import TrainingMethod

    config = json.loads((Path(cfg.training.model_path) / "transformer" / "config.json").read_text())
    roles = {}
    for role, model_config in cfg.models.items():
        model = types.SimpleNamespace(transformer=role_transformer(config, bool(model_config.get("trainable"))),
                                      _trainable=bool(model_config.get("trainable")))
        if model._trainable:
            model.optimizer = torch.optim.AdamW(model.transformer.parameters(), lr=LEARNING_RATE)
            model.scheduler = torch.optim.lr_scheduler.LambdaLR(model.optimizer, lambda step: 1.0 / (1 + step))
        roles[role] = model

    class ExportOnlyMethod(TrainingMethod):
        def single_train_step(self, batch, iteration):
            raise NotImplementedError

        def get_optimizers(self, iteration):
            raise NotImplementedError

        def get_lr_schedulers(self, iteration):
            raise NotImplementedError

        @property
        def _optimizer_dict(self):
            return {role: model.optimizer for role, model in roles.items() if model._trainable}

        @property
        def _lr_scheduler_dict(self):
            return {role: model.scheduler for role, model in roles.items() if model._trainable}

    return cfg.training, ExportOnlyMethod(cfg=cfg, role_models=roles), None, 0


def main() -> None:
    sys.path.insert(0, os.environ["FASTVIDEO_SRC"])
    sys.path[1:1] = [str(SCRIPTS), str(SCRIPTS.parent)]  # the fixtures' helpers import cogexport
    stand_in_torchvision(os.environ["FASTVIDEO_SRC"])
    import fastvideo.train.utils.builder as builder
    from fastvideo.train.entrypoint import dcp_to_diffusers

    builder.build_from_config = build_from_config  # dcp_to_diffusers imports it when it runs
    dcp_to_diffusers.main()


if __name__ == "__main__":
    main()
