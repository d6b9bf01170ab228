"""Corrupt real checkpoints on purpose, and check that cogexport never turns one into a silently wrong model.

    .venv/bin/python scripts/fuzz_checkpoints.py --seed 1 --count 500 [--cogexport-only] [--json] [--verbose]

Sources are the test suite's real fixtures: DeepSpeed ZeRO stages 0-3 made by real DeepSpeed runs, a SAT-style
CogVideoX run, a safetensors file, PyTorch distributed checkpoints (DCP) made by real ``dcp.save`` and accelerate
FSDP2 runs on gloo ranks, per-rank saves of PyTorch's Hugging Face writer (``HuggingFaceStorageWriter`` with
``save_distributed``, FSDP2 on gloo ranks, with and without a mapping), a FastVideo run (FSDP2 on 2 gloo ranks,
saved as FastVideo's CheckpointManager saves: roles, optimizers, the EMA callback's per-rank shards), and Hugging Face
Trainer run folders (``transformers.Trainer`` under DeepSpeed on CPU ranks: ZeRO-2 with the Trainer's 16-bit
``model.safetensors``, ZeRO-3 with a Diffusers ``save_pretrained`` copy of empty placeholders beside the save), a
DeepSpeed AutoTP run (TP 2 x DP 2 under ZeRO-3: rank files of both parallel dimensions deleted, swapped and copied
over each other, its affine maps damaged; consolidate judged, and export too when asked for by ``--only autotp``) and
a Megatron-Core run (megatron-core's own GPTModel at TP 2 x PP 2 saved by its ``dist_checkpointing.save``: the run
folder given, its newest iteration damaged), a Megatron-Core iteration saved with the older zarr backend (kept as
data in tests/data/megatron-zarr-tp2/: megatron-core 0.15.3's own zarr strategy, a bf16 GPTModel at TP 2 with fp32
masters) and a megatron-core 0.15.3 torch_dist iteration whose distributed optimizer saved its state flattened
(``fully_sharded_model_space``; kept as data in tests/data/megatron-fsms-tp2/: a bf16 GPTModel at TP 2 x DP 2). Each
case copies one source and damages it one way:

  truncate                 a data file cut short (a rank file, a ``.distcp`` or ``.metadata``, a safetensors file)
  flip <region>            one byte changed in a torch.save archive's zip directory, one of the three records of
                           its end (the zip64 end record, the zip64 locator, the end-of-central-directory record), a
                           local header, the pickle or tensor data (for DCP: in the chunk archives inside ``.distcp``
                           files), in a DCP ``.metadata`` pickle, in a safetensors header's structure (its tensor
                           names and metadata strings are left out: a name changed into another valid one cannot be
                           told from what was saved), in the Hugging Face writer's DCP_SHARDING_INFO header entry
                           (where each piece lies), or in a safetensors file's tensor data
  flip safetensors exponent
                           the exponent bits of one floating value of a safetensors file all set, as flipped bits set
                           them: the value becomes NaN or infinite (the issue's damaged release held a NaN)
  delete / swap / duplicate rank file
                           a rank file (``*zero_pp_rank_*``, ``__R_0.distcp``) deleted, two swapped, or one copied
                           over another. DCP rank files carry no identity (no rank, no name inside them): two whose
                           chunks have the same sizes at the same places can be swapped without any reader being able
                           to tell, so swaps are only made between rank files whose layouts differ. A Hugging Face
                           writer rank file says where each of its pieces lies, so two swapped are still the same save
                           (the output must be right); swaps are made between files whose pieces differ in size. Its
                           per-rank save records no world size: the highest rank's files lost all together leave
                           shorter tensors that tile exactly, which no reader can tell (cogexport names the ranks it
                           read in a warning), so a deletion there takes one file of a mapped save, never the only
                           file of the highest rank
  move a piece             (Hugging Face writer) one piece's saved offset moved by a few rows or columns
  rewrite latest           DeepSpeed's ``latest`` replaced by garbage, a missing tag, a path, ...
  rewrite metadata.json    (FastVideo) a step's metadata.json replaced by garbage, nothing, a list, another step's, or
                           with no step, another step, the step as a string, a config that is no mapping; or deleted.
                           (Megatron-Core) the iteration's backend file replaced by garbage, nothing, a list, no
                           backend, the zarr backend or another; or deleted
  rewrite tracker          (Megatron-Core) latest_checkpointed_iteration.txt replaced by garbage, nothing, an
                           iteration the run lacks, a path, ... (never another iteration it holds: that is a run saved
                           that far, not damage)
  key set of the wrong kind
                           (FastVideo) the step's ``.metadata`` re-pickled with keys filed under another group, bytes
                           untouched: an optimizer state among the student's weights, the student's weights under a
                           group FastVideo never saves, the EMA callback's per-rank pieces swapped with the student's
                           weights, the student's optimizer filed as a role. (Megatron-Core) the same of an iteration:
                           an optimizer state filed as the model's ``<key>.exp_avg``, the model under ``ema.``, a
                           weight filed as ``optimizer.state.fp32_param.<key>`` or as ``rng_state/<key>``
  rewrite mcore_data       (Megatron-Core 0.8-0.15 torch_dist) the ``.metadata`` re-pickled with one flattened
                           tensor's recorded original shape changed (an axis doubled or halved, the axes reversed,
                           one dropped), the record dropped, or a record given to a model tensor
  damage the affine map    (AutoTP) rank 0's model states re-saved (valid CRCs) with one tensor's affine map changed:
                           a share's block moved, a share's shape, a rank dropped, the whole's shape, its pattern
                           matching nothing (then the pattern lists say how it joins: right, or refused)
  replace the copy         (Trainer) the weights beside DeepSpeed's save in checkpoint-N replaced by other tensors: one
                           left out, one cut short, one added, or another model's
  delete DeepSpeed's save  (Trainer) the step's ``global_stepN/`` deleted (``latest`` still naming it); where the copy
                           is ZeRO-3's placeholders, ``latest`` too, leaving the placeholders alone
  delete / truncate chunk file, flip zarr data
                           (Megatron-Core zarr) one chunk file of an array deleted, cut short, or one byte of it
                           changed; zarr keeps no checksum, so a changed byte of a weight read is data damage no
                           reader can tell from what was saved (classed as safetensors data damage is), unless it
                           makes a NaN or an infinity, or a master that no longer rounds to its bf16 copy
  rewrite .zarray          (Megatron-Core zarr) an array's ``.zarray`` replaced by garbage, nothing, a list, or with
                           one field changed: a dtype of another width (never one of the same width: bytes read as
                           another dtype of their size cannot be told from what was saved), a compressor, a filter,
                           Fortran order, zarr format 3, the ``<V2`` zarr writes for bf16, a shape longer, shorter,
                           doubled or halved on one axis, chunks halved, a grid of billions of chunks; or deleted.
                           (Key sets of the wrong kind there: array folders renamed, as the ``.metadata`` of a
                           torch_dist save is re-pickled)
  rewrite .metadata        a DCP ``.metadata`` replaced by garbage, nothing, another object's pickle, a pickle that
                           would run code, the ``.metadata`` of the next folder or step, or re-pickled with one chunk's
                           storage record pointing at another chunk's bytes, reaching over the next one, or dropped

Each source takes the classes in turn; where and how comes from the case's seed. On every damaged copy ``cogexport
inspect`` and ``consolidate`` (and ``export`` for CogVideoX sources) run in a forked child with a time limit, and
each run is classed:

  right           exit 0 and the output equals the ground truth taken where it was born (the training process's
                  fp32 masters or full state dict; the Diffusers model the SAT run was written from; the tensors the
                  safetensors library saved); for inspect, the report of the undamaged copy
  changed, finite (no checksum)
                  safetensors data damaged into other finite values: exit 0 and an output that differs from the
                  ground truth only where the damage is, with no NaN or infinity in it. safetensors keeps no
                  checksum, so no reader can tell such values from the saved ones (inspect says so in its data row)
  clean error     exit 2 with exactly one line on stderr, nothing written, the input unchanged
  problems listed inspect only: exit 1 with the problems listed (the checkpoint is not usable)
  silently wrong  exit 0 with a wrong output, or inspect exit 0 (usable) on a copy consolidate refuses
  non-finite passed on
                  exit 0 with an output holding a NaN or an infinity the ground truth does not hold
  traceback, multi-line error, hang, dirty (something written or the input changed on an error): failures

The converter a user would otherwise run goes through the same damaged copies, judged against its own output on the
undamaged copy: DeepSpeed's ``zero_to_fp32`` (``deepspeed.utils.zero_to_fp32``, what its ``zero_to_fp32.py`` runs)
on the ZeRO copies, torch's ``dcp_to_torch_save`` (``torch.distributed.checkpoint.format_utils``) on the DCP model
folders: right, silently wrong, traceback (an exception: its command line shows one), ran the pickle's code,
hang or crash.

The exit status is 1 if any cogexport run failed. The same seed gives the same mutations.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import zipfile  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import click  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from fixtures import CACHE, DeepSpeedVariant, deepspeed_checkpoint  # noqa: E402

TIME_LIMIT = 60.0  # seconds per run; a toy checkpoint takes well under one
MEMORY_HEADROOM = 3 << 30  # address space a run may add to the harness's: a damaged size must not take the machine
FAILURES = ("silently wrong", "non-finite passed on", "traceback", "multi-line error", "hang", "dirty",
            "inspect missed it")
UNDETECTABLE = "changed, finite (no checksum)"  # what no reader can tell: safetensors data changed into finite values
DATA_DAMAGE = ("flip safetensors data", "flip safetensors exponent", "flip zarr data")  # the damage that may end so
# safetensors' float dtypes: bytes, the exponent's bits in the value's top two bytes, torch's dtype
EXPONENT_BITS = {"F64": (8, 0x7FF0, torch.float64), "F32": (4, 0x7F80, torch.float32),
                 "BF16": (2, 0x7F80, torch.bfloat16), "F16": (2, 0x7C00, torch.float16)}
DISTCP = re.compile(r"^__\d+_\d+\.distcp$")
HF_RANK_FILE = re.compile(r"^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$")
PWNED = "PWNED"  # the file a code-running .metadata pickle creates in the case's folder

ZERO_VARIANTS = [
    DeepSpeedVariant(0, "bf16", 2), DeepSpeedVariant(1, "bf16", 2), DeepSpeedVariant(1, "bf16", 2, bf16_optimizer=True),
    DeepSpeedVariant(2, "bf16", 1), DeepSpeedVariant(2, "bf16", 3), DeepSpeedVariant(2, "fp16", 2),
    DeepSpeedVariant(2, "bf16", 3, parameter_alignment=True), DeepSpeedVariant(3, "bf16", 2),
    DeepSpeedVariant(3, "fp32", 3), DeepSpeedVariant(3, "bf16", 2, sub_group_size=300),
]
# (writer, model, world size): a plain dcp.save whose toy sizes no rank count divides (a zero-size chunk on rank 2,
# a shard on dim 1, model and optimizer in the same files); accelerate FSDP2 saves (model and optimizer folders,
# two steps) of the toy and of a tiny CogVideoX transformer, which is exported too.
DCP_SAVES = [("plain", "toy", 3), ("accelerate-fsdp2", "toy", 2), ("accelerate-fsdp2", "cogvideox-2b", 2)]
# (model, world size, layout): Hugging Face writer saves of FSDP2 runs: the toy's per-rank files at 3 ranks (uneven and
# empty pieces, a dim-1 shard, replicated buffers written by one rank), a tiny Wan's mapped files at 2 ranks (exported
# too, with the config as --base).
HF_SAVES = [("toy", 3, "distributed"), ("wan-t2v", 2, "mapping")]
# Trainer runs (tests/trainer_fixtures.py) by id: their run folder is given, the damage goes to its newest step.
TRAINER_RUNS = ("trainer-zero2", "trainer-zero3-nogather-diffusers-persist100")
TRAINER_COPIES = ("model.safetensors", "diffusion_pytorch_model.safetensors")  # what the Trainer leaves beside


# -- sources: a pristine copy, what to run on it, and the ground truth ---------------------------------------
@dataclass
class Source:
    name: str
    family: str  # "deepspeed", "dcp", "hf-storage" or "cogvideox": the tables group by it
    root: Path  # folder copied for each case; the checkpoint is root / checkpoint
    checkpoint: str  # relative path given to cogexport
    truth: dict[str, torch.Tensor]  # what consolidate must write
    export: tuple[str, ...] | None = None  # extra arguments of an export run, when the source is a CogVideoX model
    export_truth: dict[str, torch.Tensor] = field(default_factory=dict)
    damage: str | None = None  # the folder (relative to root) whose files are damaged; default: the checkpoint
    reference: str | None = None  # the other tool run side by side (one of REFERENCES)
    reference_input: str | None = None  # what it is given (relative to root)


def zero_source(variant: DeepSpeedVariant) -> Source:
    fixture = deepspeed_checkpoint(variant)
    expected = fixture.expected_state_dict()
    truth = {name: t if name in fixture.truth["buffers"] or not t.dtype.is_floating_point else t.float()
             for name, t in expected.items()}
    return Source(variant.id, "deepspeed", fixture.root, "checkpoint", truth,
                  reference="zero_to_fp32" if variant.stage > 0 else None, reference_input="checkpoint")


def dcp_source(writer: str, model: str, world_size: int) -> Source:
    """cogexport is given the run folder (it picks the newest step); the damage goes to that step."""
    from dcp_fixtures import dcp_checkpoint

    fixture = dcp_checkpoint(writer, model, world_size)
    step = fixture.truth["checkpoint"]  # run/checkpoint or run/checkpoint-2
    model_folder = f"{step}/pytorch_model_fsdp_0" if writer.startswith("accelerate") else step
    export, export_truth = None, {}
    if model.startswith("cogvideox"):
        base = fixture.root.with_name(f"{fixture.root.name}-fuzz-base")  # a --base with the model's config
        if not (base / "config.json").exists():
            fixture.base(base)
        export, export_truth = ("--base", str(base), "--dtype", "fp32"), fixture.weights
    return Source(f"dcp-{writer}-{model}-ws{world_size}", "dcp", fixture.root, "run", fixture.weights, export,
                  export_truth, damage=step, reference="dcp_to_torch_save", reference_input=model_folder)


def hf_source(model: str, world_size: int, layout: str) -> Source:
    from dcp_fixtures import hf_storage_checkpoint

    fixture = hf_storage_checkpoint(model, world_size)
    export = None
    if model.startswith("wan"):
        base = fixture.root.with_name(f"{fixture.root.name}-fuzz-base")
        if not (base / "config.json").exists():
            fixture.base(base)
        export = ("--base", str(base), "--dtype", "fp32")
    return Source(f"hf-storage-{model}-ws{world_size}-{layout}", "hf-storage", fixture.root, layout, fixture.weights,
                  export, fixture.weights if export else {})


def cogvideox_sources() -> list[Source]:
    """A SAT-style run (model states only, fp32 so the export is exact) and the same model as Diffusers-named
    safetensors, both written once into the fixture cache from one seeded tiny CogVideoX transformer."""
    from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run

    folder = CACHE / "fuzz-cogvideox"
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    truth = {name: t.detach().clone() for name, t in original.state_dict().items()}
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_sat_run(folder / "sat" / "checkpoint", original.state_dict(), dtype=torch.float32)
        (folder / "safetensors").mkdir(parents=True)
        save_file({k: t.contiguous() for k, t in truth.items()}, folder / "safetensors" / "model.safetensors")
        config_folder(folder / "base", original)
        (folder / ".complete").touch()
    export = ("--model-type", "t2v", "--base", str(folder / "base"), "--dtype", "fp32")
    return [Source("sat-2b", "cogvideox", folder / "sat", "checkpoint", {}, export, truth),
            Source("safetensors-2b", "cogvideox", folder / "safetensors", "model.safetensors", truth, export, truth)]


def fastvideo_source() -> Source:
    """A FastVideo run (scripts/make_fastvideo_checkpoint.py: student, critic, an ema role and the EMA callback's
    per-rank shards, FSDP2 on 2 ranks): the run folder given, the newest step damaged; consolidate must write the
    student's weights in FastVideo's names, export them in Diffusers' (the run's config as --base)."""
    from fastvideo_fixtures import fastvideo_run

    fixture = fastvideo_run(2)
    base = fixture.base(fixture.root.with_name(f"{fixture.root.name}-fuzz-base"))
    return Source("fastvideo-ws2", "fastvideo", fixture.root, "run", fixture.fastvideo_weights("student"),
                  ("--base", str(base), "--dtype", "fp32"), fixture.diffusers_weights("student"),
                  damage="run/checkpoint-2", reference="dcp_to_torch_save", reference_input="run/checkpoint-2/dcp")


def trainer_source(run_id: str) -> Source:
    """cogexport is given the Trainer's run folder (it reads the newest step's DeepSpeed save); the damage goes to
    that step, copy of the weights included."""
    from trainer_fixtures import RUNS, trainer_checkpoint

    fixture = trainer_checkpoint(next(run for run in RUNS if run.id == run_id))
    step = str(fixture.checkpoint.relative_to(fixture.root))
    export = ("--model-type", "t2v", "--base", str(fixture.base), "--component", "transformer", "--dtype", "fp32")
    return Source(run_id, "hf-trainer", fixture.root, "run", fixture.masters(), export, fixture.masters(),
                  damage=step, reference="zero_to_fp32", reference_input=step)


def autotp_source(full: bool) -> Source:
    """A DeepSpeed AutoTP run (tests/autotp_fixtures.py: a tiny CogVideoX transformer, TP 2 x DP 2 under ZeRO-3, fp32):
    consolidate must write the full masters joined inside training; asked for by name (``full``), export must write
    them as the Diffusers transformer too."""
    from autotp_fixtures import autotp_run

    fixture = autotp_run(3, "fp32")
    if not full:  # the default campaign judges consolidate alone: export reads through the same joined shares
        return Source("autotp-zero3-tp2-ws4", "autotp", fixture.root, "checkpoint", fixture.tensors)
    export = ("--base", str(fixture.base), "--component", "transformer", "--dtype", "fp32")
    return Source("autotp-zero3-tp2-ws4", "autotp", fixture.root, "checkpoint", fixture.tensors, export,
                  fixture.tensors)


def megatron_source() -> Source:
    """A Megatron-Core run (tests/megatron_fixtures.py: megatron-core's own tiny GPTModel at TP 2 x PP 2, saved by its
    dist_checkpointing.save): the run folder given, its newest iteration damaged; consolidate must write that
    iteration's model layer by layer, never an optimizer state."""
    from megatron_fixtures import megatron_run

    fixture = megatron_run()
    iteration = f"run/{fixture.iteration(10).name}"
    return Source("megatron-tp2-pp2", "megatron", fixture.root, "run", fixture.per_layer(10), damage=iteration,
                  reference="dcp_to_torch_save", reference_input=iteration)


