"""A family is data: a family.toml, its tables and a small shapes module, in cogexport's key_maps/ or in any other
package. These tests add a toy family from a temporary package (its transformer a real Diffusers class no family of
cogexport's uses) and export with it; a family whose shapes module lacks a hook is refused when it loads, in one
line naming the family and the hook."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from diffusers import UNet2DModel
from outside_package import outside_package, run_with_package
from safetensors.torch import save_file

from cogexport.exporter.original_writers import ORIGINAL_WRITERS
from cogexport.keymap.roots import add_key_map_root, remove_key_map_root
from cogexport.models import family as family_module

TOY_SHAPES = '''
"""A toy family's shapes module: every required hook, none of the optional ones."""
from cogexport.errors import CogExportError


def read_facts(shapes):
    if "conv_in.weight" not in shapes:
        raise CogExportError("not a toy transformer")
    return {"channels": shapes["conv_in.weight"][1], "width": shapes["conv_in.weight"][0]}


def task_of(facts):
    return "t2i"


def describe(facts):
    return f"toy model, width {facts['width']}"


def layout_variant(config, experts=(), pipeline=None):
    return "Toy-1"


def check_target(facts, config, where):
    return None
'''

TOY_FAMILY = '''
[family]
name = "Toy"
shapes = "{package}.toy_shapes"
tags = ["toy"]

[transformer]
class = "UNet2DModel"
tables = ["original_transformer"]

[pipeline]
scheduler = "DDPMScheduler"

[tasks.t2i]
pipeline = "DDPMPipeline"
pipeline_tag = "unconditional-image-generation"

[[variant]]
name = "Toy-1"
hub_id = "toy/toy-1"
task = "t2i"
shapes = {{ channels = 3, width = 8 }}
transformer = {{ sample_size = 8, block_out_channels = [8], down_block_types = ["DownBlock2D"], up_block_types = ["UpBlock2D"], layers_per_block = 1, norm_num_groups = 4 }}
'''

TOY_TABLE = '''
[table]
name = "toy/original_transformer"
description = "the toy's original layout (every name under toy_unet.)"
source = "toy original layout"
target = "UNet2DModel"
select_prefix = "toy_unet."
signature = ["conv_in.*"]

[placeholders]
key = "path"

