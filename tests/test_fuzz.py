"""A fixed-seed slice of scripts/fuzz_checkpoints.py: real checkpoints of every ZeRO stage, a SAT run, a safetensors
file, DCP saves (plain dcp.save at world size 3 with uneven and zero-size chunks, accelerate FSDP2), PyTorch
Hugging Face writer per-rank saves (FSDP2 at 3 ranks, and mapped at 2), a FastVideo run (FSDP2 at 2 ranks: its
metadata.json damaged, a rank lost, key sets filed under the wrong kind), Hugging Face Trainer run folders (ZeRO-2
with the Trainer's 16-bit copy, ZeRO-3 with a copy of placeholders), a DeepSpeed AutoTP save (TP 2 x DP 2: its affine
maps damaged, rank files lost, swapped or copied), a Megatron-Core run (TP 2 x PP 2: its backend file and tracker
rewritten, a rank lost, key sets filed under the wrong kind), a Megatron-Core zarr-backend iteration (its chunk
files lost or cut short, its .zarray files rewritten) and a megatron-core 0.15 torch_dist iteration with the
distributed optimizer's flattened fully_sharded_model_space state (its records of the flattened shapes rewritten, key
sets filed under the wrong kind), damaged in every way the script knows (the
three records of a zip archive's end included); each inspect, consolidate and export run must give the exactly right output, or one
clean line with exit 2 (inspect: the problems listed, exit 1), nothing written and the input unchanged. safetensors data
changed into other finite values is the one damage no reader can tell (the format keeps no checksum); changed into a
NaN or an infinity, it is refused: never passed on. The long form (hundreds of cases, zero_to_fp32 and
dcp_to_torch_save side by side) is the script."""

from __future__ import annotations

import json
import subprocess
import sys

from fixtures import SCRIPTS

# seven damaged copies of each of the twenty-four sources; the seed deals every family the classes asserted below
SEED, COUNT = 379, 168
ZIP_END = {"flip zip64 end record", "flip zip64 locator", "flip end of central directory"}
DCP_CLASSES = {"truncate", "flip .metadata pickle", "flip zip directory", "flip local header", "flip pickle",
               "flip tensor data", "delete rank file", "swap rank files", "duplicate rank file", "rewrite .metadata",
               *ZIP_END}
FASTVIDEO_CLASSES = {"delete rank file", "key set of the wrong kind", "rewrite metadata.json"}
MEGATRON_CLASSES = {"delete rank file", "key set of the wrong kind"}  # and two of the three rewrites, below
AUTOTP_CLASSES = {"damage the affine map"}  # and two of the three rank file damages, below
ZARR_CLASSES = {"rewrite .zarray", "truncate chunk file", "delete chunk file", "rewrite metadata.json"}
FSMS_CLASSES = {"rewrite mcore_data", "key set of the wrong kind", "rewrite .metadata", "flip tensor data"}
DATA_DAMAGE = {"flip safetensors data", "flip safetensors exponent"}
HF_STORAGE_CLASSES = {"truncate", "flip safetensors header", "flip sharding info", "move a piece", "delete rank file",
                      "swap rank files", "duplicate rank file", *DATA_DAMAGE}


def test_damaged_checkpoints_never_become_a_silently_wrong_model():
    done = subprocess.run([sys.executable, str(SCRIPTS / "fuzz_checkpoints.py"), "--seed", str(SEED), "--count",
                           str(COUNT), "--cogexport-only", "--json"], capture_output=True, text=True, timeout=1800)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["failures"] == [], json.dumps(result["failures"], indent=1)
    assert result["cases"] == COUNT and len(result["by_source"]) == 24
    # The slice exercises both outcomes: damage refused in one line, and damage that leaves the output exact.
    outcomes = {outcome for classes in result["by_tool"].values() for outcome in classes}
    assert {"clean error", "right", "problems listed"} <= outcomes
    assert len(result["by_family"]["deepspeed"]) >= 8 and ZIP_END <= set(result["by_family"]["deepspeed"])
    assert set(result["by_family"]["dcp"]) == DCP_CLASSES
    assert set(result["by_family"]["hf-storage"]) == HF_STORAGE_CLASSES
    assert FASTVIDEO_CLASSES <= set(result["by_family"]["fastvideo"])
    megatron, autotp = set(result["by_family"]["megatron"]), set(result["by_family"]["autotp"])
    assert MEGATRON_CLASSES <= megatron and len(megatron & {"rewrite metadata.json", "rewrite tracker",
                                                            "rewrite .metadata"}) >= 2, megatron
    assert AUTOTP_CLASSES <= autotp and len(autotp & {"delete rank file", "swap rank files",
                                                      "duplicate rank file"}) >= 2, autotp
    assert ZARR_CLASSES <= set(result["by_family"]["megatron-zarr"]), result["by_family"]["megatron-zarr"]
    assert FSMS_CLASSES <= set(result["by_family"]["megatron-fsms"]), result["by_family"]["megatron-fsms"]
    assert DATA_DAMAGE <= set(result["by_family"]["cogvideox"])
    for family in ("cogvideox", "hf-storage"):  # a NaN or an infinity made in the data: refused by every command
        spoiled = result["by_family"][family]["flip safetensors exponent"]
        assert set(spoiled["inspect"]) == {"problems listed"}, spoiled
        assert set(spoiled["consolidate"]) | set(spoiled.get("export", {})) == {"clean error"}, spoiled