def megatron_zarr_source() -> Source:
    """A Megatron-Core iteration saved with the zarr backend (tests/data/megatron-zarr-tp2/: megatron-core 0.15.3's own
    zarr strategy, a bf16 GPTModel at TP 2 with fp32 masters; kept as data, as this venv's megatron-core no longer
    writes zarr): the run folder given, its iteration damaged; consolidate must write the masters in place of the
    trained bf16 copies, the rest as saved, layer by layer."""
    from megatron_fixtures import unstacked

    data = ROOT / "tests" / "data" / "megatron-zarr-tp2"
    saved = load_file(data / "truth.safetensors")
    masters = unstacked({key[len("master."):]: t for key, t in saved.items() if key.startswith("master.")})
    model = unstacked({key[len("model."):]: t for key, t in saved.items() if key.startswith("model.")})
    truth = {name: masters.get(name, tensor.float()) for name, tensor in model.items()}
    return Source("megatron-zarr-tp2", "megatron-zarr", data, "run", truth, damage="run/iter_0000003")


def megatron_fsms_source() -> Source:
    """A Megatron-Core torch_dist iteration whose distributed optimizer saved its state flattened, in the
    fully_sharded_model_space layout (tests/data/megatron-fsms-tp2/: megatron-core 0.15.3's own layout code and
    torch_dist strategy, a bf16 GPTModel at TP 2 x DP 2; kept as data, as this venv's megatron-core no longer saves
    flattened tensors): the run folder given, its iteration damaged; consolidate must write the masters, put back
    from the ranks' flat ranges, in place of the trained bf16 copies, the rest as saved, layer by layer."""
    from megatron_fixtures import unstacked

    data = ROOT / "tests" / "data" / "megatron-fsms-tp2"
    saved = load_file(data / "truth.safetensors")
    masters = unstacked({key[len("master."):]: t for key, t in saved.items() if key.startswith("master.")})
    model = unstacked({key[len("model."):]: t for key, t in saved.items() if key.startswith("model.")})
    truth = {name: masters.get(name, tensor.float()) for name, tensor in model.items()}
    return Source("megatron-fsms-tp2-dp2", "megatron-fsms", data, "run", truth, damage="run/iter_0000003")


