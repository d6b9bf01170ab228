"""Real DCP checkpoints for tests, made by scripts/make_dcp_checkpoint.py on CPU gloo ranks and cached like the
DeepSpeed fixtures, with the ground truth gathered inside training."""

from __future__ import annotations

from pathlib import Path

import torch
from cogvideox_fixtures import config_folder
from fixtures import SCRIPTS, GroundTruth, cached_fixture

SCRIPTS_USED = ("make_dcp_checkpoint.py", "deepspeed_cpu.py", "cogvideox_tiny_configs.py", "finetune_tiny_cogvideox.py",
                "make_deepspeed_checkpoint.py", "wan_tiny_configs.py", "hunyuanvideo_tiny.py",
                "finetune_tiny_hunyuanvideo.py", "make_tiny_ltx_video.py", "finetune_tiny_ltx_video.py",
                "make_tiny_cogvideox.py", "tiny_training.py", "tiny_models.py")


class DcpFixture(GroundTruth):
    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def last_step(self) -> Path:
        """The folder of the last save (accelerate: checkpoint-N; others: the DCP folder itself)."""
        return self.root / self.truth["checkpoint"]

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The model's full state dict gathered inside training, in state_dict order."""
        return {name: self.tensors[name] for name in self.truth["order"]}

    @property
    def optimizer(self) -> dict[str, torch.Tensor]:
        return {name[len("optimizer."):]: t for name, t in self.tensors.items() if name.startswith("optimizer.")}

    def base(self, folder: Path) -> Path:
        """A --base folder with the trained transformer's config."""
        from diffusers import CogVideoXTransformer3DModel

        return config_folder(folder, CogVideoXTransformer3DModel.from_config(self.truth["config"]))


def dcp_checkpoint(writer: str, model: str = "toy", world_size: int = 2, lora_rank: int | None = None,
                   compile: bool = False) -> DcpFixture:
    name = f"dcp-{writer}-{model}-ws{world_size}" + (f"-lora{lora_rank}" if lora_rank else "") + \
        ("-compile" if compile else "")
    command = [str(SCRIPTS / "make_dcp_checkpoint.py"), "--writer", writer, "--model", model, "--world-size",
               str(world_size)] + (["--lora-rank", str(lora_rank)] if lora_rank else []) + \
        (["--compile"] if compile else [])
    return DcpFixture(cached_fixture(name, SCRIPTS_USED, command))


HF_SCRIPTS_USED = ("make_hf_checkpoint.py", *SCRIPTS_USED)


class HfStorageFixture(DcpFixture):
    """Saves of PyTorch's Hugging Face storage writer in every layout (scripts/make_hf_checkpoint.py), one training
    run, the weights gathered in it."""

    def layout(self, name: str) -> Path:
        """distributed, mapping, consolidated (with sharded/) or torchtitan (a run folder: checkpoint/step-1 a plain
        DCP save, checkpoint/step-2 the consolidated Hugging Face save)."""
        return self.root / name

    def base(self, folder: Path) -> Path:
        """A --base folder with the trained Wan transformer's config."""
        from diffusers import WanTransformer3DModel

        WanTransformer3DModel.from_config(self.truth["config"]).save_config(folder)
        return folder


def hf_storage_checkpoint(model: str = "wan-t2v", world_size: int = 2) -> HfStorageFixture:
    name = f"hf-storage-{model}-ws{world_size}"
    command = [str(SCRIPTS / "make_hf_checkpoint.py"), "--model", model, "--world-size", str(world_size)]
    return HfStorageFixture(cached_fixture(name, HF_SCRIPTS_USED, command))
