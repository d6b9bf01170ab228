"""What a pipeline folder needs of Diffusers' pipeline and scheduler classes, remembered as the models' facts are
(diffusers_cache.py), so that an export of a whole pipeline that has met them before does not import Diffusers:
the components and config values a pipeline's model_index.json lists, and a scheduler's config as it writes it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Mapping

from .diffusers_cache import remembered


@dataclass(frozen=True)
class PipelineSignature:
    """What a pipeline's save_pretrained writes into model_index.json besides its components' entries."""

    components: tuple[str, ...]  # every component the class takes, in its signature's order
    config_names: tuple[str, ...]  # its optional arguments, kept as config values
    defaults: Mapping[str, object]  # those arguments' defaults
    optional: tuple[str, ...] = ()  # the components it may be built without (_optional_components)


@dataclass(frozen=True)
class SchedulerConfig:
    file_name: str  # scheduler_config.json for Diffusers' schedulers
    json: str  # the config as the scheduler's save_pretrained writes it


def pipeline_signature(pipeline_class: str) -> PipelineSignature:
    answer = remembered("pipeline", {"class": pipeline_class}, lambda: _ask_pipeline(pipeline_class),
                        fields=("components", "config_names", "defaults", "optional"))
    return PipelineSignature(tuple(answer["components"]), tuple(answer["config_names"]), answer["defaults"],
                             tuple(answer["optional"]))


def _ask_pipeline(pipeline_class: str) -> dict:
    import diffusers

    pipeline = getattr(diffusers, pipeline_class)
    components, config_names = pipeline._get_signature_keys(pipeline)
    parameters = inspect.signature(pipeline.__init__).parameters
    defaults = {name: parameters[name].default for name in config_names if name in parameters}
    return {"components": list(components), "config_names": list(config_names), "defaults": defaults,
            "optional": [name for name in pipeline._optional_components if name in components]}


def scheduler_config(class_name: str, config: Mapping[str, object]) -> SchedulerConfig:
    """The scheduler built from ``config`` (a bad config fails here, when first asked) and its config file."""
    answer = remembered("scheduler", {"class": class_name, "config": dict(config)},
                        lambda: _ask_scheduler(class_name, config), fields=("file_name", "json"))
    return SchedulerConfig(answer["file_name"], answer["json"])


def _ask_scheduler(class_name: str, config: Mapping[str, object]) -> dict:
    import diffusers

    scheduler = getattr(diffusers, class_name)(**config)
    return {"file_name": scheduler.config_name, "json": scheduler.to_json_string()}