# each family's sources, made (their fixtures built or found) only when the campaign takes that family
SOURCE_FAMILIES: list[tuple[str, Callable[[], list[Source]]]] = [
    ("deepspeed", lambda: [zero_source(v) for v in ZERO_VARIANTS]), ("cogvideox", cogvideox_sources),
    ("dcp", lambda: [dcp_source(*save) for save in DCP_SAVES]), ("hf-storage", lambda: [hf_source(*save)
                                                                                         for save in HF_SAVES]),
    ("fastvideo", lambda: [fastvideo_source()]), ("hf-trainer", lambda: [trainer_source(run) for run in TRAINER_RUNS]),
    ("autotp", lambda: [autotp_source(full=False)]), ("megatron", lambda: [megatron_source()]),
    ("megatron-zarr", lambda: [megatron_zarr_source()]),
    ("megatron-fsms", lambda: [megatron_fsms_source()])]  # last: the sources before keep their turns


def sources(only: tuple[str, ...] = ()) -> list[Source]:
    made = [source for family, make in SOURCE_FAMILIES if not only or family in only for source in make()]
    return [autotp_source(full=True) if source.family == "autotp" and only else source for source in made]


# -- where the bytes are ------------------------------------------------------------------------------------
def zip_regions(data: bytes, base: int = 0) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of a torch.save archive by kind, counted from ``base`` (where the archive starts in its file)."""
    regions: dict[str, list[tuple[int, int]]] = {"zip directory": [], "local header": [], "pickle": [],
                                                 "tensor data": []}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            name_length, extra_length = (int.from_bytes(data[info.header_offset + at:info.header_offset + at + 2],
                                                        "little") for at in (26, 28))
            start = info.header_offset + 30 + name_length + extra_length
            regions["local header"].append((base + info.header_offset, base + start))
            kind = "pickle" if info.filename.endswith("data.pkl") else "tensor data" if "/data/" in info.filename \
                else None
            if kind and info.file_size:
                regions[kind].append((base + start, base + start + info.file_size))
        regions.update(end_regions(data, archive.start_dir, base))
    return regions


def end_regions(data: bytes, start_dir: int, base: int) -> dict[str, list[tuple[int, int]]]:
    """The central directory and the three records after it (torch.save writes them all, and no archive comment)."""
    eocd = data.rindex(b"PK\x05\x06")
    locator = data.rfind(b"PK\x06\x07", 0, eocd)
    if locator < 0:  # an archive without zip64 records
        return {"zip directory": [(base + start_dir, base + eocd)], "end of central directory": [(base + eocd,
                                                                                                   base + eocd + 22)]}
    record = int.from_bytes(data[locator + 8:locator + 16], "little")
    return {"zip directory": [(base + start_dir, base + record)], "zip64 end record": [(base + record, base + locator)],
            "zip64 locator": [(base + locator, base + eocd)], "end of central directory": [(base + eocd, base + eocd + 22)]}


def dcp_storage(folder: Path) -> dict:
    """torch's own reading of a (pristine) DCP folder's .metadata: MetadataIndex -> _StorageInfo."""
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(folder)).read_metadata().storage_data


def layout(path: Path) -> list[tuple[int, int]]:
    """The (offset, length) of every record .metadata places in the .distcp file ``path``."""
    return sorted((info.offset, info.length) for info in dcp_storage(path.parent).values()
                  if info.relative_path == path.name)


def distcp_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """The regions of every chunk archive in a .distcp file, found through its folder's .metadata."""
    data = path.read_bytes()
    regions: dict[str, list[tuple[int, int]]] = {}
    for offset, length in layout(path):
        for kind, ranges in zip_regions(data[offset:offset + length], offset).items():
            regions.setdefault(kind, []).extend(ranges)
    return regions


def safetensors_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """The header's structure: its bytes outside tensor names and metadata strings.

    safetensors carries no checksum: a flipped byte that turns a tensor's name or a metadata value into another valid
    string cannot be told from what was saved by any reader. Those bytes are left alone; everything else in the header
    (sizes, braces, dtypes, shapes, offsets) must be caught. The tensor data is a region of its own: a flipped byte
    there gives another finite value, which no reader can tell either, or a NaN or infinity, which must be refused."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    free_text = [json.dumps(name).encode() for name in header if name != "__metadata__"]
    free_text += [json.dumps(text).encode() for pair in (header.get("__metadata__") or {}).items() for text in pair]
    excluded = sorted((data.find(text, 8), data.find(text, 8) + len(text)) for text in free_text)
    allowed, position = [], 0
    for start, stop in excluded:
        if start > position:
            allowed.append((position, start))
        position = max(position, stop)
    allowed.append((position, 8 + size))
    regions = {"safetensors header": allowed}
    if len(data) > 8 + size:  # the tensors' bytes: no checksum, so a change is exact, finite and unseen, or refused
        regions["safetensors data"] = [(8 + size, len(data))]
    info = (header.get("__metadata__") or {}).get("DCP_SHARDING_INFO")
    if info is not None:  # the Hugging Face writer's record of where each piece lies: structure, not free text
        encoded = json.dumps(info).encode()
        start = data.find(encoded, 8)
        if start > 0:
            regions["sharding info"] = [(start + 1, start + len(encoded) - 1)]
    return regions


def regions_of(path: Path) -> dict[str, list[tuple[int, int]]]:
    if path.suffix == ".safetensors":
        return safetensors_regions(path)
    if path.name == ".metadata":
        return {".metadata pickle": [(0, path.stat().st_size)]}
    if path.suffix == ".distcp":
        return distcp_regions(path)
    return {k: v for k, v in zip_regions(path.read_bytes()).items() if v}


# -- mutations ----------------------------------------------------------------------------------------------
def flip(path: Path, region: tuple[int, int], rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    position = rng.randrange(*region)
    mask = 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
    data[position] ^= mask
    path.write_bytes(bytes(data))
    return f"byte {position} ^= 0x{mask:02x}"


def float_values(path: Path) -> list[tuple[int, str]]:
    """(file offset, dtype) of the first, middle and last value of every floating tensor of the safetensors file
    ``path``: where ``set_exponent`` may turn a value into a NaN or an infinity."""
    header, size = hf_header(path)
    places = []
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] not in EXPONENT_BITS:
            continue
        width = EXPONENT_BITS[entry["dtype"]][0]
        start, stop = entry["data_offsets"]
        count = (stop - start) // width
        places += [(8 + size + start + width * index, entry["dtype"]) for index in sorted({0, count // 2, count - 1})
                   if count]
    return places


def set_exponent(path: Path, offset: int, dtype: str, rng: random.Random) -> str:
    """Set every exponent bit of the little-endian ``dtype`` value at ``offset`` (in its top two bytes), its sign and
    mantissa kept, maybe but one mantissa bit: an infinity where the mantissa is zero, else a NaN."""
    width, mask, torch_dtype = EXPONENT_BITS[dtype]
    data = bytearray(path.read_bytes())
    top = offset + width - 2
    data[top:top + 2] = (int.from_bytes(data[top:top + 2], "little") | mask).to_bytes(2, "little")
    if rng.random() < 0.3:
        data[offset] ^= 1  # a mantissa bit too: a NaN where it would have been an infinity, or the reverse
    path.write_bytes(bytes(data))
    value = torch.frombuffer(bytearray(data[offset:offset + width]), dtype=torch_dtype)
    return f"{dtype} value at byte {offset} made {'infinite' if bool(value.isinf().any()) else 'NaN'}"


Mutation = Callable[[Path, random.Random], str]


def swap_files(first: Path, second: Path) -> None:
    temporary = first.with_suffix(".swap")
    first.rename(temporary)
    second.rename(first)
    temporary.rename(second)


def mutations_for(source: Source, folder: Path) -> dict[str, Mutation]:
    """The mutations that apply to this source's files under ``folder``, by class name."""
    data_files = sorted(p for p in folder.rglob("*") if p.suffix in (".pt", ".safetensors", ".distcp")
                        or p.name == ".metadata")
    found: dict[str, Mutation] = {}

    def on_file(kind: str) -> Mutation:
        def mutate(root: Path, rng: random.Random) -> str:
            candidates = [(p, r) for p in data_files for r in regions_of(p).get(kind, [])]
            path, region = rng.choice(candidates)
            return f"{path.relative_to(root)}: {flip(path, region, rng)}"
        return mutate

    kinds = {kind for p in data_files for kind, ranges in regions_of(p).items() if ranges}
    for kind in sorted(kinds):
        found[f"flip {kind}"] = on_file(kind)

    def truncate(root: Path, rng: random.Random) -> str:
        path = rng.choice(data_files)
        size = path.stat().st_size
        keep = rng.choice([rng.randrange(size), size - rng.randrange(1, min(size, 64) + 1)])
        os.truncate(path, keep)
        return f"{path.relative_to(root)}: truncated to {keep} of {size} bytes"

    found["truncate"] = truncate
    floats = [(p, value) for p in data_files if p.suffix == ".safetensors" for value in float_values(p)]
    if floats:
        def spoil_exponent(root: Path, rng: random.Random) -> str:
            path, (offset, dtype) = rng.choice(floats)
            return f"{path.relative_to(root)}: {set_exponent(path, offset, dtype, rng)}"
        found["flip safetensors exponent"] = spoil_exponent
    found.update(layout_mutations(source, folder))
    return found


