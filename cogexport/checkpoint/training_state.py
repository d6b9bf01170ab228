"""What a trainer saves beside the model that is never model weights: optimizer states, schedulers, RNG states, data
loader positions, callbacks and the trainer's own counters. Every reader asks here, so one rule says for every
format which key sets are training state; a reader names what it leaves out (its facts or notes) and never writes
it as weights.

Two signs, either enough:

- the key set's name: a top-level group (a DCP save's first path element, a saved dict's entry, a flat name's first
  dotted component) called as trainers call their training state (``optimizer``, ``optimizers.student``,
  ``lr_scheduler_0``, ``callbacks``, ``dataloader``, ``rng_state``, ``train_state``, ...);
- the key's own path: a ``state`` component followed by an optimizer state's name as the last component
  (``state.blocks.0.weight.exp_avg``, ``optimizer.state.3.step``), or a ``param_groups`` component: torch.optim's
  state dict, flattened or not, whatever group holds it.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from ..errors import CogExportError, quoted

_GROUP = re.compile(
    r"^(optim|optims|optimizers?|optimizer_states?|optimizer_state_dict|optim_states?)(_\d+)?$"
    r"|^(lr_)?schedulers?(_\d+)?$|^(grad_)?scaler$"
    r"|^callbacks?$|^(data_?loaders?|samplers?)(_\d+)?$"
    r"|^(rng|rngs|rng_states?|random_states?)(_\d+)?$"
    r"|^(train|trainer|training)_state$|^trainer$|^(global_)?step$|^epoch$|^iteration$")
# The per-parameter entries of torch.optim's optimizers (and bitsandbytes' 8-bit ones) under ``state``.
OPTIMIZER_STATE_LEAVES = frozenset({
    "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step", "momentum_buffer", "square_avg", "grad_avg", "acc_delta",
    "sum", "exp_inf", "mu_product", "eta", "mu", "ax", "prev", "step_size", "state1", "state2", "qmap1", "qmap2",
    "absmax1", "absmax2"})


def is_training_state_group(name: str) -> bool:
    """A top-level group of this name is a trainer's state, not a model (its first dotted component decides:
    FastVideo's ``optimizers.student`` is an optimizer's)."""
    return bool(_GROUP.match(str(name).split(".", 1)[0]))


def components(path: Iterable) -> list[str]:
    """A key's path (DCP's tuple, or a flat name) as its dotted components."""
    return [part for element in path for part in str(element).split(".")]


def is_optimizer_state(parts: Sequence[str]) -> bool:
    """A key whose path (``components``) is torch.optim state: ``state`` ... ``exp_avg``, or ``param_groups``."""
    if "param_groups" in parts:
        return True
    return "state" in parts[:-1] and parts[-1] in OPTIMIZER_STATE_LEAVES


def is_training_state(name: str) -> bool:
    """A flat name (a safetensors key, a torch.save dict's key) that is a trainer's state by either sign."""
    parts = components((name,))
    return is_training_state_group(parts[0]) or is_optimizer_state(parts)


def refuse_training_state_role(role: str | None, where: str) -> None:
    """``--role`` naming a key set of training state (``optimizer``, ``lr_scheduler``): never read as weights."""
    if role is not None and is_training_state_group(role):
        raise CogExportError(f"--role {quoted(role)}: {where} keeps training state under that name (optimizer, "
                             "scheduler, RNG or trainer state), never model weights; name a set of weights (module, "
                             "ema, ...) or drop --role")


def named_training_state(names: Iterable[str], limit: int = 3) -> str:
    """A few of the names, for a note saying what was left out."""
    names = list(names)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
