"""``verify`` of a fused model (a LoRA run merged into its transformer, ``--lora fuse``): what the folder should hold,
computed again from the run and the base weights, and a second opinion from PEFT's own merge.

The base weights are the run's when it saved them beside the adapter (SAT's .original, PEFT's base_layer), else the
transformer of ``--base``, as the export took them. The expected folder is cogexport's fuse (lora/fuse.py) applied to
those inputs: it proves the folder is that computation, cast as declared. The second opinion merges each plain LoRA
module again with PEFT's ``LoraLayer.merge`` (the code Diffusers' ``fuse_lora`` runs), from the same A, B, rank and
alpha: it is independent of cogexport's merge arithmetic and scale, though not of how cogexport read the adapter.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

import torch

from .checkpoint import LazyCheckpoint, open_checkpoint
from .errors import CogExportError
from .keymap.plan import plan_translation
from .lazy import LazyTensor
from .lora import LoraAdapter, LoraModule, base_weights, check_fits, read_adapter
from .models.base_folder import open_base
from .models.family import ModelFamily
from .models.recognize import choose_table
from .models.target import TargetModel
from .verify import VerifyReport, VerifyRequest, same, source_folders

PEFT_JUDGE = "PEFT's LoRA merge (peft.tuners.lora.Linear.merge)"


def fused_inputs(source: LazyCheckpoint, sources: list[Path], component: str, family: ModelFamily,
                 target: TargetModel, request: VerifyRequest,
                 stack: ExitStack) -> tuple[LoraAdapter, dict[str, LazyTensor]]:
    """The run's adapter and the base weights it was fused into (those of --base opened on ``stack``)."""
    where = ", ".join(map(str, sources))
    adapter = read_adapter(source, where, None, source_folders(sources), source.info.header_metadata, family,
                           target.counts)
    check_fits(adapter, target.schema, where)
    if adapter.has_base_weights:
        return adapter, base_weights(adapter, target.schema, target.counts, where)
    return adapter, _base_of(request.base, component, family, target, where, stack)


def _adapter_alone(where: str) -> CogExportError:
    return CogExportError(f"{where} holds only a LoRA adapter, without the model's weights; pass --base with the "
                          "Diffusers pipeline or transformer folder the export fused it into (its --base)")


def refuse_adapter_alone(source: LazyCheckpoint, where: str, request: VerifyRequest) -> None:
    """A LoRA saved without the model's weights needs --base, said in verify's words (the export's name --lora)."""
    if request.base is None and not read_adapter(source, where, None, [], source.info.header_metadata).has_base_weights:
        raise _adapter_alone(where)


def _base_of(base_path: Path | None, component: str, family: ModelFamily, target: TargetModel, where: str,
             stack: ExitStack) -> dict[str, LazyTensor]:
    """--base's transformer in the folder's names: the weights an adapter saved alone was fused into."""
    if base_path is None:
        raise _adapter_alone(where)
    base = open_base(base_path)
    files = base.weight_files(component)
    if files is None:
        raise CogExportError(f"--base {base.path} holds no {component} weights (only its config); give the folder "
                             "with the weights the adapter was fused into")
    weights = stack.enter_context(open_checkpoint(files))
    what = f"--base {files[0]}"
    _, table = choose_table(weights, "transformer", "transformer", what, family)
    return plan_translation(table, weights, target.schema, target.counts, what=what).tensors


def judge_with_peft(adapter: LoraAdapter, base: Mapping[str, LazyTensor],
                    written: Mapping[str, LazyTensor], report: VerifyReport) -> None:
    """Merge every plain LoRA module again with PEFT and compare the folder's weight with PEFT's result."""
    judged = {name: module for name, module in adapter.modules.items() if _peft_merges(module)}
    skipped = len(adapter.modules) - len(judged)
    if not judged:
        report.judge_note = "PEFT's merge was not asked: no module is a plain LoRA (LyCORIS factors or deltas only)"
        return
    report.judge = PEFT_JUDGE
    for name, module in sorted(judged.items()):
        weight = f"{name}.weight"
        if weight not in written:
            continue  # compare() has reported it missing
        merged = _peft_merge(base[weight].load(), module, adapter.use_rslora)
        if same(written[weight], merged) is None:
            report.judge_mismatches.append(f"{weight} differs from what {PEFT_JUDGE} makes of the base weight")
        else:
            report.judged += 1
    if skipped:
        report.judge_note = (f"{skipped} adapted module(s) were not merged by PEFT (LyCORIS factors, bias or "
                             "full-weight deltas): only cogexport's own merge checked them")


def _peft_merges(module: LoraModule) -> bool:
    """A module PEFT's plain LoRA layer merges alone: A and B, no bias, deltas or DoRA magnitude."""
    return module.down is not None and module.bias is None and module.diff is None and module.diff_b is None \
        and module.magnitude is None


def _peft_merge(weight: torch.Tensor, module: LoraModule, rslora: bool) -> torch.Tensor:
    """W merged with the module's A and B by PEFT's own LoRA layer (its scale: alpha / r, or alpha / sqrt(r))."""
    from peft import LoraConfig, inject_adapter_in_model

    out_features, in_features = weight.shape
    holder = torch.nn.Module()
    holder.layer = torch.nn.Linear(in_features, out_features, bias=False)
    config = LoraConfig(r=module.rank, lora_alpha=module.alpha, target_modules=["layer"], use_rslora=rslora)
    inject_adapter_in_model(config, holder, adapter_name="trained")
    with torch.no_grad():
        holder.layer.base_layer.weight.copy_(weight.float())
        holder.layer.lora_A["trained"].weight.copy_(module.down.load().float())
        holder.layer.lora_B["trained"].weight.copy_(module.up.load().float())
    holder.layer.merge(adapter_names=["trained"])
    return holder.layer.base_layer.weight.detach()
