"""``torchrun --nproc-per-node N -m cogexport ...``: 2 and 3 gloo ranks on CPU write the same bytes as one process
(consolidate, universal, a pipeline export, GGUF and fp8 files), each rank its share of the files, or of one file's
tensors where there are fewer files than ranks; a rank killed
mid-run, a rank that fails, and ranks that planned different outputs all leave nothing published and no staging
folder.

The ranks are real processes launched by torch's own launcher (``python -m torch.distributed.run``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import leftovers, run_cogexport_process
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from mochi_fixtures import tiny_pipeline
from safetensors.torch import load_file, save_file

ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def torchrun(ranks: int, *args: object, script: Path | None = None, wait: bool = True):
    """``python -m torch.distributed.run --standalone --nproc-per-node RANKS -m cogexport ARGS`` (or ``script``)."""
    target = [str(script)] if script else ["-m", "cogexport"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               *target, *map(str, args)]
    if not wait:
        return subprocess.Popen(command, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=900)


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def single_then_torchrun(ranks: int, output: Path, *args: object) -> tuple[dict, dict]:
    """The same command once in one process (``python -m cogexport``, as each rank runs it) and once under torchrun,
    writing the same OUTPUT path (the command line is in the model card); both outputs' files."""
    result = run_cogexport_process(*args, output)
    assert result.returncode == 0, result.stderr
    single = files_of(output)
    output.rename(output.with_name(output.name + "-single"))
    done = torchrun(ranks, *args, output)
    assert done.returncode == 0, done.stderr[-3000:]
    return single, files_of(output)


@pytest.mark.parametrize("ranks", [2, 3])
def test_consolidate_on_ranks_writes_the_same_bytes(tmp_path, ranks):
    fixture = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2))
    single, distributed = single_then_torchrun(ranks, tmp_path / "out", "consolidate", fixture.checkpoint,
                                               "--max-shard-size", "2000")
    assert len([name for name in single if name.endswith(".safetensors")]) == 5  # files for every rank
    assert distributed == single
    written = {}
    for name in distributed:
        if name.endswith(".safetensors"):
            written.update(load_file(tmp_path / "out" / name))
    expected = fixture.expected_state_dict()  # taken inside the training process
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[n], expected[n].to(written[n].dtype)) for n in expected)
    assert leftovers(tmp_path) == []


def test_universal_on_three_ranks_writes_the_same_bytes(tmp_path):
    fixture = deepspeed_checkpoint(DeepSpeedVariant(3, "bf16", 2))
    single, distributed = single_then_torchrun(3, tmp_path / "out", "universal", fixture.checkpoint)
    assert distributed == single and "zero/optimizer_state.pt" in single and len(single) > 20
    assert (tmp_path / "latest_universal").read_text() == "out"  # written by rank 0 once published


def test_pipeline_export_on_two_ranks_writes_the_same_bytes(tmp_path):
    pipeline = tiny_pipeline()
    single, distributed = single_then_torchrun(2, tmp_path / "out", pipeline / "transformer", "--base",
                                               pipeline, "--max-shard-size", "3MB")
    assert distributed == single
    assert "README.md" in single and "transformer/diffusion_pytorch_model.safetensors.index.json" in single
    assert (tmp_path / "out" / "text_encoder").is_dir()  # taken from --base by rank 0


@pytest.mark.parametrize("job", [("--to", "gguf", "--quant", "Q4_K_M"), ("--to", "original", "--dtype", "fp8")])
def test_quantized_exports_of_a_two_expert_pipeline_on_two_ranks_write_the_same_bytes(tmp_path, job):
    """One file per expert, one expert per rank. A GGUF plan holds its tensors inside a plan object: the ranks once
    compared its repr, which names each tensor's loader at an address of its own process, and never agreed."""
    from wan_fixtures import tiny_wan_pipeline

    single, distributed = single_then_torchrun(2, tmp_path / "out", tiny_wan_pipeline("t2v-a14b"), *job)
    assert distributed == single
    assert len([name for name in single if name.endswith((".gguf", ".safetensors"))]) >= 2


RECORD_SHARES = """import os
from pathlib import Path
from cogexport.__main__ import run
from cogexport.write.rank_shares import FilePart
write = FilePart.write
def recorded(part, root, on_tensor, payloads):
    with open(Path(__file__).with_name("shares-" + os.environ["RANK"]), "a") as log:
        log.write(f"{part.path} {part.run.start} {part.run.stop} {part.header}\\n")
    return write(part, root, on_tensor, payloads)
FilePart.write = recorded
run()
"""


