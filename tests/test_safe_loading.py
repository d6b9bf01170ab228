"""Loading never runs pickled code and never needs deepspeed; what training files pickle loads as inert data."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections import OrderedDict

import numpy as np
import pytest
import torch
from fixtures import DeepSpeedVariant, deepspeed_checkpoint

from cogexport.checkpoint.torch_archive import load_torch_file
from cogexport.errors import UnsafeCheckpointError
from cogexport.pickled import PickledObject


def test_deepspeed_classes_become_inert_stand_ins():
    tag = deepspeed_checkpoint(DeepSpeedVariant(2, "fp16", 2)).checkpoint / "global_step2"
    _, tree = load_torch_file(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    state = tree["optimizer_state_dict"]
    assert isinstance(state["loss_scaler"], PickledObject)
    assert state["loss_scaler"].type_name == "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"
    assert state["loss_scaler"].get("cur_scale") == 256
    assert state["zero_stage"] == 2 and type(state["zero_stage"]) is int
    address = state["param_slice_mappings"][0]["embed.weight"]
    assert address.type_name == "deepspeed.utils.tensor_fragment.fragment_address" and address.get("start") == 0


def test_numpy_rng_state_loads_as_data(tmp_path):
    """SAT checkpoints carry numpy's RNG state; torch.load(weights_only=True) refuses them since torch 2.6."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    np.random.seed(7)
    torch.save({"module": OrderedDict(w=torch.arange(6.0).view(2, 3)), "np_rng_state": np.random.get_state(),
                "random_rng_state": random.getstate(), "torch_rng_state": torch.get_rng_state(), "iteration": 1000},
               path)
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    archive, tree = load_torch_file(path)
    kind, keys, position, *_ = tree["np_rng_state"]
    assert kind == "MT19937" and isinstance(keys, PickledObject) and position == 624
    assert tree["iteration"] == 1000
    assert torch.equal(tree["module"]["w"].read(), torch.arange(6.0).view(2, 3))
    assert tree["torch_rng_state"].read().dtype == torch.uint8


@pytest.mark.parametrize("payload", [
    "builtins.eval", "builtins.exec", "os.system", "subprocess.Popen", "torch.load", "torch.jit.load",
    "numpy.load", "builtins.getattr", "importlib.import_module",
])
def test_any_global_outside_the_allowlist_is_refused(tmp_path, payload):
    module, name = payload.rsplit(".", 1)
    # A hand-written pickle: GLOBAL module name, then call it with one string argument.
    pickled = f"c{module}\n{name}\n(Vprint(1)\ntR.".encode()
    import zipfile

    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("evil/data.pkl", pickled)
    with pytest.raises(UnsafeCheckpointError, match=f"pickles '{module}.{name}'"):
        load_torch_file(path)


def test_reading_needs_no_deepspeed(tmp_path):
    """With deepspeed made unimportable, every stage still consolidates."""
    sources = [deepspeed_checkpoint(DeepSpeedVariant(stage, "bf16", 2)).checkpoint for stage in (0, 1, 2, 3)]
    script = textwrap.dedent(f"""
        import sys
        sys.modules["deepspeed"] = None  # any import of deepspeed now raises ImportError
        import cogexport
        for index, source in enumerate({[str(s) for s in sources]!r}):
            cogexport.consolidate(source, {str(tmp_path)!r} + f"/out{{index}}")
        assert "deepspeed" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
