"""The code half of a model family: what its shapes module (``shapes = "..."`` in family.toml) must provide, and the
defaults of what it may leave out. Checked when the family loads, so a missing hook is one line naming the family
and the hook, never an AttributeError half-way through an export.

A shapes module is a plain Python module. It must define:

- ``read_facts(shapes) -> dict``: facts read off a Diffusers-named transformer state dict (names -> torch.Size);
  raises CogExportError when the names are not the family's transformer.
- ``task_of(facts) -> str``: the task (a key of the family's [tasks]) a model with these facts performs.
- ``describe(facts) -> str``: the model in words, for messages ("Wan transformer, hidden size 1536, ...").
- ``layout_variant(config, experts, pipeline) -> str``: the published variant a (possibly resized) transformer
  config is built like; it decides the pipeline, scheduler and VAE of a custom-size model.
- ``check_target(facts, config, where) -> None``: what the shape plan cannot see (a learned table the config
  would drop); raises CogExportError.

It may define (the defaults in brackets):

- ``tasks_of(facts)``: every task these shapes can be, the default first, when tasks share shapes [(task_of,)].
- ``variant_of_components(name, components)``: refine the variant by the other component configs of a --base
  pipeline (LTX-Video's versions differ only in the VAE) [name].
- ``release_facts(shapes, metadata)``: facts a release file says beside the transformer (its other components'
  keys, its header metadata) [{}].
- ``config_beside(folders, facts)``: the Diffusers config built from an original-layout config file kept beside
  the weights [None].
- ``original_config(config, task)``: the original layout's config file for a Diffusers config [None: none].
- ``original_metadata(config, task[, components])``: header metadata of an original single-file release; a hook
  that takes a third argument gets the Diffusers configs of the other models written into the same file
  ({"vae": ..., ...}) [{}].
- ``original_order(names)``: the names of a model written back in the order the original code's state_dict lists
  them, where its shards are cut in that order [the way back's own order].
- ``original_buffers(config)``: the tensors of the original transformer layout its Diffusers class has no place
  for that the config alone decides (a RoPE table): ``--to original`` writes them when no file kept beside the model
  holds them [{}].
- ``claims_config(config)``: whether an original-layout config.json kept beside the weights is this family's
  model, when its weights' names are another family's too (SkyReels-V2 writes Wan's WanModel config, with
  inject_sample_info) [False].
- ``base_config(config, path)``: the Diffusers config of an original-layout config.json this family claims, when it
  translates without the weights, so that the original release folder can be --base (FramePack's Packed config)
  [None: such a folder is no --base].
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

REQUIRED_HOOKS = ("read_facts", "task_of", "describe", "layout_variant", "check_target")
OPTIONAL_HOOKS = ("tasks_of", "variant_of_components", "release_facts", "config_beside", "original_config",
                  "original_metadata", "claims_config", "base_config", "original_order", "original_buffers")


class FamilyShapes:
    """A family's shapes module behind one declared interface: every hook callable, the optional ones defaulted."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    @staticmethod
    def missing_hooks(module: ModuleType) -> list[str]:
        return [hook for hook in REQUIRED_HOOKS if not callable(getattr(module, hook, None))]

    def _optional(self, hook: str):
        return getattr(self.module, hook, None)

    # -- required ------------------------------------------------------------------------------------------------
    def read_facts(self, shapes: Mapping[str, Any]) -> dict[str, Any]:
        return self.module.read_facts(shapes)

    def task_of(self, facts: Mapping[str, Any]) -> str:
        return self.module.task_of(facts)

    def describe(self, facts: Mapping[str, Any]) -> str:
        return self.module.describe(facts)

    def layout_variant(self, config: Mapping[str, Any], experts: Sequence[str] = (),
                       pipeline: Mapping[str, Any] | None = None) -> str:
        return self.module.layout_variant(config, experts, pipeline)

    def check_target(self, facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
        self.module.check_target(facts, config, where)

    # -- optional ------------------------------------------------------------------------------------------------
    def tasks_of(self, facts: Mapping[str, Any]) -> tuple[str, ...]:
        hook = self._optional("tasks_of")
        return tuple(hook(facts)) if hook else (self.task_of(facts),)

    def variant_of_components(self, name: str, components: Mapping[str, Mapping[str, Any]]) -> str:
        hook = self._optional("variant_of_components")
        return hook(name, components) if hook else name

    def release_facts(self, shapes: Mapping[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
        hook = self._optional("release_facts")
        return hook(shapes, metadata) if hook else {}

    def config_beside(self, folders: Sequence, facts: Mapping[str, Any]) -> dict | None:
        hook = self._optional("config_beside")
        return hook(folders, facts) if hook else None

    def original_config(self, config: Mapping[str, Any], task: str | None) -> dict | None:
        hook = self._optional("original_config")
        return hook(config, task) if hook else None

    def original_metadata(self, config: Mapping[str, Any], task: str | None,
                          components: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
        hook = self._optional("original_metadata")
        if hook is None:
            return {}
        if len(inspect.signature(hook).parameters) >= 3:
            return hook(config, task, dict(components or {}))
        return hook(config, task)

    def original_order(self, names: Sequence[str]) -> list[str]:
        hook = self._optional("original_order")
        return list(hook(names)) if hook else list(names)

    def original_buffers(self, config: Mapping[str, Any]) -> dict[str, Any]:
        hook = self._optional("original_buffers")
        return dict(hook(config)) if hook else {}

    def claims_config(self, config: Mapping[str, Any]) -> bool:
        hook = self._optional("claims_config")
        return bool(hook(config)) if hook else False

    def base_config(self, config: Mapping[str, Any], path: Path) -> dict | None:
        hook = self._optional("base_config")
        return hook(config, path) if hook else None