def layout_mutations(source: Source, folder: Path) -> dict[str, Mutation]:
    """The mutations of the source's own layout (rank files, trackers, side files): ZeRO's rank files unless the
    source comes from another stack. A new source's stack adds one entry here."""
    makers = {
        "dcp": (dcp_rank_mutations,),
        "fastvideo": (dcp_rank_mutations, fastvideo_mutations),
        "megatron": (dcp_rank_mutations, megatron_mutations),
        "megatron-zarr": (megatron_run_mutations, zarr_mutations),
        "megatron-fsms": (dcp_rank_mutations, megatron_mutations, flattened_record_mutations),
        "hf-storage": (hf_rank_mutations,),
        "hf-trainer": (zero_rank_mutations, trainer_mutations),
        "autotp": (zero_rank_mutations, autotp_mutations),
    }.get(source.family, (zero_rank_mutations,))
    found: dict[str, Mutation] = {}
    for make in makers:
        found.update(make(folder))
    return found


def zero_rank_mutations(checkpoint: Path) -> dict[str, Mutation]:
    ranks = sorted(p for p in checkpoint.rglob("*.pt") if "zero_pp_rank_" in p.name)
    found: dict[str, Mutation] = {}
    if ranks:
        def delete(root: Path, rng: random.Random) -> str:
            path = rng.choice(ranks)
            path.unlink()
            return f"deleted {path.relative_to(root)}"
        found["delete rank file"] = delete
    if len(ranks) > 1:
        def swap(root: Path, rng: random.Random) -> str:
            first, second = rng.sample([p for p in ranks if "optim" in p.name] if rng.random() < 0.7 else ranks, 2)
            swap_files(first, second)
            return f"swapped {first.relative_to(root)} and {second.name}"

        def duplicate(root: Path, rng: random.Random) -> str:
            kind = rng.choice(["optim", "model"] if any("model" in p.name for p in ranks) else ["optim"])
            first, second = rng.sample([p for p in ranks if kind in p.name], 2)
            shutil.copyfile(first, second)
            return f"copied {first.relative_to(root)} over {second.name}"
        found["swap rank files"] = swap
        found["duplicate rank file"] = duplicate
    if (checkpoint / "latest").exists():
        def rewrite_latest(root: Path, rng: random.Random) -> str:
            content = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))),
                                  b"global_step99", b"../../etc", b"", b"global_step2\n\nrm -rf /",
                                  b"\x89PNG\r\n\x1a\n\x00\x00", b"x" * 5000])
            (checkpoint / "latest").write_bytes(content)
            return f"latest := {content[:40]!r}"
        found["rewrite latest"] = rewrite_latest
    return found


def autotp_mutations(checkpoint: Path) -> dict[str, Mutation]:
    """An AutoTP save's own metadata damaged: rank 0's model states re-saved (valid CRCs, the archive's own name) with
    one tensor's affine map changed: a share's block moved, a share's shape, a rank or a dimension of the whole
    changed, or its pattern made to match nothing (the pattern lists then say how it joins)."""
    states = next(checkpoint.rglob("zero_pp_rank_0_mp_rank_00_model_states.pt"))

    def damage_map(root: Path, rng: random.Random) -> str:
        saved = torch.load(states, weights_only=True)
        maps = saved["universal_checkpoint_info"]["affine_map"]["params"]
        pattern = rng.choice(sorted(maps))
        entry = maps[pattern]
        rank = rng.choice(sorted(entry["ranks"]))
        how = rng.choice(["a block moved", "a share's shape", "a rank dropped", "the whole's shape", "no match"])
        if how == "a block moved":
            entry["ranks"][rank]["pieces"][0]["source"][0] += rng.choice([-1, 1, 8, -8])
        elif how == "a share's shape":
            entry["ranks"][rank]["shard_shape"][0] += rng.choice([-1, 1])
        elif how == "a rank dropped":
            del entry["ranks"][rank]
        elif how == "the whole's shape":
            entry["logical_shape"][0] *= 2
        else:
            maps[pattern + "-no-such-tensor"] = maps.pop(pattern)
        torch.save(saved, states)
        return f"{states.relative_to(root)}: the affine map of {pattern}: {how} (rank {rank})"

    return {"damage the affine map": damage_map}


def trainer_mutations(step: Path) -> dict[str, Mutation]:
    """A Trainer's checkpoint-N: the copy beside DeepSpeed's save replaced by tensors that are not the checkpoint's,
    or DeepSpeed's save deleted. The copy stays out of what is judged: a copy that is the checkpoint's (any dtype)
    or placeholders is set aside, and reads right."""
    copy = next(step / name for name in TRAINER_COPIES if (step / name).exists())
    placeholders = any(shape == [0] for shape in (entry.get("shape") for entry in hf_header(copy)[0].values()))

    def replace_copy(root: Path, rng: random.Random) -> str:
        tensors = load_file(copy)
        name = rng.choice(sorted(tensors))
        how = rng.choice(["left out", "cut short", "added", "another model's"])
        if how == "left out":
            del tensors[name]
        elif how == "cut short":
            tensors[name] = tensors[name].flatten()[:max(tensors[name].numel() - 1, 1)].clone()
        elif how == "added":
            tensors[f"{name}.extra"] = torch.zeros(3)
        else:
            tensors = {"weight": torch.ones(5, 3), "bias": torch.zeros(5)}
        save_file(tensors, copy, metadata={"format": "pt"})
        what = "every tensor another model's" if how == "another model's" else f"{name} {how}"
        return f"{copy.relative_to(root)}: {what}"

    def delete_save(root: Path, rng: random.Random) -> str:
        tag = (step / "latest").read_text().strip()
        shutil.rmtree(step / tag)
        if placeholders:  # nothing but the placeholders left
            (step / "latest").unlink()
            return f"deleted {step.relative_to(root)}/{tag} and latest"
        return f"deleted {step.relative_to(root)}/{tag}"

    return {"replace the copy": replace_copy, "delete DeepSpeed's save": delete_save}


