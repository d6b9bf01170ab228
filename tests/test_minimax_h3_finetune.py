"""MiniMax-H3 fine-tunes saved with torch.distributed.checkpoint (dcp.save of {"model": ..., "optimizer": ...}, the
save of FSDP2 runs such as DiffSynth-Studio's and torchtitan-style trainers), in either naming: DiffSynth-Studio's
MiniMaxH3DiT (the release's names, qkv interleaved per head: the release's config.json in the run folder above the
checkpoint says so) and Diffusers' MiniMaxH3Transformer3DModel (needing nothing beside it). Saved in this process by
torch's own writer, one rank; judged by Diffusers' single-file converter on the trained weights (fp32, torch.equal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from minimax_h3_fixtures import ORIGINAL_CONFIG, diffsynth_model, diffusers_config
from safetensors.torch import load_file

WEIGHTS = "diffusion_pytorch_model.safetensors"
# dcp.save in one process, with no process group: what torch says it assumes is what is meant
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def trained_and_saved(model: torch.nn.Module, run: Path) -> dict[str, torch.Tensor]:
    """One AdamW step (so the save holds the optimizer's moments beside the model), then dcp.save into
    run/checkpoint; the model's trained state dict."""
    import torch.distributed.checkpoint as dcp

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sum(parameter.float().square().sum() for parameter in model.parameters() if parameter.requires_grad).backward()
    optimizer.step()
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(run / "checkpoint"))
    return state


def test_a_dcp_finetune_in_the_release_names_exports_what_diffusers_converter_makes(cli, tmp_path):
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    trained = trained_and_saved(diffsynth_model(seed=8), tmp_path / "run")
    # without the release's config.json the qkv order is unknown: refused, nothing written
    refused = cli(tmp_path / "run" / "checkpoint", tmp_path / "refused", "--dtype", "fp32")
    assert refused.exit_code == 2 and not (tmp_path / "refused").exists(), refused.stderr
    (tmp_path / "run" / "config.json").write_text(json.dumps(ORIGINAL_CONFIG))  # the run's copy of the release's
    result = cli(tmp_path / "run" / "checkpoint", tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    expected = convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(trained), config=diffusers_config(),
                                                                      qkv_layout="interleaved")
    ours = load_file(tmp_path / "out" / WEIGHTS)
    assert set(ours) == set(expected) and all(torch.equal(ours[name], expected[name]) for name in expected)


def test_a_dcp_finetune_in_diffusers_names_exports_as_it_is(cli, tmp_path):
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel.from_config(diffusers_config())
    trained = trained_and_saved(model, tmp_path / "run")
    model.save_config(tmp_path / "base")
    result = cli(tmp_path / "run" / "checkpoint", tmp_path / "out", "--dtype", "fp32", "--base", tmp_path / "base")
    assert result.exit_code == 0, result.stderr
    ours = load_file(tmp_path / "out" / WEIGHTS)
    assert set(ours) == set(trained) and all(torch.equal(ours[name], trained[name]) for name in trained)
