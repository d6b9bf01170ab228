"""Output formats are a registry (cogexport/exporter/output_formats.py): --to's choices and help, the options each
format takes, which job runs, and how verify and inspect treat a format's files all come from its declaration. These
tests hold the command line to the registry, check the older spelling of ComfyUI's fp8 (--to original --dtype fp8)
writes the same bytes, and add a format from another package through the entry-point group, as pip would install
it: it appears in --help, exports, and is refused an option it does not take, with no line of cogexport changed."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_refused
from outside_package import outside_package, run_with_package
from safetensors.torch import load_file
from wan_fixtures import tiny_wan_pipeline

from cogexport.exporter.output_formats import (FORMAT_OPTIONS, FormatDeclarationError, OutputFormat, output_formats,
                                               to_choices)

TORCH_FILE_FORMAT = '''
"""A toy output format: the transformer in Diffusers names as one torch.save state dict."""
from dataclasses import replace
from pathlib import Path

from cogexport.exporter import ExportOptions, ExportResult, OutputFormat
from cogexport.exporter.inputs import open_inputs
from cogexport.exporter.options import checked_format
from cogexport.exporter.publish import publish
from cogexport.exporter.to_diffusers import plan_transformers
from cogexport.write.folder_plan import FolderPlan, TensorFile


def export_torch_file(checkpoint, output, options=None, **overrides):
    _, options = checked_format(replace(options or ExportOptions(), **overrides), "torchfile")
    with open_inputs(checkpoint, options) as inputs:
        parts = plan_transformers(inputs, options)
        folder = FolderPlan()
        for part in parts:
            folder.add(TensorFile(f"{part.component}.pt", part.tensors, container="torch"))
        folder.check()
        result = ExportResult(str(output), "transformer", parts[0].label, folder.written_paths, folder.tensors,
                              folder.total_bytes, parts[0].policy.describe(), family=parts[0].family.name)
        return publish(folder, result, Path(output), inputs, options)


FORMAT = OutputFormat(name="torchfile", title="the transformer as one torch.save state dict", writes="transformer",
                      export=export_torch_file)
'''


def model_folder():
    return tiny_wan_pipeline("t2v") / "transformer"


def test_the_command_lines_choices_and_help_are_the_registrys(cli):
    help_text = " ".join(cli("export", "--help").stdout.split())
    assert f"--to [{'|'.join(to_choices())}]" in help_text
    assert set(to_choices()) == {"diffusers", "original", "gguf", "comfyui"}
    for fmt in output_formats():
        if fmt.selectable:
            assert f"{fmt.name}: {fmt.title}" in help_text, fmt.name
        if fmt.quantizations:
            assert f"--to {fmt.name}: {', '.join(fmt.quantizations)}" in help_text, fmt.name


REFUSED = [(fmt.name, option) for fmt in output_formats() if fmt.selectable for option in FORMAT_OPTIONS
           if option not in set().union(*(each.takes for each in output_formats() if fmt.name in (each.name,
                                                                                                  each.within)))]
VALUES = {"vae": ["--vae", "x"], "variant": ["--variant", "fp16"], "push_to_hub": ["--push-to-hub", "me/x"],
          "private": ["--private"], "quant": ["--quant", "Q8_0"], "fp8_layout": ["--fp8-layout", "legacy"],
          "lora_format": ["--lora-format", "comfyui"]}
REQUIRED = {"gguf": ["--quant", "Q8_0"], "comfyui": ["--quant", "fp8"]}


@pytest.mark.parametrize("to, option", REFUSED, ids=[f"{to}-{option}" for to, option in REFUSED])
def test_an_option_a_format_does_not_take_is_refused_naming_the_formats_that_do(to, option, cli, tmp_path):
    model = model_folder()
    given = [*REQUIRED.get(to, []), *VALUES[option]] if option != "quant" else VALUES[option]
    owners = dict.fromkeys(each.within or each.name for each in output_formats() if option in each.takes)
    line = assert_refused(cli, tmp_path, [model, tmp_path / "out", "--to", to, *given],
                          FORMAT_OPTIONS[option].flag, f"--to {to} writes", inputs=[model])
    assert line.endswith(" or ".join(f"--to {owner}" for owner in owners)) or not owners, line


def test_every_option_of_format_options_is_taken_by_some_format():
    assert set(FORMAT_OPTIONS) == set().union(*(fmt.takes for fmt in output_formats()))


def test_the_older_spelling_of_scaled_fp8_writes_the_same_file(cli, tmp_path):
    model = model_folder()
    assert cli(model, tmp_path / "old", "--to", "original", "--dtype", "fp8_e5m2").exit_code == 0
    result = cli(model, tmp_path / "new", "--to", "comfyui", "--quant", "fp8_e5m2", "--json")
    assert result.exit_code == 0, result.stderr
    (old,) = (tmp_path / "old").glob("*.safetensors")
    (new,) = (tmp_path / "new").glob("*.safetensors")
    assert old.name == new.name and old.read_bytes() == new.read_bytes()
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--to", "original", "--dtype", "fp8", "--quant", "fp8"],
                   "give --to comfyui --quant fp8", inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--to", "comfyui"], "--to comfyui needs --quant (one of "
                   "fp8, fp8_e5m2, nvfp4, mxfp8, int8)", inputs=[model])


def test_a_format_of_another_package_is_registered_by_its_entry_point(tmp_path):
    package = outside_package(tmp_path / "site", "torchfile-format", {"torchfile_format.py": TORCH_FILE_FORMAT},
                              {"cogexport.output_formats": {"torchfile": "torchfile_format:FORMAT"}})
    help_text = " ".join(run_with_package(package, "export", "--help").stdout.split())
    assert "--to [diffusers|original|gguf|comfyui|torchfile]" in help_text
    assert "torchfile: the transformer as one torch.save state dict" in help_text
    model = model_folder()
    done = run_with_package(package, model, tmp_path / "out", "--to", "torchfile", "--dtype", "fp32")
    assert done.returncode == 0, done.stderr
    written = torch.load(tmp_path / "out" / "transformer.pt", weights_only=True)
    (weights,) = model.glob("*.safetensors")
    truth = load_file(weights)  # what Diffusers' save_pretrained wrote: the model in Diffusers names
    assert written.keys() == truth.keys() and all(torch.equal(written[name], truth[name]) for name in truth)
    refused = run_with_package(package, model, tmp_path / "o2", "--to", "torchfile", "--quant", "Q8_0")
    assert refused.returncode == 2 and not (tmp_path / "o2").exists()
    assert refused.stderr.strip().splitlines() == ["cogexport: error: --quant is the quantization of a quantized "
                                                   "file; --to torchfile writes the transformer as one torch.save "
                                                   "state dict: give --to gguf or --to comfyui"]


def test_a_malformed_format_of_another_package_is_refused_in_one_line(tmp_path):
    broken = TORCH_FILE_FORMAT.replace('writes="transformer"', 'writes="everything"')
    package = outside_package(tmp_path / "site", "broken-format", {"broken_format.py": broken},
                              {"cogexport.output_formats": {"broken": "broken_format:FORMAT"}})
    done = run_with_package(package, model_folder(), tmp_path / "out")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("cogexport: error: output formats: cogexport.output_formats entry point broken = "
                           "broken_format:FORMAT cannot be loaded"), line
    assert "writes must be one of pipeline, model, transformer, adapter" in line


def _job(checkpoint, output, options):
    raise AssertionError("never run")


@pytest.mark.parametrize("declaration, complaint", [
    (dict(name="a b", writes="model", export=_job), "needs a name without spaces"),
    (dict(name="x", writes="model"), "gives either its job"),
    (dict(name="x", writes="model", export=_job, within="diffusers"), "gives either its job"),
    (dict(name="x", writes="model", export=_job, takes=frozenset({"colour"})), "takes unknown option(s) colour"),
    (dict(name="x", writes="model", export=_job, quantizations=("Q1",)), "takes quant exactly when"),
    (dict(name="x", writes="model", export=_job, inspects_folder=lambda path, check: None), "go together"),
])
def test_a_declaration_lacking_what_the_registry_needs_is_refused(declaration, complaint):
    with pytest.raises(FormatDeclarationError, match="output format") as refused:
        OutputFormat(title="a toy", **declaration)
    assert complaint in str(refused.value)


def test_the_guide_names_every_field_option_and_built_in_format():
    """docs/adding-an-output-format.md cannot go stale: its field table is OutputFormat's fields, its option table
    FORMAT_OPTIONS, its first table every built-in format's module, and the toy job it shows is the tested one."""
    import dataclasses
    import re
    from pathlib import Path

    from cogexport.exporter.output_formats import BUILT_IN

    guide = (Path(__file__).resolve().parents[1] / "docs" / "adding-an-output-format.md").read_text()
    table = re.search(r"\| field \| what it is \|\n\|---\|---\|\n((?:\|.*\n)+)", guide).group(1)
    assert re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE) == [f.name for f in dataclasses.fields(OutputFormat)]
    options = re.search(r"\| option \| flag \| taken by \|\n\|---\|---\|---\|\n((?:\|.*\n)+)", guide).group(1)
    assert sorted(re.findall(r"`(\w+)`", "".join(row.split("|")[1] for row in options.splitlines()))) == sorted(
        FORMAT_OPTIONS)
    for module in BUILT_IN:
        assert f"(../{module.replace('.', '/')}.py)" in guide, module
    job = TORCH_FILE_FORMAT[TORCH_FILE_FORMAT.index("def export_torch_file"):TORCH_FILE_FORMAT.index("\n\n\nFORMAT")]
    assert job in guide