[[rename]]
from = "{key}"
to = "{key}"
'''


def _toy_package(root: Path, name: str, shapes: str = TOY_SHAPES) -> str:
    package = root / name
    (package / "key_maps" / "toy").mkdir(parents=True)
    for init in (package / "__init__.py", package / "key_maps" / "__init__.py"):
        init.write_text("")
    (package / "toy_shapes.py").write_text(textwrap.dedent(shapes))
    (package / "key_maps" / "toy" / "family.toml").write_text(TOY_FAMILY.format(package=name))
    (package / "key_maps" / "toy" / "original_transformer.toml").write_text(TOY_TABLE)
    return name


@pytest.fixture
def toy_root(tmp_path, monkeypatch):
    """A temporary package holding the toy family, added as a key-map root for the test only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    added = []

    def add(name: str, shapes: str = TOY_SHAPES) -> None:
        _toy_package(tmp_path, name, shapes)
        importlib.invalidate_caches()
        add_key_map_root(f"{name}.key_maps")
        added.append(f"{name}.key_maps")

    yield add
    for root in added:
        remove_key_map_root(root)
        sys.modules.pop(root.split(".")[0], None)
    if added:  # the export command's choices and help were made with the toy family: make them again when asked
        from cogexport.cli import main

        main.commands.pop("export", None)
        sys.modules.pop("cogexport.cli_export", None)


def test_a_toy_family_in_another_package_exports(toy_root, cli, tmp_path):
    toy_root("toyfamily_ok")
    assert "Toy" in [family.name for family in family_module.families()]
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=8, block_out_channels=(8,), down_block_types=("DownBlock2D",),
                        up_block_types=("UpBlock2D",), layers_per_block=1, norm_num_groups=4)
    release = tmp_path / "toy-release.safetensors"
    save_file({f"toy_unet.{name}": tensor.contiguous() for name, tensor in model.state_dict().items()}, release)
    result = cli(release, tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert "Toy-1 transformer" in result.stdout
    loaded = UNet2DModel.from_pretrained(tmp_path / "out")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.state_dict().keys() == model.state_dict().keys()


def test_a_family_of_an_installed_package_is_found_through_its_entry_point(tmp_path):
    """The toy family as pip would install it: its folders in a package declaring the cogexport.key_maps entry point,
    in a fresh process that nothing else tells of it."""
    files = {"toyfamily_installed/__init__.py": "", "toyfamily_installed/key_maps/__init__.py": "",
             "toyfamily_installed/toy_shapes.py": TOY_SHAPES,
             "toyfamily_installed/key_maps/toy/family.toml": TOY_FAMILY.format(package="toyfamily_installed"),
             "toyfamily_installed/key_maps/toy/original_transformer.toml": TOY_TABLE}
    package = outside_package(tmp_path / "site", "toyfamily-installed", files,
                              {"cogexport.key_maps": {"toy": "toyfamily_installed.key_maps"}})
    assert "Toy t2i" in " ".join(run_with_package(package, "export", "--help").stdout.split())
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=8, block_out_channels=(8,), down_block_types=("DownBlock2D",),
                        up_block_types=("UpBlock2D",), layers_per_block=1, norm_num_groups=4)
    release = tmp_path / "toy-release.safetensors"
    save_file({f"toy_unet.{name}": tensor.contiguous() for name, tensor in model.state_dict().items()}, release)
    done = run_with_package(package, release, tmp_path / "out", "--dtype", "fp32")
    assert done.returncode == 0, done.stderr
    loaded = UNet2DModel.from_pretrained(tmp_path / "out")
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


def test_a_shapes_module_lacking_a_hook_is_refused_when_the_family_loads(toy_root, cli, tmp_path):
    toy_root("toyfamily_broken", TOY_SHAPES.replace("def layout_variant", "def not_layout_variant"))
    with pytest.raises(family_module.FamilyError) as refused:
        family_module.families()
    message = str(refused.value)
    assert "\n" not in message
    assert "family toy" in message and "layout_variant()" in message
    save_file({"conv_in.weight": torch.zeros(8, 3, 3, 3)}, tmp_path / "weights.safetensors")
    result = cli(tmp_path / "weights.safetensors", tmp_path / "out")
    assert result.exit_code == 2 and result.error_lines == [f"cogexport: error: key maps: {message}"]


def test_every_original_writer_named_by_the_families_exists():
    # "" too: a model the release keeps in the transformer's file, asked for alone, is written as one file of its own
    assert set(ORIGINAL_WRITERS) == set(family_module.ORIGINAL_WRITERS)
    for family in family_module.families():
        for spec in family.components.values():
            assert all(layout.writer in family_module.ORIGINAL_WRITERS for layout in spec.originals)


def test_help_is_made_from_the_families(cli):
    help_text = cli("export", "--help").stdout
    # click wraps the lines: a name may break across them at a space or after a hyphen (Wan-Animate-2)
    flowing = "".join(help_text.split())
    for family in family_module.families():
        assert "".join(family.name.split()) in flowing
        assert "|".join(family.tasks) in help_text.replace("\n", "").replace(" ", "")


def test_no_family_name_in_code_outside_models_and_key_maps():
    """Family names may appear in comments and docstrings as examples, never in the code or its strings."""
    import ast

    names = {family.name for family in family_module.families()} | {family.key for family in family_module.families()}
    package = Path(family_module.__file__).resolve().parents[1]
    found = []
    for path in package.rglob("*.py"):
        if path.parent.name == "models" or "key_maps" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docstrings else getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(text, str) and any(re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
                                             for name in names):
                found.append(f"{path.relative_to(package)}:{node.lineno}: {text[:60]!r}")
    assert not found, "\n".join(found)