def dcp_rank_mutations(step: Path) -> dict[str, Mutation]:
    """Rank files are interchangeable only within one DCP folder (accelerate keeps model and optimizer apart)."""
    folders = sorted({p.parent for p in step.rglob("*.distcp")})
    ranks = {folder: sorted(p for p in folder.iterdir() if DISTCP.match(p.name)) for folder in folders}
    pairs = [(a, b) for files in ranks.values() for i, a in enumerate(files) for b in files[i + 1:]]
    # Files whose records have the same sizes at the same places can be swapped unseen: nothing in them says whose.
    swappable = [(a, b) for a, b in pairs if layout(a) != layout(b)]
    found: dict[str, Mutation] = {}

    def delete(root: Path, rng: random.Random) -> str:
        path = rng.choice([p for files in ranks.values() for p in files])
        path.unlink()
        return f"deleted {path.relative_to(root)}"

    def swap(root: Path, rng: random.Random) -> str:
        first, second = rng.choice(swappable)
        swap_files(first, second)
        return f"swapped {first.relative_to(root)} and {second.name}"

    def duplicate(root: Path, rng: random.Random) -> str:
        first, second = rng.sample(rng.choice([files for files in ranks.values() if len(files) > 1]), 2)
        shutil.copyfile(first, second)
        return f"copied {first.relative_to(root)} over {second.name}"

    def rewrite_metadata(root: Path, rng: random.Random) -> str:
        folder = rng.choice(folders)
        target = folder / ".metadata"
        how, content = rng.choice(metadata_rewrites(folder, root, rng))
        target.write_bytes(content)
        return f"{target.relative_to(root)} := {how}"

    found["delete rank file"] = delete
    if pairs:
        found["duplicate rank file"] = duplicate
    if swappable:
        found["swap rank files"] = swap
    found["rewrite .metadata"] = rewrite_metadata
    return found


def fastvideo_mutations(step: Path) -> dict[str, Mutation]:
    """A FastVideo step's own damage: its metadata.json rewritten, and key sets of the wrong kind (its .metadata
    re-pickled with keys filed under another group, bytes and layout untouched)."""
    def rewrite_metadata_json(root: Path, rng: random.Random) -> str:
        how, content = rng.choice(metadata_json_rewrites(step, root, rng))
        if content is None:
            (step / "metadata.json").unlink()
        else:
            (step / "metadata.json").write_bytes(content)
        return f"{(step / 'metadata.json').relative_to(root)} := {how}"

    def misfile_key_set(root: Path, rng: random.Random) -> str:
        how, metadata = rng.choice(misfiled_key_sets(step / "dcp", rng))
        (step / "dcp" / ".metadata").write_bytes(pickle.dumps(metadata))
        return f"{(step / 'dcp' / '.metadata').relative_to(root)}: {how}"

    return {"rewrite metadata.json": rewrite_metadata_json, "key set of the wrong kind": misfile_key_set}


def metadata_json_rewrites(step: Path, root: Path, rng: random.Random) -> list[tuple[str, bytes | None]]:
    """What metadata.json can become, each named: every one damaged in a way a reader can tell (a config that is
    merely different is not damage: nothing could tell it)."""
    original = json.loads((step / "metadata.json").read_text())
    garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    rewrites = [("random bytes", garbage), ("nothing", b""), ("a JSON list", b"[]"), ("deleted", None),
                ("no step", json.dumps({"config": original["config"]}).encode()),
                ("step 99", json.dumps({**original, "step": 99}).encode()),
                ("the step as a string", json.dumps({**original, "step": str(original["step"])}).encode()),
                ("a config that is a list", json.dumps({**original, "config": [1, 2]}).encode())]
    rewrites += [(f"the metadata.json of {other.parent.relative_to(root)}", other.read_bytes())
                 for other in sorted(root.rglob("metadata.json")) if other.parent.name != step.name]
    return rewrites


def rekeyed(metadata: Any, paths: dict[str, tuple]) -> Any:
    """``metadata`` with each key of ``paths`` filed under its new path (its entry, planner path and byte records)."""
    def fqn(old: str) -> str:
        return ".".join(paths[old]) if old in paths else old

    metadata.state_dict_metadata = {fqn(key): value for key, value in metadata.state_dict_metadata.items()}
    if metadata.planner_data is not None:  # Megatron-Core's planner records none
        metadata.planner_data = {fqn(key): paths.get(key, path) for key, path in metadata.planner_data.items()}
    metadata.storage_data = {dataclasses.replace(index, fqn=fqn(index.fqn)): where
                             for index, where in metadata.storage_data.items()}
    if getattr(metadata, "mcore_data", None):  # megatron-core 0.8-0.15's records of flattened tensors' shapes
        metadata.mcore_data = {fqn(key): record for key, record in metadata.mcore_data.items()}
    for plan in getattr(metadata, "all_local_plans", None) or []:  # Megatron-Core's saved plans name them too
        plan.items[:] = [dataclasses.replace(item, index=dataclasses.replace(item.index, fqn=fqn(item.index.fqn)))
                         for item in plan.items]
    return metadata


def misfiled_key_sets(folder: Path, rng: random.Random) -> list[tuple[str, Any]]:
    """The save's .metadata (read by torch from the pristine copy) with keys filed where they do not belong: an
    optimizer state among the student's weights, the student's weights under a group FastVideo never saves, the EMA
    callback's per-rank pieces swapped with the student's weights, the student's optimizer filed as a role."""
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader(str(folder))
    planner = reader.read_metadata().planner_data
    student = {key: path for key, path in planner.items() if path[0] == "roles.student.transformer"}
    states = sorted(key for key, path in planner.items() if path[0] == "optimizers.student"
                    and key.endswith(".exp_avg"))
    state = rng.choice(states)
    name = state[len("optimizers.student.state.transformer."):-len(".exp_avg")]
    shadow = {key: path for key, path in planner.items() if tuple(path[:3]) == ("callbacks", "ema", "student_ema")}
    swapped = {**{key: ("callbacks", "ema", "student_ema", path[1]) for key, path in student.items()},
               **{key: ("roles.student.transformer", path[3]) for key, path in shadow.items()}}
    optimizer = {key: ("roles.adam.transformer", *path[1:]) for key, path in planner.items()
                 if path[0] == "optimizers.student"}
    changes = [(f"{state} filed as the student's {name}.exp_avg", {state: ("roles.student.transformer",
                                                                             f"{name}.exp_avg")}),
               ("the student's weights filed under student_weights",
                {key: ("student_weights", *path[1:]) for key, path in student.items()}),
               ("the EMA callback's per-rank pieces swapped with the student's weights", swapped),
               ("the student's optimizer filed as a role, roles.adam.transformer", optimizer)]
    return [(how, rekeyed(reader.read_metadata(), paths)) for how, paths in changes]


def megatron_mutations(iteration: Path) -> dict[str, Mutation]:
    """A Megatron-Core iteration's own damage: its metadata.json (the backend) rewritten, the run's tracker rewritten
    to name no iteration, and key sets of the wrong kind (its .metadata re-pickled with keys filed under another
    group, bytes and layout untouched)."""
    def misfile_key_set(root: Path, rng: random.Random) -> str:
        how, metadata = rng.choice(megatron_misfiled_key_sets(iteration, rng))
        (iteration / ".metadata").write_bytes(pickle.dumps(metadata))
        return f"{(iteration / '.metadata').relative_to(root)}: {how}"

    return {**megatron_run_mutations(iteration), "key set of the wrong kind": misfile_key_set}


def flattened_record_mutations(iteration: Path) -> dict[str, Mutation]:
    """A megatron-core 0.8-0.15 iteration's records of its flattened tensors' shapes (``mcore_data`` in its
    .metadata, re-pickled, bytes untouched): one record's shape changed, one record dropped, or a record added for a
    model tensor. (All of them dropped is not damage of this kind: the masters cannot be placed, the bf16 weights are
    read and a note says why; tests/test_megatron_fsms.py checks it.)"""
    def rewrite_records(root: Path, rng: random.Random) -> str:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(iteration)).read_metadata()
        recorded = sorted(k for k, record in metadata.mcore_data.items() if record)  # the others' records are empty
        key = rng.choice(recorded)
        shape = list(metadata.mcore_data[key]["nd_reformulated_orig_global_shape"])
        axis = rng.randrange(len(shape))
        model = sorted(k for k in metadata.state_dict_metadata if not k.startswith(("optimizer.", "rng_state"))
                       and "_extra_state" not in k and k not in recorded)
        how, record = rng.choice([
            (f"axis {axis} doubled", shape[:axis] + [shape[axis] * 2] + shape[axis + 1:]),
            (f"axis {axis} halved", shape[:axis] + [max(1, shape[axis] // 2)] + shape[axis + 1:]),
            ("its axes reversed", shape[::-1]), ("an axis dropped", shape[1:] or [1]),
            ("dropped", None), ("given to a model tensor", "model")])
        if record is None:
            del metadata.mcore_data[key]
        elif record == "model":
            key = rng.choice(model)
            metadata.mcore_data[key] = {"nd_reformulated_orig_global_shape": tuple(
                metadata.state_dict_metadata[key].size)}
        else:
            metadata.mcore_data[key] = {"nd_reformulated_orig_global_shape": tuple(record)}
        (iteration / ".metadata").write_bytes(pickle.dumps(metadata))
        return f"{(iteration / '.metadata').relative_to(root)}: the mcore_data record of {key} {how}"

    return {"rewrite mcore_data": rewrite_records}


def megatron_run_mutations(iteration: Path) -> dict[str, Mutation]:
    """Damage of any Megatron-Core iteration, whatever its backend: its metadata.json and the run's tracker."""
    run = iteration.parent

    def rewrite_backend(root: Path, rng: random.Random) -> str:
        path = iteration / "metadata.json"
        how, content = rng.choice([
            ("random bytes", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))), ("nothing", b""),
            ("a JSON list", b"[]"), ("deleted", None), ("no backend", b'{"sharded_backend_version": 1}'),
            ("the zarr backend", b'{"sharded_backend": "zarr", "sharded_backend_version": 1}'),
            ("another backend", b'{"sharded_backend": "torch_dist2", "sharded_backend_version": 1}')])
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)
        return f"{path.relative_to(root)} := {how}"

    def rewrite_tracker(root: Path, rng: random.Random) -> str:
        path = run / "latest_checkpointed_iteration.txt"
        # never another iteration the run holds: a tracker naming it is a run saved that far, not damage
        content = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))), b"", b"99",
                              b"../../etc", b"-10", b"x" * 5000, b"\x89PNG\r\n\x1a\n\x00", b"10\n\nrm -rf /"])
        path.write_bytes(content)
        return f"{path.relative_to(root)} := {content[:40]!r}"

    return {"rewrite metadata.json": rewrite_backend, "rewrite tracker": rewrite_tracker}