def shares_written(folder: Path, ranks: int) -> dict[int, list[tuple[str, int, int, bool]]]:
    """{rank: [(file, first tensor, end, header)]} of the file parts each rank wrote (RECORD_SHARES' logs)."""
    logs = {rank: folder / f"shares-{rank}" for rank in range(ranks)}
    return {rank: [(path, int(start), int(stop), header == "True")
                   for path, start, stop, header in (line.split() for line in log.read_text().splitlines())]
            for rank, log in logs.items() if log.exists()}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("job", [("--to", "gguf", "--quant", "Q4_K_M"), ("--to", "original", "--dtype", "fp8")])
def test_one_file_is_written_by_every_rank_a_run_of_its_tensors_each(tmp_path, ranks, job):
    """A model written as one file (GGUF, ComfyUI's fp8) by 2 and 3 ranks: each loads, quantizes and writes its own
    run of the file's tensors at their offsets, rank 0 the header, and the file is the one process's, byte for byte."""
    from wan_fixtures import tiny_wan_pipeline

    transformer = tiny_wan_pipeline("t2v") / "transformer"
    result = run_cogexport_process(transformer, tmp_path / "out", *job)
    assert result.returncode == 0, result.stderr
    single = files_of(tmp_path / "out")
    (tmp_path / "out").rename(tmp_path / "single")
    script = tmp_path / "record_shares.py"
    script.write_text(RECORD_SHARES)
    done = torchrun(ranks, transformer, tmp_path / "out", *job, script=script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert files_of(tmp_path / "out") == single
    shares = shares_written(tmp_path, ranks)
    (data_file,) = [name for name in single if name.endswith((".gguf", ".safetensors"))]
    assert sorted(shares) == list(range(ranks)), shares  # every rank wrote a part
    runs = sorted((start, stop, header) for rank in shares for path, start, stop, header in shares[rank]
                  if path == data_file)
    assert [header for *_, header in runs] == [True] + [False] * (ranks - 1)  # rank 0's, first in the file
    assert all(stop > start for start, stop, _ in runs) and runs[0][0] == 0
    assert all(runs[k][1] == runs[k + 1][0] for k in range(ranks - 1))  # end to end: every tensor written once


def uneven_weights(path: Path) -> None:
    """Two tensors, each its own shard at --max-shard-size 4MB: a small one (rank 0's) and a big one (rank 1's,
    384 MB in fp32, cast to bf16: it takes rank 1 a while)."""
    generator = torch.Generator().manual_seed(0)
    save_file({"a.weight": torch.randn(1 << 18, generator=generator),
               "b.weight": torch.randn(96 << 20, generator=generator)}, path)


def rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the processes below ``launcher`` that torchrun started (their RANK variable)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"RANK" in variables and b"TORCHELASTIC_RUN_ID" in variables and _descends(parent, launcher):
            found[int(variables[b"RANK"])] = int(entry)
    return found


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


@pytest.mark.parametrize("shards, rank_1_file", [(("--max-shard-size", "4MB"), "model-00002-of-00002.safetensors"),
                                                 ((), "model.safetensors")])
def test_a_rank_killed_mid_run_publishes_nothing(tmp_path, shards, rank_1_file):
    """Rank 1 is stopped while it writes, and rank 0, done with its own share, waits for it instead of publishing;
    then rank 1 is killed: the job fails, nothing is published, the staging folder is removed. Its share is a
    file of its own, or (one file) the run of the file's tensors after rank 0's."""
    uneven_weights(tmp_path / "weights.safetensors")
    launcher = torchrun(2, "consolidate", tmp_path / "weights.safetensors", tmp_path / "out", "--dtype", "bf16",
                        *shards, "--workers", "1", wait=False)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob(f".out.cogexport-*/{rank_1_file}")) and launcher.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.005)  # until rank 1's file is begun
    pids = rank_pids(launcher.pid)
    assert launcher.poll() is None and 1 in pids, "the job ended before a rank could be stopped"
    os.kill(pids[1], signal.SIGSTOP)
    time.sleep(5)  # rank 0 writes its 0.5 MB and waits
    assert not (tmp_path / "out").exists() and launcher.poll() is None
    os.kill(pids[1], signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=600)
    assert launcher.returncode != 0
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == [], stderr[-3000:]


