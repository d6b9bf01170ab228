"""The way back for CogVideoX: a Diffusers transformer written as SAT's model-states file with --to original. The
file is what the independent hand-written Diffusers-to-SAT writer in scripts/ makes of the same weights (name for
name, bit for bit), torch.load reads it with weights_only=True, and exporting it again gives the original model:
every tensor torch.equal, the folder byte-identical to save_pretrained's."""

from __future__ import annotations

import pytest
import torch
from cogvideox_fixtures import VARIANTS, build_tiny_transformer, config_folder, diffusers_to_sat_transformer
from wan_fixtures import same_files

from cogexport.exporter import export

SAT_PREFIX = "model.diffusion_model."


@pytest.mark.parametrize("variant", VARIANTS)
def test_diffusers_to_sat_and_back(variant, tmp_path, cli):
    model = build_tiny_transformer(variant, num_layers=2, seed=11)
    if model.config.use_learned_positional_embeddings:  # Diffusers builds this buffer in float64; checkpoints hold fp32
        model.patch_embed.pos_embedding.data = model.patch_embed.pos_embedding.data.float()
    model.save_pretrained(tmp_path / "diffusers")
    result = cli(tmp_path / "diffusers", tmp_path / "sat", "--to", "original", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "sat" / "latest").read_text().strip() == "1"
    states = torch.load(tmp_path / "sat" / "1" / "mp_rank_00_model_states.pt", weights_only=True)
    module = states["module"]
    assert all(name.startswith(SAT_PREFIX) for name in module)

    expected = diffusers_to_sat_transformer(model.state_dict())  # the independent writer
    ours = {name[len(SAT_PREFIX):]: tensor for name, tensor in module.items()}
    assert set(ours) == set(expected)
    assert all(ours[name].dtype == torch.float32 and torch.equal(ours[name], t) for name, t in expected.items())

    export(tmp_path / "sat", tmp_path / "back", base=config_folder(tmp_path / "base", model), dtype="fp32")
    assert same_files(tmp_path / "back", tmp_path / "diffusers") == []
