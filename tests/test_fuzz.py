"""A fixed-seed slice of scripts/fuzz_checkpoints.py: real checkpoints of every ZeRO stage, a SAT run and a
safetensors file, damaged in every way the script knows; each inspect, consolidate and export run must give the
exactly right output, or one clean line with exit 2 (inspect: the problems listed, exit 1), nothing written and
the input unchanged. The long form (hundreds of cases, DeepSpeed's consolidator side by side) is the script."""

from __future__ import annotations

import json
import subprocess
import sys

from fixtures import SCRIPTS

SEED, COUNT = 15, 36  # three damaged copies of each of the twelve sources


def test_damaged_checkpoints_never_become_a_silently_wrong_model():
    done = subprocess.run([sys.executable, str(SCRIPTS / "fuzz_checkpoints.py"), "--seed", str(SEED), "--count",
                           str(COUNT), "--no-deepspeed", "--json"], capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["failures"] == [], json.dumps(result["failures"], indent=1)
    assert result["cases"] == COUNT and len(result["by_source"]) == 12
    # The slice exercises both outcomes: damage refused in one line, and damage that leaves the output exact.
    outcomes = {outcome for classes in result["by_tool"].values() for outcome in classes}
    assert {"clean error", "right", "problems listed"} <= outcomes
    assert len(result["by_mutation"]) >= 8