def test_a_failing_rank_fails_the_job_with_its_reason(tmp_path):
    """A CRC-32 failure in a file only rank 1 writes: every rank fails, rank 0 naming rank 1 and the reason."""
    truth = {f"t{i}": torch.full((300,), float(i)) for i in range(6)}
    torch.save(truth, tmp_path / "weights.pt")
    data = bytearray((tmp_path / "weights.pt").read_bytes())
    position = data.find(torch.full((300,), 3.0).numpy().tobytes())  # t3: the second file of two, rank 1's
    data[position + 17] ^= 0x04
    (tmp_path / "weights.pt").write_bytes(bytes(data))
    done = torchrun(2, "consolidate", tmp_path / "weights.pt", tmp_path / "out", "--dtype", "fp32",
                    "--max-shard-size", "3600")
    assert done.returncode != 0
    assert "rank 1 of 2 failed" in done.stderr and "fails its CRC-32 check" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_ranks_that_plan_differently_all_fail(tmp_path):
    """Rank 1 is given another shard size (as if it read other inputs): the plans' digests differ, nothing starts."""
    torch.save({f"t{i}": torch.full((300,), float(i)) for i in range(6)}, tmp_path / "weights.pt")
    script = tmp_path / "rank_argv.py"
    script.write_text("import os, sys\n"
                      "from cogexport.__main__ import run\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    sys.argv = [a.replace('3600', '2400') for a in sys.argv]\n"
                      "run()\n")
    done = torchrun(2, "consolidate", tmp_path / "weights.pt", tmp_path / "out", "--max-shard-size", "3600",
                    script=script)
    assert done.returncode != 0 and "planned different outputs" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_notes_are_printed_once_and_json_is_one_object(tmp_path):
    """Every rank runs the same command and would say the same thing: rank 0 alone prints the notes and the report."""
    weights = {f"t{i}": torch.full((300,), float(i)) for i in range(6)}
    weights["t4"][7] = float("nan")
    torch.save(weights, tmp_path / "weights.pt")
    done = torchrun(2, "consolidate", tmp_path / "weights.pt", tmp_path / "out", "--max-shard-size", "3600",
                    "--allow-nonfinite", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("cogexport: warning:")]
    assert len(warnings) == 1 and "t4" in warnings[0], done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["notes"] == [warnings[0].removeprefix("cogexport: warning: ")]


def test_a_failed_job_is_one_json_object(tmp_path):
    """A failure under torchrun: each rank says it on stderr, rank 0 alone prints the JSON object."""
    torch.save({f"t{i}": torch.full((300,), float(i)) for i in range(6)}, tmp_path / "weights.pt")
    done = torchrun(2, "consolidate", tmp_path / "weights.pt", tmp_path / "weights.pt" / "out", "--json")
    assert done.returncode != 0
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["exit_code"] == 2 and report["error"] in done.stderr


def test_only_rank_0_draws_a_progress_bar_on_a_terminal(tmp_path):
    """The ranks of a job share the terminal torchrun was started from: each writes its share, and only rank 0 draws
    its bar (two bars redrawn over each other are noise). Each rank's share here is one shard of its own size, so
    the totals the bars show say whose bar was drawn."""
    generator = torch.Generator().manual_seed(0)
    save_file({"a.weight": torch.randn(1 << 18, generator=generator),
               "b.weight": torch.randn(1 << 20, generator=generator)}, tmp_path / "weights.safetensors")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
               "cogexport", "consolidate", str(tmp_path / "weights.safetensors"), str(tmp_path / "out"),
               "--max-shard-size", "2MB"]
    # script(1) gives the job a terminal, as a user's shell would (120 columns wide: a new one has none)
    done = subprocess.run(["script", "-qec", f"stty cols 120 rows 40; {shlex.join(command)}", "/dev/null"],
                          env=ENVIRONMENT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    totals = set(re.findall(r"consolidate:[^|\r\n]*\|[^|\r\n]*\| *[\d.]+[kMG]?/([\d.]+[kMG]?)", done.stdout))
    assert len(totals) == 1, totals  # rank 0's share only (before: rank 1's 4.19M beside rank 0's 1.05M)
