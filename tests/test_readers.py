"""A reader is declared once and registered once: cogexport's own pass the checks any reader must pass, every report
keeps the keys inspect --json has always had, and a reader from another package (the entry-point group
``cogexport.readers``) is asked like cogexport's own: ``inspect`` and ``consolidate`` read a toy format through it,
the line saying what a folder lacks names what it looks for, and a malformed registration is refused in one line.
The outside package runs in a fresh process, as pip would install it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from outside_package import outside_package, run_with_package
from safetensors.torch import load_file

from cogexport.checkpoint.base import CheckpointInfo
from cogexport.checkpoint.claims import folder_claims
from cogexport.checkpoint.readers import (BUILT_IN, Claim, FolderScan, Reader, ReaderDeclarationError, info_dict,
                                          reader_of_file, register_reader, remove_reader)
from cogexport.checkpoint.readers.facts import KEY_ORDER
from cogexport.checkpoint.readers.registry_checks import problem_with

TOY_READER = '''
"""A toy format: a JSON file of tensors (*.toyckpt) with the version of the program that saved it."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from cogexport.checkpoint.base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from cogexport.checkpoint.readers import Claim, Reader
from cogexport.lazy import LazyTensor


@dataclass
class ToyFacts(ReaderFacts):
    toy_version: int | None = None


class ToyCheckpoint(LazyCheckpoint):
    def __init__(self, path):
        super().__init__()
        saved = json.loads(Path(path).read_text())
        self.info = CheckpointInfo(format="toy", paths=[str(path)], files=[str(path)],
                                   facts=ToyFacts(saved["version"]), weights_source="toy tensors")
        for name, values in saved["tensors"].items():
            tensor = torch.tensor(values, dtype=torch.float32)
            self._tensors[name] = LazyTensor(tensor.shape, tensor.dtype, tensor.clone, name)
        self.info.trainable = list(self._tensors)


def toy_claims(scan):
    return [Claim(TOY, file, lambda options, file=file: ToyCheckpoint(file), covers={file})
            for file in scan.files(".toyckpt")]


TOY = Reader(name="toy", format="toy", what="the toy checkpoint", looks_for="a toy checkpoint (*.toyckpt)",
             claims=toy_claims, describe=lambda facts: f"toy checkpoint, version {facts.toy_version}",
             facts=ToyFacts, reads_file=lambda path: path.suffix == ".toyckpt",
             open_file=lambda path, options: ToyCheckpoint(path))
