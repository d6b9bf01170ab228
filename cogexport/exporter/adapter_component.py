"""Which of its family's tasks an adapter is for, as its file says it: the pipeline component its Diffusers keys (and
adapter config) are prefixed with. A family whose pipeline holds several tasks' transformers names each task's folder
(`[tasks.X] transformer_folder`: MiniMax-H3's `transformer_ref` for Ref2VA), and Diffusers' loaders route a file by
that prefix, so a file prefixed with a task's own folder is that task's adapter: --model-type is taken from it, and an
explicit --model-type (or --model-name) of another task is refused. The default folder (`transformer.`) says nothing:
every trainer writes it whatever the model, and Diffusers loads such a file into either transformer when asked.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import CogExportError
from ..lora import LoraAdapter
from ..models.family import DEFAULT_TRANSFORMER_FOLDER, family_of_variant
from .options import ExportOptions


def _tasks_said(adapter: LoraAdapter) -> tuple[str, ...]:
    """The tasks the file's component names; () when it names none or the default one."""
    if adapter.component is None or adapter.component == DEFAULT_TRANSFORMER_FOLDER:
        return ()
    return adapter.family.tasks_in_folder(adapter.component)


def _task_given(options: ExportOptions) -> tuple[str | None, str]:
    """The task the user named (--model-type, else --model-name's variant's), and how they named it."""
    if options.model_type:
        return options.model_type, f"--model-type {options.model_type}"
    if options.model_name:
        return family_of_variant(options.model_name)[1].task, f"--model-name {options.model_name}"
    return None, ""


def adapter_task_options(adapter: LoraAdapter, options: ExportOptions, where: str) -> ExportOptions:
    """``options`` with --model-type the task the adapter's file names, when it names one and the user did not; a
    task named otherwise than the file's is refused."""
    said = _tasks_said(adapter)
    if not said:
        return options
    given, how = _task_given(options)
    if given is not None and given not in said:
        raise CogExportError(f"{where} is an adapter of the pipeline component {adapter.component} (its keys' prefix: "
                             f"the {' or '.join(said)} transformer of {adapter.family.name}), but {how} is another "
                             f"model; give --model-type {said[0]}, or leave it out")
    if given is None and len(said) == 1:
        return replace(options, model_type=said[0])
    return options


def written_component(adapter: LoraAdapter, options: ExportOptions) -> str:
    """The pipeline component a written adapter names (in a format whose keys name one): the folder of the task
    --model-type (or the file) says, else the one the file names, else the default."""
    task = _task_given(options)[0]
    if task and task in adapter.family.tasks:
        return adapter.family.task(task).transformer_folder
    return adapter.component or DEFAULT_TRANSFORMER_FOLDER