def zarr_mutations(iteration: Path) -> dict[str, Mutation]:
    """A zarr-backend iteration's own damage: a chunk file deleted, cut short or one byte of it flipped (zarr keeps no
    checksum: data damage, which may end as changed finite values), a .zarray rewritten, and key sets of the wrong
    kind (array folders renamed, bytes untouched)."""
    def chunk_files(root: Path) -> list[Path]:
        return sorted(p for p in iteration.rglob("*") if p.is_file() and p.parent != iteration
                      and p.parent.joinpath(".zarray").is_file() and not p.name.startswith("."))

    def delete_chunk(root: Path, rng: random.Random) -> str:
        path = rng.choice(chunk_files(root))
        path.unlink()
        return f"deleted {path.relative_to(root)}"

    def truncate_chunk(root: Path, rng: random.Random) -> str:
        path = rng.choice(chunk_files(root))
        keep = rng.randrange(path.stat().st_size)
        os.truncate(path, keep)
        return f"{path.relative_to(root)}: truncated to {keep} bytes"

    def flip_data(root: Path, rng: random.Random) -> str:
        path = rng.choice(chunk_files(root))
        return f"{path.relative_to(root)}: {flip(path, (0, path.stat().st_size), rng)}"

    def rewrite_zarray(root: Path, rng: random.Random) -> str:
        path = rng.choice(sorted(iteration.glob("*/.zarray")))
        how, content = rng.choice(zarray_rewrites(json.loads(path.read_text()), rng))
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)
        return f"{path.relative_to(root)} := {how}"

    def misfile(root: Path, rng: random.Random) -> str:
        how, renames = rng.choice(zarr_misfiled_key_sets(iteration, rng))
        for old, new in renames.items():
            (iteration / new).parent.mkdir(parents=True, exist_ok=True)
            (iteration / old).rename(iteration / new)
        return how

    return {"delete chunk file": delete_chunk, "truncate chunk file": truncate_chunk, "flip zarr data": flip_data,
            "rewrite .zarray": rewrite_zarray, "key set of the wrong kind": misfile}


def zarr_rewrites_of(meta: dict, rng: random.Random) -> list[tuple[str, dict]]:
    """A .zarray's fields changed one at a time. Never a dtype of the same width: a chunk file's bytes read as
    another dtype of their size cannot be told from what was saved (zarr keeps no checksum nor identity)."""
    widths = {"bfloat16": "<f4", "<f4": "<f2", "<f2": "<f8", "<f8": "<f4", "<i8": "<i4"}
    shape, chunks = list(meta["shape"]), list(meta["chunks"])
    axis = rng.randrange(len(shape)) if shape else None
    changes = [("another dtype", {"dtype": widths.get(meta["dtype"], "<f8")}), ("a compressor", {"compressor": {
        "id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}}), ("Fortran order", {"order": "F"}),
        ("zarr format 3", {"zarr_format": 3}), ("the bf16 zarr would write", {"dtype": "<V2"}),
        ("a filter", {"filters": [{"id": "delta", "dtype": "<f4"}]}),
        ("a grid of billions of chunks", {"shape": [2 ** 31] * max(2, len(shape)), "chunks": [1] * max(2, len(shape))})]
    if axis is not None:
        for how, size in (("a shape one longer", shape[axis] + 1), ("a shape one shorter", shape[axis] - 1),
                          ("a shape doubled", shape[axis] * 2), ("a shape halved", shape[axis] // 2)):
            changes.append((f"{how} on axis {axis}", {"shape": shape[:axis] + [size] + shape[axis + 1:]}))
        changes.append((f"chunks halved on axis {axis}", {"chunks": chunks[:axis] + [max(1, chunks[axis] // 2)] +
                                                          chunks[axis + 1:]}))
    return changes


def zarray_rewrites(meta: dict, rng: random.Random) -> list[tuple[str, bytes | None]]:
    rewrites: list[tuple[str, bytes | None]] = [
        ("random bytes", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))), ("nothing", b""),
        ("a JSON list", b"[]"), ("deleted", None)]
    rewrites += [(how, json.dumps({**meta, **change}).encode()) for how, change in zarr_rewrites_of(meta, rng)]
    return rewrites


def zarr_misfiled_key_sets(iteration: Path, rng: random.Random) -> list[tuple[str, dict[str, str]]]:
    """Array folders renamed into another kind: an optimizer state as the model's ``<key>.exp_avg``, the model under
    ``ema.``, a weight as an fp32 master or among the RNG states' pieces."""
    arrays = sorted(p.name for p in iteration.iterdir() if (p / ".zarray").is_file())
    model = [key for key in arrays if not key.startswith("optimizer.")]
    state = rng.choice([key for key in arrays if key.startswith("optimizer.state.exp_avg.")])
    parameter = state[len("optimizer.state.exp_avg."):]
    unmastered = [key for key in model if f"optimizer.state.fp32_param.{key}" not in arrays]
    weight = rng.choice(unmastered)
    return [(f"{state} filed as the model's {parameter}.exp_avg", {state: f"{parameter}.exp_avg"}),
            ("the model filed under ema", {key: f"ema.{key}" for key in model}),
            (f"{weight} filed as its own fp32 master", {weight: f"optimizer.state.fp32_param.{weight}"}),
            (f"{weight} filed among rng_state's pieces", {weight: f"rng_state/{weight}"})]


def megatron_misfiled_key_sets(folder: Path, rng: random.Random) -> list[tuple[str, Any]]:
    """The iteration's .metadata (read by torch from the pristine copy) with keys filed where they do not belong: an
    optimizer state as a model tensor under its parameter, the model under a group Megatron never saves, a model
    tensor as an optimizer state or as RNG state."""
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader(str(folder))
    entries = reader.read_metadata().state_dict_metadata
    states = sorted(key for key in entries if key.startswith("optimizer.state.exp_avg."))
    state = rng.choice(states)
    parameter = state[len("optimizer.state.exp_avg."):]
    model = [key for key in entries if not key.startswith(("optimizer.", "rng_state", "common_state"))
             and "_extra_state" not in key]
    weight = rng.choice(sorted(key for key in model if key.endswith(".weight")))
    changes = [(f"{state} filed as the model's {parameter}.exp_avg", {state: f"{parameter}.exp_avg"}),
               ("the model filed under ema", {key: f"ema.{key}" for key in model}),
               (f"{weight} filed as optimizer.state.fp32_param.{weight}",
                {weight: f"optimizer.state.fp32_param.{weight}"}),
               (f"{weight} filed as rng_state/{weight}", {weight: f"rng_state/{weight}"})]
    return [(how, rekeyed(reader.read_metadata(), {old: (new,) for old, new in paths.items()}))
            for how, paths in changes]


def hf_header(path: Path) -> tuple[dict, int]:
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]), size


def hf_rank_mutations(folder: Path) -> dict[str, Mutation]:
    """A Hugging Face writer save's rank files (shard-R-model-K-of-N.safetensors): see the module docstring."""
    files = sorted(p for p in folder.iterdir() if HF_RANK_FILE.match(p.name))
    ranks = {p: int(HF_RANK_FILE.match(p.name).group(1)) for p in files}
    highest = max(ranks.values())
    deletable = [p for p in files if ranks[p] < highest or sum(r == highest for r in ranks.values()) > 1]
    swappable = [(a, b) for i, a in enumerate(files) for b in files[i + 1:] if ranks[a] != ranks[b]
                 and a.name[len("shard-00000"):] == b.name[len("shard-00000"):] and a.stat().st_size != b.stat().st_size]

    def delete(root: Path, rng: random.Random) -> str:
        path = rng.choice(deletable)
        path.unlink()
        return f"deleted {path.relative_to(root)}"

    def swap(root: Path, rng: random.Random) -> str:
        first, second = rng.choice(swappable)
        swap_files(first, second)
        return f"swapped {first.relative_to(root)} and {second.name}"

    def duplicate(root: Path, rng: random.Random) -> str:
        first, second = rng.sample(files, 2)
        shutil.copyfile(first, second)
        return f"copied {first.relative_to(root)} over {second.name}"

    def move_piece(root: Path, rng: random.Random) -> str:
        path = rng.choice(files)
        header, size = hf_header(path)
        info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        name = rng.choice(sorted(name for name, entry in info.items() if entry["saved_offsets"]))
        offsets = info[name]["saved_offsets"]
        dim = rng.randrange(len(offsets))
        offsets[dim] = max(0, offsets[dim] + rng.choice([-3, -1, 1, 2, 7]))
        header["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)
        encoded = json.dumps(header).encode()
        data = path.read_bytes()
        path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size:])
        return f"{path.relative_to(root)}: {name}'s piece placed at {offsets}"

    found = {"delete rank file": delete, "duplicate rank file": duplicate, "move a piece": move_piece}
    if swappable:
        found["swap rank files"] = swap
    return found


def metadata_rewrites(folder: Path, root: Path, rng: random.Random) -> list[tuple[str, bytes]]:
    """What a .metadata can be replaced with, each named. All but one are wrong for this folder in a way a reader can
    tell; the .metadata of the same folder of the step before describes the very same layout, so it reads right."""
    original = (folder / ".metadata").read_bytes()
    garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    marker = root / PWNED
    rewrites = [
        ("random bytes", garbage), ("nothing", b""),
        ("a pickled dict", pickle.dumps({"state_dict_metadata": {}, "storage_data": {}})),
        ("a pickle that runs a shell command", b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."),
        ("the pickle with its last byte dropped", original[:-1]),
    ]
    rewrites += [(f"the .metadata of {other.parent.relative_to(root)}", other.read_bytes())
                 for other in sorted(root.rglob(".metadata")) if other.parent != folder]
    rewrites += [(how, pickle.dumps(metadata)) for how, metadata in retargeted_metadata(folder, rng)]
    return rewrites


def retargeted_metadata(folder: Path, rng: random.Random) -> list[tuple[str, Any]]:
    """The folder's metadata (read by torch, trusted: it is the pristine copy) with one chunk's storage record pointed
    at another record's bytes (of the same length where there is one) or reaching over the next record, as a flipped
    bit in an offset or a length could do; or with one entry left out, bytes and all."""
    from torch.distributed.checkpoint import FileSystemReader

    changed = []
    reader = FileSystemReader(str(folder))
    records = sorted(reader.read_metadata().storage_data.items(), key=lambda r: (r[1].relative_path, r[1].offset))
    index, info = rng.choice(records)
    same_length = [i for i, other in records if other.length == info.length and i != index] or \
        [i for i, _ in records if i != index]
    metadata = reader.read_metadata()
    other = rng.choice(same_length)
    metadata.storage_data[index] = metadata.storage_data[other]
    changed.append((f"{index.fqn}'s chunk pointed at {other.fqn}'s bytes", metadata))
    following = [i for i, r in records
                 if r.relative_path == info.relative_path and r.offset == info.offset + info.length]
    if following:
        metadata = reader.read_metadata()
        metadata.storage_data[index] = dataclasses.replace(
            info, length=info.length + metadata.storage_data[following[0]].length)
        changed.append((f"{index.fqn}'s chunk reaching over {following[0].fqn}'s", metadata))
    metadata = reader.read_metadata()
    fqn = index.fqn
    metadata.state_dict_metadata.pop(fqn)
    if metadata.planner_data is not None:
        metadata.planner_data.pop(fqn, None)
    metadata.storage_data = {i: r for i, r in metadata.storage_data.items() if i.fqn != fqn}
    changed.append((f"{fqn} left out", metadata))
    return changed


# -- running a command in a forked child ---------------------------------------------------------------------
@dataclass
class Run:
    code: int | None  # None: killed after TIME_LIMIT
    stdout: str
    stderr: str
    seconds: float


def _address_space() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def run_forked(function: Callable[[], int], workdir: Path) -> Run:
    """Run ``function`` in a forked child with stdout/stderr captured, killed after TIME_LIMIT seconds."""
    out_path, err_path = workdir / ".stdout", workdir / ".stderr"
    start = time.perf_counter()
    limit = _address_space() + MEMORY_HEADROOM
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 98
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            out_fd, err_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), \
                os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            code = function()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 99
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = start + TIME_LIMIT
    code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    run = Run(code, read(out_path), read(err_path), time.perf_counter() - start)
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return run


def cogexport_command(*args: str) -> Callable[[], int]:
    def run() -> int:
        from cogexport.cli import main

        main([*args], prog_name="cogexport", standalone_mode=True)
        return 0
    return run


# -- judging ------------------------------------------------------------------------------------------------
def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".std")}