NOT_A_READER = {"name": "toy"}
'''
TENSORS = {"blocks.0.weight": [[1.0, 2.0], [3.0, 4.0]], "blocks.0.bias": [0.5, -0.5]}


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    return outside_package(tmp_path_factory.mktemp("toy-reader"), "toy_reader", {"toy_reader.py": TOY_READER},
                           {"cogexport.readers": {"toy": "toy_reader:TOY"}})


@pytest.fixture
def toy_file(tmp_path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "weights.toyckpt"
    path.write_text(json.dumps({"version": 3, "tensors": TENSORS}))
    return path


def test_every_reader_of_cogexports_passes_the_checks_a_reader_from_outside_must_pass():
    for index, reader in enumerate(BUILT_IN):
        assert problem_with(reader, BUILT_IN[:index]) == "", reader.name


def test_every_report_keeps_the_keys_inspect_json_has_always_had_in_their_order():
    """A safetensors report has "stage": null as it always had: every reader's facts are keys of every report (the
    facts added since, DeepSpeed's tensor_parallel, FastVideo's roles, Megatron-Core's backend and imaginaire's
    iteration and weight set, follow in registry order)."""
    for reader in BUILT_IN:
        flat = info_dict(CheckpointInfo(format=reader.format, paths=[], facts=reader.facts()))
        assert tuple(flat)[:len(KEY_ORDER)] == KEY_ORDER, reader.name
        assert tuple(flat)[len(KEY_ORDER):] == ("tensor_parallel", "roles", "role", "method", "sharded_backend",
                                                "stacked", "latest", "weight_set"), reader.name
        assert flat["format"] == reader.format and flat["stage"] is None and flat["metadata"] == {}


def test_a_file_given_alone_goes_to_the_reader_that_names_it_else_to_torch_save(tmp_path):
    names = {"mp_rank_00_model_states.pt": "DeepSpeed", "model.safetensors": "safetensors", "model.gguf": "GGUF",
             "model.pt": "torch.save", "weights.anything": "torch.save"}
    assert {name: reader_of_file(tmp_path / name).name for name in names} == names


def _folder_reader(supersedes: tuple[str, ...]) -> Reader:
    def claims(scan: FolderScan) -> list[Claim]:
        marked = scan.folder / "toy.marker"
        return [Claim(reader, scan.folder, lambda options: None, whole_folder=True, covers=set(scan.entries))] \
            if marked.is_file() else []

    reader = Reader(name="toy folders", format="toy-folder", what="the toy save", looks_for="a toy save (toy.marker)",
                    claims=claims, describe=lambda facts: "toy save", whole_folders=True, supersedes=supersedes)
    return reader


@pytest.mark.parametrize("supersedes", [(), ("Hugging Face writer",)])
def test_a_reader_that_supersedes_another_takes_the_folder_they_both_claim(tmp_path, supersedes):
    """A format saved inside another (Megatron-Core's torch_dist is a DCP save): its reader takes the folder, and the
    more general reader's claim gives way, rather than both being candidates."""
    (tmp_path / "toy.marker").touch()
    (tmp_path / "shard-00001-model-00001-of-00001.safetensors").touch()  # claimed by name by the HF writer reader
    register_reader(_folder_reader(supersedes))
    try:
        readers = [claim.reader.name for claim in folder_claims(tmp_path)]
    finally:
        remove_reader("toy folders")
    assert readers == (["toy folders"] if supersedes else ["Hugging Face writer", "toy folders"])


@pytest.mark.parametrize("supersedes", [(), ("safetensors",)])
def test_a_reader_that_supersedes_another_takes_the_files_they_both_name(tmp_path, supersedes):
    """A variant of a format cogexport reads (DeepSpeed AutoTP's model states beside DeepSpeed's)."""
    register_reader(Reader(name="toy variant", format="toy-variant", what="x", looks_for="x",
                           claims=lambda scan: [], describe=lambda facts: "x", supersedes=supersedes,
                           reads_file=lambda path: path.suffix == ".safetensors", open_file=lambda path, options: None))
    try:
        named = reader_of_file(tmp_path / "model.safetensors").name
    finally:
        remove_reader("toy variant")
    assert named == ("toy variant" if supersedes else "safetensors")


def test_register_reader_refuses_a_malformed_reader_in_one_line():
    clash = Reader(name="DCP", format="dcp2", what="x", looks_for="x", claims=lambda scan: [],
                   describe=lambda facts: "x")
    with pytest.raises(ReaderDeclarationError, match=r"^register_reader: reader 'DCP': the reader 'DCP' .* has its "
                                                     "name"):
        register_reader(clash)
    with pytest.raises(ReaderDeclarationError, match="open_file needs reads_file"):
        register_reader(Reader(name="t", format="t", what="x", looks_for="x", claims=lambda scan: [],
                               describe=lambda facts: "x", open_file=lambda path, options: None))


# -- a reader from another package --------------------------------------------------------------------------------
def test_inspect_reads_a_file_of_a_format_an_outside_reader_declares(toy_package, toy_file):
    done = run_with_package(toy_package, "inspect", "--json", toy_file)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["format"], report["toy_version"], report["usable"]) == ("toy", 3, True)
    # ok first, then every reader's keys, as ever
    assert tuple(report)[:len(KEY_ORDER) + 1] == ("ok", *KEY_ORDER) and report["stage"] is None
    assert {row["name"]: row["shape"] for row in report["tensors"]} == {"blocks.0.weight": [2, 2], "blocks.0.bias": [2]}
    text = run_with_package(toy_package, "inspect", toy_file.parent)
    assert re.search(r"^format +toy checkpoint, version 3$", text.stdout, re.MULTILINE), text.stdout + text.stderr
    assert f"read {toy_file.name}, the only checkpoint in {toy_file.parent}" in text.stdout


def test_consolidate_writes_what_an_outside_reader_reads(toy_package, toy_file, tmp_path):
    done = run_with_package(toy_package, "consolidate", "--json", toy_file.parent, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"]["origin"] == f"the toy checkpoint {toy_file}"
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert {name: tensor.tolist() for name, tensor in written.items()} == TENSORS
    assert all(tensor.dtype == torch.float32 for tensor in written.values())


def test_the_line_saying_a_folder_holds_nothing_names_what_an_outside_reader_looks_for(toy_package, tmp_path):
    (tmp_path / "notes.txt").write_text("no weights here")
    done = run_with_package(toy_package, "inspect", tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "holds no checkpoint cogexport can read" in lines[0] and "a toy checkpoint (*.toyckpt)" in lines[0]


MALFORMED = {
    "not a reader": ("toy_reader:NOT_A_READER", "it is a dict, not a cogexport Reader"),
    "no such module": ("toy_reader_gone:TOY", "does not load: ModuleNotFoundError"),
    "a name taken": ("toy_reader:TAKEN", "reader 'safetensors': the reader 'safetensors' (format 'safetensors') has"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_registration_is_refused_in_one_line_naming_it(tmp_path, toy_file, case):
    value, phrase = MALFORMED[case]
    source = TOY_READER + "TAKEN = Reader(**{**TOY.__dict__, 'name': 'safetensors'})\n"
    package = outside_package(tmp_path / "package", "bad_reader", {"toy_reader.py": source},
                              {"cogexport.readers": {"toy": value}})
    done = run_with_package(package, "inspect", toy_file)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"the reader toy = {value} (entry point group cogexport.readers of the package bad_reader)" in lines[0]
    assert phrase in lines[0] and "fix or uninstall the package" in lines[0]

