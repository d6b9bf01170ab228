"""Messages a new user met that misled: each says what the input is and what to give instead (one line, exit 2,
nothing written). The shape mismatch against --base is in test_export_bad_input.py, the truncated safetensors file in
test_corruption.py, notes under torchrun in test_torchrun.py."""

from __future__ import annotations

import json

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run
from conftest import assert_refused
from safetensors.torch import save_file

from cogexport.models.family import families
from cogexport.models.recognize import component_tables
from cogexport.quantize import quantizable_families, quantization_policy


@pytest.mark.parametrize("name, text, kind", [
    ("README.md", "# My fine-tune\n\nTrained for 500 steps.\n", "a Markdown file"),
    ("config.json", json.dumps({"_class_name": "WanTransformer3DModel", "num_layers": 30}), "a JSON file"),
    ("train.yaml", "lr: 1e-4\nsteps: 500\n", "a YAML file"),
    ("weights.pt", "", "empty (0 bytes)"),
])
def test_a_file_that_is_not_weights_is_named_for_what_it_is(cli, tmp_path, name, text, kind):
    (tmp_path / "run").mkdir()
    given = tmp_path / "run" / name
    given.write_text(text)
    for command in (["inspect"], ["consolidate"], []):
        line = assert_refused(cli, tmp_path, [*command, given, *([] if command == ["inspect"] else [tmp_path / "out"])],
                              f"{given} is {kind}", f"give the checkpoint's folder (perhaps {tmp_path / 'run'})",
                              inputs=[tmp_path / "run"])
        assert "torch.save" not in line and ("copy it again" in line) == (kind == "empty (0 bytes)")


def test_a_git_lfs_pointer_is_named_whatever_the_file_is_called(cli, tmp_path):
    (tmp_path / "release").mkdir()
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 5675451648\n"
    for name in ("diffusion_pytorch_model.safetensors", "Wan2.1_VAE.pth"):
        (tmp_path / "release" / name).write_text(pointer)
        assert_refused(cli, tmp_path, [tmp_path / "release" / name, tmp_path / "out"], "is a Git LFS pointer",
                       "git lfs pull", inputs=[tmp_path / "release"])


@pytest.mark.parametrize("component, title", [("transformer", "transformer"), ("vae", "VAE")])
def test_the_layouts_tried_are_counted_once_each_by_family(cli, tmp_path, component, title):
    save_file({"foo.weight": torch.ones(2), "bar.bias": torch.ones(3)}, tmp_path / "odd.safetensors")
    candidates = component_tables(component)
    owners = list(dict.fromkeys(family.name for family, _ in candidates))
    line = assert_refused(cli, tmp_path, [tmp_path / "odd.safetensors", tmp_path / "out", "--component", component],
                          f"holds no {title} weights cogexport recognises (it tried the "
                          f"{len({name for _, name in candidates})} {title} layouts of {', '.join(owners)});",
                          inputs=[tmp_path / "odd.safetensors"])
    # short beside the families it names (their list grows with every family): no table names, none twice
    assert len(line) < 250 + len(", ".join(owners)) and "/" not in line.split("recognises")[1].split(";")[0], \
        "no table names, none twice"


def test_a_family_without_comfyui_quantized_files_is_refused_first_in_user_words(cli, tmp_path):
    """A CogVideoX run of unpublished size: --to comfyui refused at once, with why (its quantized.toml's [fp8]
    refused), not after being asked for --base; --to gguf writes its file (no loader reads it: the run says so)."""
    assert "cogvideox" in quantizable_families() and quantization_policy("cogvideox").fp8_refused
    original = build_tiny_transformer("5b-i2v", num_layers=2, seed=1)
    run = write_sat_run(tmp_path / "run", original.state_dict()).run_dir
    supported = ", ".join(family.name for family in families() if family.key in quantizable_families()
                          and not quantization_policy(family.key).fp8_refused)
    for base in ([], ["--base", config_folder(tmp_path / "base", original)]):
        line = assert_refused(cli, tmp_path, [run, tmp_path / "out", "--to", "comfyui", "--quant", "fp8", *base],
                              "is a CogVideoX model", "of CogVideoX models (which names ComfyUI's own CogVideoX model",
                              f"only of {supported}); export it to a Diffusers folder (drop --to) or its original "
                              "layout (--to original)", inputs=[tmp_path / "run"])
        assert "--base" not in line and "quantized.toml" not in line
    written = cli(run, tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0", "--base", tmp_path / "base")
    assert written.exit_code == 0, written.stderr
    assert "no GGUF loader (ComfyUI-GGUF, Diffusers) reads CogVideoX GGUF files today" in written.stderr