def read_output(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def same_tensors(written: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> bool:
    return written.keys() == truth.keys() and all(
        written[n].dtype == truth[n].dtype and torch.equal(written[n], truth[n]) for n in truth)


def same_values(first: Any, second: Any) -> bool:
    """Nested dicts, lists and tuples of tensors and plain values, equal to the bit."""
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and \
            first.dtype == second.dtype and first.shape == second.shape and torch.equal(first, second)
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same_values(first[k], second[k]) for k in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return type(first) is type(second) and len(first) == len(second) and \
            all(same_values(a, b) for a, b in zip(first, second))
    return type(first) is type(second) and first == second


def judge_error(run: Run, output: Path, before: dict[str, str], root: Path) -> str:
    """Class of a run that did not succeed."""
    if run.code is None:
        return "hang"
    if run.code == 99 or "Traceback (most recent call last)" in run.stderr:
        return "traceback"
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.code != 2 or len(lines) != 1 or not lines[0].startswith("cogexport: error: "):
        return "multi-line error" if run.code == 2 else "traceback"
    if output.exists() or any(".cogexport-" in p.name for p in output.parent.iterdir()) or snapshot(root) != before:
        return "dirty"
    return "clean error"


def judge_writer(run: Run, output: Path, truth: dict[str, torch.Tensor], before: dict[str, str], root: Path,
                 mutation: str) -> str:
    if run.code == 0:
        if snapshot(root) != before:
            return "dirty"
        written = read_output(output)
        if same_tensors(written, truth):
            return "right"
        if any(not bool(torch.isfinite(t).all()) for t in written.values() if t.dtype.is_floating_point):
            return "non-finite passed on"
        return UNDETECTABLE if mutation in DATA_DAMAGE and same_layout(written, truth) else "silently wrong"
    return judge_error(run, output, before, root)


def same_layout(written: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> bool:
    """The same names, dtypes and shapes: only values differ."""
    return written.keys() == truth.keys() and all(
        (written[n].dtype, written[n].shape) == (truth[n].dtype, truth[n].shape) for n in truth)


def comparable_report(stdout: str, root: Path) -> dict:
    report = json.loads(stdout)
    text = json.dumps(report).replace(str(root), "<root>")
    return json.loads(text)


def judge_inspect(run: Run, pristine: dict | None, root: Path, before: dict[str, str]) -> str:
    if run.code in (0, 1):
        if "Traceback" in run.stderr:
            return "traceback"
        if snapshot(root) != before:
            return "dirty"
        try:
            report = comparable_report(run.stdout, root)
        except ValueError:
            return "traceback"
        if run.code == 1:
            return "problems listed" if report["problems"] else "multi-line error"
        return "right" if report == pristine else "silently wrong"
    return judge_error(run, root / "no-output", before, root)


# -- the converters a user would otherwise run, side by side --------------------------------------------------
def zero_to_fp32(checkpoint: Path) -> Any:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return {name: t.clone() for name, t in get_fp32_state_dict_from_zero_checkpoint(str(checkpoint)).items()}


def dcp_to_torch_save(folder: Path, output: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as convert

    convert(str(folder), str(output))


def reference_command(tool: str, source: Path, output: Path) -> Callable[[], int]:
    def run() -> int:
        if tool == "zero_to_fp32":
            torch.save(zero_to_fp32(source), output)
        else:
            dcp_to_torch_save(source, output)
        return 0
    return run


REFERENCES = ("zero_to_fp32", "dcp_to_torch_save")


def judge_reference(run: Run, output: Path, baseline: Any, root: Path) -> str:
    if (root / PWNED).exists():
        return "ran the pickle's code"
    if run.code is None:
        return "hang"
    if run.code == 99:
        return "traceback"
    if run.code != 0:
        return "crash"
    written = torch.load(output, weights_only=True)
    return "right" if baseline is not None and same_values(written, baseline) else "silently wrong"


# -- the campaign -------------------------------------------------------------------------------------------
@dataclass
class Case:
    seed: int
    source: str
    family: str
    mutation: str
    detail: str
    results: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # each cogexport run's last line on stderr


def baseline(source: Source, work: Path, references: bool) -> tuple[dict, Any]:
    """The undamaged copy's inspect report and the reference tool's output on it; and a check that cogexport is
    right on it."""
    root = work / "pristine"
    shutil.copytree(source.root, root)
    checkpoint = root / source.checkpoint
    inspected = run_forked(cogexport_command("inspect", str(checkpoint), "--json", "--verbose"), work)
    if inspected.code != 0:
        raise click.ClickException(f"inspect fails on the undamaged {source.name}: {inspected.stderr[-2000:]}")
    report = comparable_report(inspected.stdout, root)
    for command, truth in (("consolidate", source.truth), ("export", source.export_truth)):
        if truth:
            args = (str(checkpoint), str(work / "out"), *source.export) if command == "export" else \
                ("consolidate", str(checkpoint), str(work / "out"))
            done = run_forked(cogexport_command(*args), work)
            if done.code != 0 or not same_tensors(read_output(work / "out"), truth):
                raise click.ClickException(f"{command} is not right on the undamaged {source.name}: {done.stderr}")
            shutil.rmtree(work / "out")
    reference_output = None
    if references and source.reference:
        ran = run_forked(reference_command(source.reference, root / source.reference_input, work / "ref.pt"), work)
        # zero_to_fp32 cannot read every layout (BF16_Optimizer files): then it sits out this source's cases
        reference_output = torch.load(work / "ref.pt", weights_only=True) if ran.code == 0 else None
    shutil.rmtree(root)
    (work / "ref.pt").unlink(missing_ok=True)
    return report, reference_output


def damaged_folder(source: Source, root: Path) -> Path:
    """The folder whose files a case damages, in ``root`` (a copy of the source's root, or the root itself)."""
    checkpoint = root / source.checkpoint
    return root / source.damage if source.damage else checkpoint.parent if checkpoint.is_file() else checkpoint


def damage_classes(source: Source, damage: tuple[str, ...]) -> list[str]:
    """The source's mutation classes (every one, or those of ``damage``), read off its pristine files."""
    return sorted(name for name in mutations_for(source, damaged_folder(source, source.root))
                  if not damage or name in damage)


def run_case(source: Source, seed: int, turn: int, work: Path, pristine: dict, reference_output: Any,
             references: bool, damage: tuple[str, ...] = ()) -> Case:
    """Damage a copy of ``source`` with the ``turn``-th of its mutation classes (of ``damage`` only, if given; in
    turn, so that small runs cover them all; where and how from ``seed``) and judge every run on it."""
    rng = random.Random(seed)
    root = work / f"case-{seed}"
    shutil.copytree(source.root, root)
    checkpoint = root / source.checkpoint
    choices = mutations_for(source, damaged_folder(source, root))
    classes = sorted(name for name in choices if not damage or name in damage)
    mutation = classes[turn % len(classes)]
    detail = choices[mutation](root, rng)
    before = snapshot(root)
    seconds, messages = {}, {}
    run = run_forked(cogexport_command("inspect", str(checkpoint), "--json", "--verbose"), work)
    results, seconds["inspect"] = {"inspect": judge_inspect(run, pristine, root, before)}, run.seconds
    messages["inspect"] = last_line(run)
    if source.truth:
        output = work / f"out-{seed}"
        run = run_forked(cogexport_command("consolidate", str(checkpoint), str(output)), work)
        results["consolidate"], seconds["consolidate"] = judge_writer(run, output, source.truth, before, root,
                                                                      mutation), run.seconds
        messages["consolidate"] = last_line(run)
        shutil.rmtree(output, ignore_errors=True)
    if source.export:
        output = work / f"export-{seed}"
        run = run_forked(cogexport_command(str(checkpoint), str(output), *source.export), work)
        results["export"], seconds["export"] = judge_writer(run, output, source.export_truth, before, root,
                                                            mutation), run.seconds
        messages["export"] = last_line(run)
        shutil.rmtree(output, ignore_errors=True)
    writers = [r for k, r in results.items() if k != "inspect"]
    if results["inspect"] == "right" and any(r not in ("right", UNDETECTABLE) for r in writers):
        results["inspect"] = "inspect missed it"  # told usable, yet a writer refused or erred
    elif results["inspect"] == "right" and UNDETECTABLE in writers:
        results["inspect"] = UNDETECTABLE  # nor could it tell: the same report as the undamaged copy's
    if references and source.reference and reference_output is not None:
        output = work / f"reference-{seed}.pt"
        run = run_forked(reference_command(source.reference, root / source.reference_input, output), work)
        results[source.reference] = judge_reference(run, output, reference_output, root)
        seconds[source.reference] = run.seconds
        output.unlink(missing_ok=True)
    shutil.rmtree(root)
    return Case(seed, source.name, source.family, mutation, detail, results,
                {k: round(v, 2) for k, v in seconds.items()}, {k: v for k, v in messages.items() if v})


def last_line(run: Run) -> str:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    return lines[-1][:300].replace(str(Path(tempfile.gettempdir())), "<tmp>") if lines else ""


def campaign(seed: int, count: int, references: bool, verbose: bool = False,
             only: tuple[str, ...] = (), damage: tuple[str, ...] = ()) -> list[Case]:
    if references:
        import deepspeed.utils.zero_to_fp32  # noqa: F401  (imported once, before forking)
        from torch.distributed.checkpoint import format_utils  # noqa: F401
    import cogexport.cli  # noqa: F401
    import cogexport.exporter  # noqa: F401
    torch.set_num_threads(1)
    all_sources = [s for s in sources(only) if damage_classes(s, damage)]
    cases = []
    with tempfile.TemporaryDirectory(prefix="cogexport-fuzz-") as temporary:
        work = Path(temporary)
        baselines = {}
        for index in range(count):
            source = all_sources[index % len(all_sources)]
            if source.name not in baselines:
                baselines[source.name] = baseline(source, work, references)
            # Sources start three classes apart (the seed shifts them all), so that a few turns of neighbouring
            # sources together take every class.
            turn = seed + index // len(all_sources) + 3 * (index % len(all_sources))
            case = run_case(source, seed * 1_000_003 + index, turn, work, *baselines[source.name], references,
                            damage)
            cases.append(case)
            if verbose:
                click.echo(f"{case.seed} {case.source} [{case.mutation}] {case.detail}: {case.results} {case.seconds}",
                           err=True)
                for tool, message in case.messages.items():
                    click.echo(f"    {tool}: {message}", err=True)
    return cases


def outcomes(cases: list[Case]) -> dict[str, dict]:
    """mutation -> {"cases": n, tool: outcome counts} over ``cases``."""
    return {mutation: {"cases": sum(1 for c in cases if c.mutation == mutation),
                       **{tool: dict(Counter(c.results[tool] for c in cases if c.mutation == mutation
                                             and tool in c.results))
                          for tool in sorted({t for c in cases for t in c.results})}}
            for mutation in sorted({c.mutation for c in cases})}


def summary(cases: list[Case]) -> dict:
    tools = sorted({tool for case in cases for tool in case.results})
    return {
        "cases": len(cases),
        "runs": sum(len(case.results) for case in cases),
        "by_tool": {tool: dict(Counter(c.results[tool] for c in cases if tool in c.results)) for tool in tools},
        "by_mutation": {m: dict(Counter(r for c in cases if c.mutation == m for r in c.results.values()))
                        for m in sorted({c.mutation for c in cases})},
        "by_source": dict(Counter(c.source for c in cases)),
        "by_family": {family: outcomes([c for c in cases if c.family == family])
                      for family in sorted({c.family for c in cases})},
        # the cases each reference tool went through, cogexport beside it (the README's tables)
        "side_by_side": {tool: outcomes([c for c in cases if tool in c.results])
                         for tool in REFERENCES if any(tool in c.results for c in cases)},
        "failures": [case.__dict__ for case in cases
                     if any(r in FAILURES for t, r in case.results.items() if t not in REFERENCES)],
    }


def table(title: str, rows: dict[str, dict], columns: tuple[str, ...]) -> list[str]:
    """Damage classes against tools: the outcome counts of each, most frequent first; a last row for all."""
    tools = [t for t in columns if any(row.get(t) for row in rows.values())]
    total = {"cases": sum(row["cases"] for row in rows.values()),
             **{t: sum((Counter(row.get(t, {})) for row in rows.values()), Counter()) for t in tools}}
    cells = [[name, str(row["cases"]), *(", ".join(f"{k} {v}" for k, v in sorted(row.get(t, {}).items(),
                                                                                 key=lambda kv: (-kv[1], kv[0])))
                                         for t in tools)]
             for name, row in [*sorted(rows.items(), key=lambda r: (-r[1]["cases"], r[0])), ("all", total)]]
    header = ["damage", "cases", *(f"cogexport {t}" if t not in REFERENCES else t for t in tools)]
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i == 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa
    return [title, *(line(r).rstrip() for r in [header, *cells])]


@click.command()
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--count", type=click.IntRange(1), default=100, show_default=True, help="Damaged copies to make.")
@click.option("--cogexport-only", is_flag=True, help="Do not run zero_to_fp32 and dcp_to_torch_save side by side.")
@click.option("--only", "families", multiple=True,
              type=click.Choice([family for family, _ in SOURCE_FAMILIES]),
              help="Only these sources (repeatable).")
@click.option("--damage", multiple=True, metavar="CLASS",
              help="Only these damage classes (repeatable), on the sources they apply to: 'flip safetensors data'.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--verbose", is_flag=True, help="One line per case on stderr.")
def main(seed: int, count: int, cogexport_only: bool, families: tuple[str, ...], damage: tuple[str, ...],
         as_json: bool, verbose: bool) -> None:
    started = time.perf_counter()
    cases = campaign(seed, count, not cogexport_only, verbose, families, damage)
    result = summary(cases)
    result.update(seed=seed, seconds=round(time.perf_counter() - started, 1))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"seed {seed}: {result['cases']} damaged copies, {result['runs']} runs, {result['seconds']} s")
        click.echo(f"sources: {', '.join(f'{k} {v}' for k, v in result['by_source'].items())}")
        for tool, classes in result["by_tool"].items():
            click.echo(f"  {tool:<17} " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
        for family, rows in result["by_family"].items():
            click.echo("\n".join(table(f"{family} sources:", rows, ("inspect", "consolidate", "export"))))
        for tool, rows in result["side_by_side"].items():
            click.echo("\n".join(table(f"the copies {tool} went through:", rows, ("consolidate", "export", tool))))
        for failure in result["failures"]:
            click.echo(f"FAILED seed {failure['seed']} {failure['source']} [{failure['mutation']}] "
                       f"{failure['detail']}: {failure['results']}")
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
