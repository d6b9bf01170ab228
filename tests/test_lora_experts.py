"""Which expert of Wan 2.2 A14B (transformer: high noise, transformer_2: low noise) an adapter was trained for, from
what its trainer records, and ai-toolkit's side-by-side pairs; the experts' names come from the family's data.

Facts taken from the trainers' sources: ai-toolkit saves an A14B run as NAME_high_noise.safetensors and
NAME_low_noise.safetensors (and a pair per saved step); musubi-tuner records the --dit it trained in
ss_sd_model_name and adds ss_dit_high_noise_name when --dit_high_noise trains one adapter across both experts
(hv_train_network.py's metadata); the release and runs laid out like it hold high_noise_model/ and low_noise_model/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cogexport.lora.experts import expert_of, expert_pairs, expert_tags, trained_on_every_expert
from cogexport.models.family import family_named


@pytest.fixture(scope="module")
def experts():
    return family_named("wan").variant_named("Wan2.2-T2V-A14B").experts


@pytest.mark.parametrize("path,metadata,expected", [
    ("run/my_lora_high_noise.safetensors", None, "transformer"),  # ai-toolkit
    ("run/my_lora_low_noise.safetensors", None, "transformer_2"),
    ("loras/PussyLoRA_HighNoise_Wan2.2.safetensors", None, "transformer"),  # people's names
    ("loras/Wan2.2-Fun-A14B-InP-low-noise-HPS2.1.safetensors", None, "transformer_2"),
    ("run/high_noise_model/lora.safetensors", None, "transformer"),  # the release's layout
    ("run/low_noise_model/adapter_model.safetensors", None, "transformer_2"),
    ("output/wan22.safetensors", {"ss_sd_model_name": "wan2.2_t2v_low_noise_14B_fp16.safetensors"}, "transformer_2"),
    ("output/wan22.safetensors", {"ss_sd_model_name": "wan2.2_i2v_high_noise_14B_fp16.safetensors"}, "transformer"),
    # nothing tells: the caller must ask
    ("output/wan22.safetensors", None, None),
    ("output/wan22.safetensors", {"ss_sd_model_name": "my_merge.safetensors"}, None),
    # told two ways at once: never resolved silently
    ("run/high_noise_model/my_lora_low_noise.safetensors", None, None),
    ("output/high_noise_and_low_noise.safetensors", None, None),
    ("output/wan22_high_noise.safetensors", {"ss_sd_model_name": "wan2.2_t2v_low_noise_14B_fp16.safetensors"}, None),
])
def test_the_expert_an_adapter_was_trained_for(path, metadata, expected, experts):
    assert expert_of(Path(path), metadata, experts) == expected


def test_one_adapter_trained_across_both_experts(experts):
    """musubi-tuner's --dit_high_noise trains one adapter that both experts take: no one expert is its."""
    metadata = {"ss_sd_model_name": "wan2.2_t2v_low_noise_14B_fp16.safetensors",
                "ss_dit_high_noise_name": "wan2.2_t2v_high_noise_14B_fp16.safetensors"}
    assert trained_on_every_expert(metadata, experts)
    assert expert_of(Path("output/wan22.safetensors"), metadata, experts) is None
    assert not trained_on_every_expert({"ss_sd_model_name": "x"}, experts)
    assert not trained_on_every_expert(metadata, {})  # an ordinary model: one transformer


def test_names_come_from_the_familys_data(experts):
    assert experts == {"transformer": "high_noise_model", "transformer_2": "low_noise_model"}
    assert expert_tags(experts) == {"transformer": ("highnoisemodel", "highnoise"),
                                    "transformer_2": ("lownoisemodel", "lownoise")}
    made_up = {"transformer": "early_model", "transformer_2": "late_model"}
    assert expert_of(Path("run/x_late.safetensors"), None, made_up) == "transformer_2"
    assert expert_of(Path("run/x_high_noise.safetensors"), None, {}) is None


def test_side_by_side_pairs(experts):
    files = [Path(f"output/{name}.safetensors") for name in (
        "my_lora_high_noise", "my_lora_low_noise",  # the final pair
        "my_lora_000000500_high_noise", "my_lora_000000500_low_noise",  # a step's pair
        "my_lora_000001000_high_noise",  # a half pair
        "other", "notes_high_noise_and_low_noise")]
    pairs = expert_pairs(files, experts)
    assert pairs == {"mylora": {"transformer": files[0], "transformer_2": files[1]},
                     "mylora000000500": {"transformer": files[2], "transformer_2": files[3]}}
    twice = [Path("a/x_high_noise.safetensors"), Path("b/x_high-noise.safetensors"), Path("a/x_low_noise.safetensors")]
    assert expert_pairs(twice, experts) == {}  # two files for one expert under one name: no pair
