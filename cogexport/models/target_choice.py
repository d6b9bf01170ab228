"""Which Diffusers transformer a checkpoint is exported into: its config (from --base, from the config the original
release keeps beside its weights, or the published variant of its shapes), the variant whose pipeline it belongs to,
and what the user should be told about the choice. Every disagreement between what the user said (--model-type,
--model-name, --base) and what the shapes say is one line here, before anything is planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import CogExportError
from .base_folder import BaseFolder
from .family import ModelFamily, Variant
from .lookalikes import refuse_unsaid_lookalike
from .recognize import Recognised, config_beside
from .target import TargetModel, build_target


@dataclass(frozen=True)
class TargetRequest:
    """What the user said about the model to export into."""

    model_type: str | None = None  # --model-type: the task
    model_name: str | None = None  # --model-name: a published variant
    base: BaseFolder | None = None  # --base: its config decides
    component: str = "transformer"  # the pipeline component written (transformer_2: a second expert)
    experts: tuple[str, ...] = ()  # the release's expert subfolders, when the input holds several experts


@dataclass
class TransformerChoice:
    family: ModelFamily
    target: TargetModel
    variant: Variant  # the published variant whose pipeline, scheduler and VAE the model takes
    label: str  # what the model is, for the user: a published name, or a custom size in a variant's layout
    published: bool  # the model is that published variant (its Hub id may be named as the base model)
    notes: list[str] = field(default_factory=list)  # what the user should know about the choice
    # the model as the messages of planning name it (whose config it is), and what to do when its shapes disagree
    described_as: str = "the target model"
    remedy: str = ""


def choose_transformer(recognised: Recognised | None, family: ModelFamily, request: TargetRequest, where: str,
                       folders: Sequence[Path] = ()) -> TransformerChoice:
    """The transformer to export into: --base's config, else the config the original release keeps beside its
    weights, else the published variant of this shape (of --model-type's task, when tasks share shapes).
    ``recognised`` is None for an adapter alone (no weights to read shapes from)."""
    base = request.base
    base_config = _base_config(base, request.component)
    _check_task_known(family, request.model_type, where)
    published = _published_variant(recognised, family, request, where)
    beside = None if base_config is not None or request.model_name or recognised is None else \
        config_beside(family, folders, recognised.facts)
    notes: list[str] = []
    if base_config is not None or beside is not None:
        config = base_config if base_config is not None else beside
        variant = _variant_of_config(family, config, published, request)
        told = f"--base {base.path}" if base_config is not None else "the config beside the checkpoint"
    else:
        if recognised is not None and not request.model_name:  # nothing said which model: the weights must
            refuse_unsaid_lookalike(recognised, where)
        variant = _named_or_published(family, request, published, recognised, where)
        config = family.transformer_config(variant)
        told = f"--model-name {request.model_name}"
        notes = _other_task_notes(recognised, family, request, variant, where)
    _check_agreement(recognised, family, request, variant, config, told, base_config is not None, where)
    is_published = (published == variant or _is_release(family, recognised, variant, config, request)) \
        if recognised else base_config is None
    label = variant.name if is_published else f"custom-size {family.name} ({variant.name} layout)"
    described_as, remedy = _config_source(base if base_config is not None else None, beside is not None, variant,
                                          request.component)
    return TransformerChoice(family, build_target(family.transformer.class_name, config), variant, label,
                             is_published, notes, described_as, remedy)


def _config_source(base: BaseFolder | None, beside: bool, variant: Variant, component: str) -> tuple[str, str]:
    """The model exported into, named by where its config came from, and what to do when the checkpoint's shapes
    are not its shapes."""
    if base is not None:
        return (f"the model --base describes ({base.config_file(component)})",
                "give as --base the Diffusers folder of the model the checkpoint was trained from, if this is not it")
    if beside:
        return ("the model the config.json beside the checkpoint describes",
                "if that config is not the checkpoint's own, pass --base with the Diffusers folder of the model it "
                "was trained from")
    return f"the published {variant.name}", ""


def _is_release(family: ModelFamily, recognised: Recognised, variant: Variant, config: Mapping[str, Any],
                request: TargetRequest) -> bool:
    """A variant whose shapes are another's (HunyuanVideo 1.5's T2V and I2V, 480p and 720p), named by --model-name or
    by the config the release keeps beside its weights: it is that release when the shapes and the config are its."""
    return tuple(variant.experts.values()) == tuple(request.experts) and family.has_config(variant, config) and all(
        recognised.facts.get(key) == value for key, value in variant.shapes.items())


def _base_config(base: BaseFolder | None, component: str) -> dict | None:
    if base is None:
        return None
    config = base.config(component)
    if config is None:
        raise CogExportError(f"--base {base.path} has no {component} config.json (give a pipeline folder with "
                             f"{component}/, or a transformer folder)")
    return config


def _check_task_known(family: ModelFamily, model_type: str | None, where: str) -> None:
    if model_type and model_type not in family.tasks:
        raise CogExportError(f"--model-type {model_type} is not a {family.name} task; {where} is a {family.name} "
                             f"model (tasks: {', '.join(family.tasks)})")


def _published_variant(recognised: Recognised | None, family: ModelFamily, request: TargetRequest,
                       where: str) -> Variant | None:
    """The published variant the shapes are (of --model-type's task when given, which must be one they can be)."""
    if recognised is None:
        return None
    if not request.model_type:
        return recognised.variant
    if request.model_type not in recognised.tasks:
        name = recognised.variant.name if recognised.variant else \
            f"a {family.name} {recognised.task.upper()} model of unpublished size"
        raise CogExportError(f"checkpoint is {name} (in_channels {recognised.facts.get('in_channels')}) but "
                             f"--model-type {request.model_type} was given")
    return family.published_variant(recognised.facts, request.experts, request.model_type)


def _variant_of_config(family: ModelFamily, config: Mapping[str, Any], published: Variant | None,
                       request: TargetRequest) -> Variant:
    base = request.base
    # the pipeline's settings, and its class (tasks that share shapes, such as SkyReels-V2's T2V and diffusion-forcing
    # models, differ in the pipeline alone)
    settings = {**base.settings, "_class_name": base.pipeline_class} if base else None
    variant = family.layout_variant(config, request.experts, settings, base.configs if base else None)
    if base is None and published is not None and family.has_config(published, config):
        return published  # a release whose own config is its published variant's config is that release
    # T2V and I2V models whose configs are alike (Kandinsky 5): a --base pipeline's class says which, else
    # --model-type (a --base pipeline of the other task is a contradiction, reported by _check_agreement)
    wanted = _task_of_pipeline(family, base, variant, request.model_type) if base is not None and base.is_pipeline \
        else request.model_type
    if wanted and wanted != variant.task:
        return _sibling(family, variant, wanted) or variant
    return variant


def _task_of_pipeline(family: ModelFamily, base: BaseFolder | None, variant: Variant,
                      asked: str | None) -> str | None:
    """The task a --base pipeline's class names, when it is the only task of that class and not the variant's; of a
    class that serves several tasks (MiniMax-H3's modular pipeline, which holds both partitions), the one
    --model-type asks for."""
    if base is None or not base.is_pipeline:
        return None
    tasks = [task.name for task in family.tasks.values() if task.pipeline == base.pipeline_class]
    if len(tasks) > 1:
        return asked if asked in tasks else None
    return tasks[0] if len(tasks) == 1 and variant.task not in tasks else None


def _sibling(family: ModelFamily, variant: Variant, task: str) -> Variant | None:
    """The variant of ``task`` with exactly ``variant``'s shapes, experts and transformer config (its image-to-video
    twin, when nothing in the config tells the two apart)."""
    config = family.transformer_config(variant)
    return next((other for other in family.variants if other.task == task and other.shapes == variant.shapes
                 and other.experts == variant.experts and family.transformer_config(other) == config), None)


def _named_or_published(family: ModelFamily, request: TargetRequest, published: Variant | None,
                        recognised: Recognised | None, where: str) -> Variant:
    variant = family.variant_named(request.model_name) if request.model_name else published
    if variant is None:
        what = (f"a {family.shapes.describe(recognised.facts)}, which is not a published {family.name} size"
                if recognised else "an adapter alone")
        raise CogExportError(f"{where} is {what}; pass --base with a Diffusers folder whose config describes it")
    return variant


def _other_task_notes(recognised: Recognised | None, family: ModelFamily, request: TargetRequest, variant: Variant,
                      where: str) -> list[str]:
    """When the shapes fit another task's model too and nothing said which: how to get that one."""
    if recognised is None or request.model_type or request.model_name:
        return []
    others = {task: family.published_variant(recognised.facts, request.experts, task) for task in recognised.tasks[1:]}
    return [f"{where} has the shapes of {other.name if other else f'a {family.name} {task} model'} too; exported as "
            f"{variant.name} ({variant.task}): pass --model-type {task} for that one"
            for task, other in others.items() if other is not None or not recognised.variant]


def _check_agreement(recognised: Recognised | None, family: ModelFamily, request: TargetRequest, variant: Variant,
                     config: Mapping[str, Any], told: str, from_base: bool, where: str) -> None:
    if request.model_type and variant.task != request.model_type:
        raise CogExportError(f"--model-type {request.model_type} was given, but {told} describes {variant.name}, a "
                             f"{variant.task} model")
    if recognised is None:
        return
    if from_base and variant.task not in recognised.tasks:  # e.g. a Wan 2.1 T2V run, a 2.2 TI2V base
        raise CogExportError(f"{where} is a {family.name} {recognised.task.upper()} model (in_channels "
                             f"{recognised.facts.get('in_channels')}), but --base {request.base.path} is a "
                             f"{variant.name}-layout {variant.task.upper()} model; give the base the checkpoint "
                             "was trained from")
    family.shapes.check_target(recognised.facts, config, where)
