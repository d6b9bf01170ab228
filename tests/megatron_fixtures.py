"""Megatron-Core runs for tests: saved by megatron-core's own dist_checkpointing.save on CPU gloo ranks
(scripts/make_megatron_checkpoint.py: a tiny GPTModel at TP=2 x PP=2, iterations 5 and 10), cached like the other
training fixtures, with the ground truth gathered inside the ranks before each save."""

from __future__ import annotations

from pathlib import Path

import torch
from fixtures import SCRIPTS, GroundTruth, cached_fixture

SCRIPTS_USED = ("make_megatron_checkpoint.py", "tiny_training.py", "deepspeed_cpu.py")


class MegatronFixture(GroundTruth):
    """OUT/run (the run folder: the tracker, iter_0000005/, iter_0000010/) and the truth: each model tensor whole,
    under megatron-core's key (stacked layers [L, ...]), at each iteration."""

    @property
    def run(self) -> Path:
        return self.root / "run"

    def iteration(self, number: int) -> Path:
        return self.run / f"iter_{number:07d}"

    def per_layer(self, number: int) -> dict[str, torch.Tensor]:
        """The model at iteration ``number`` as its per-layer names call it: a stacked key's layer n is
        ``...layers.n...`` (the truth's own stacking, taken apart by index)."""
        return unstacked({key: self.tensors[f"iter{number}.{key}"] for key in self.truth["keys"]})


def unstacked(stacked: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron-Core's stacked keys ([L, ...] under ``...layers...``) by their per-layer names: layer n of a stacked
    key is ``...layers.n...``; the other keys as they are."""
    weights = {}
    for key, full in stacked.items():
        if ".layers." not in key:
            weights[key] = full
            continue
        before, after = key.split(".layers.", 1)
        weights.update({f"{before}.layers.{layer}.{after}": full[layer] for layer in range(full.shape[0])})
    return weights


def megatron_run(tp: int = 2, pp: int = 2) -> MegatronFixture:
    command = [str(SCRIPTS / "make_megatron_checkpoint.py"), "--tp", str(tp), "--pp", str(pp)]
    return MegatronFixture(cached_fixture(f"megatron-tp{tp}-pp{pp}", SCRIPTS_USED, command))


class BridgeWanFixture(GroundTruth):
    """OUT/run: a Wan in Megatron-Bridge's layout (iter_0000004/ at TP=2, the bridge's training state beside it);
    the truth: the Diffusers model's own weights and config."""

    @property
    def run(self) -> Path:
        return self.root / "run"

    def base(self, folder: Path) -> Path:
        """A --base folder with the Diffusers config of the model."""
        from diffusers import WanTransformer3DModel

        if not (folder / "config.json").is_file():
            WanTransformer3DModel.from_config(self.truth["config"]).save_config(folder)
        return folder


def megatron_bridge_wan(tp: int = 2) -> BridgeWanFixture:
    scripts = ("make_megatron_bridge_wan.py", *SCRIPTS_USED, "wan_tiny_configs.py", "tiny_models.py")
    command = [str(SCRIPTS / "make_megatron_bridge_wan.py"), "--tp", str(tp)]
    return BridgeWanFixture(cached_fixture(f"megatron-bridge-wan-tp{tp}", scripts, command))


class MegatronBf16Fixture(GroundTruth):
    """OUT/run (iter_0000003/ of a bf16 run with fp32 masters) and the truth: ``model.<key>`` as saved,
    ``master.<key>`` each trained bf16 parameter's fp32 master, under megatron-core's keys (stacked [L, ...])."""

    @property
    def run(self) -> Path:
        return self.root / "run"

    def per_layer(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under ``prefix`` ("model." or "master.") by their per-layer names."""
        return unstacked({k[len(prefix):]: t for k, t in self.tensors.items() if k.startswith(prefix)})


def megatron_bf16_run(tp: int = 2) -> MegatronBf16Fixture:
    command = [str(SCRIPTS / "make_megatron_bf16_checkpoint.py"), "--tp", str(tp)]
    scripts = ("make_megatron_bf16_checkpoint.py", "megatron_iteration.py", *SCRIPTS_USED)
    return MegatronBf16Fixture(cached_fixture(f"megatron-bf16-tp{tp}", scripts, command))


def megatron_moe_run(ep: int = 2) -> MegatronFixture:
    """OUT/run (iter_0000001/ of a mixture-of-experts GPTModel at expert-parallel ``ep``) and the truth: every model
    tensor under megatron-core's key (experts stacked [L, E, ...]), in ``tensors`` as saved (no iteration prefix)."""
    command = [str(SCRIPTS / "make_megatron_moe_checkpoint.py"), "--ep", str(ep)]
    scripts = ("make_megatron_moe_checkpoint.py", "megatron_iteration.py", *SCRIPTS_USED)
    return MegatronFixture(cached_fixture(f"megatron-moe-ep{ep}", scripts, command))
