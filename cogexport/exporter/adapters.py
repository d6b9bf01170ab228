"""The adapter job: a LoRA run's adapter (one per expert) read from whatever layout its trainer wrote, checked
against the model it is for, and planned as the adapter file(s) of --lora-format's layout with the files its loader
reads beside them and a model card.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..checkpoint.readers import info_dict
from ..errors import CogExportError
from ..lora import AdapterOutput, LoraAdapter, check_fits, plan_output, read_adapter
from ..lora.formats import writable_format
from ..models.target_choice import TransformerChoice, choose_transformer
from ..precision import AsRead, PrecisionPolicy, adapter_part, describe_written
from ..write.folder_plan import FolderPlan, TensorFile, TextFile
from .adapter_component import adapter_task_options, written_component
from .cards import AdapterCardFacts, adapter_card
from .experts import assign_experts
from .inputs import ExportInputs
from .options import ExportOptions, lora_mode
from .output_formats import OutputFormat
from .parts import adapter_recognised, base_transformer_folder, family_hint, model_family, target_request
from .result import ExportResult

DEFAULT_LORA_FORMAT = "diffusers"


def read_adapters(inputs: ExportInputs, options: ExportOptions) -> dict[str, LoraAdapter]:
    """The adapter of each expert (one, for an ordinary run), of the family --base or --model-name names."""
    hint = family_hint(inputs.base, options)
    adapters = {}
    for component, source in inputs.sources.items():
        adapters[component] = read_adapter(source, inputs.where_of(component), options.lora_alpha,
                                           inputs.search_folders(component), source.info.header_metadata, hint,
                                           inputs.base.counts(component) if inputs.base else None)
    families = {adapter.family.name for adapter in adapters.values()}
    if len(families) > 1:
        raise CogExportError(f"{inputs.where}: the experts' adapters are of different families "
                             f"({', '.join(sorted(families))})")
    family = next(iter(adapters.values())).family
    if hint is not None and hint.key != family.key and family.key not in hint.extends:
        given = f"--base {inputs.base.path}" if inputs.base else f"--model-name {options.model_name}"
        raise CogExportError(f"{inputs.where} is a {family.name} LoRA, but {given} is a {hint.name} model; give the "
                             f"{family.name} model it was trained on")
    return adapters


def adapters_to_fuse(inputs: ExportInputs, options: ExportOptions) -> dict[str, LoraAdapter]:
    """For a format that writes full models: a LoRA run's adapter of each expert, to fuse into it (--lora adapter was
    refused with the options); {} for full weights."""
    fused = replace(options, lora=options.lora or ("fuse" if inputs.lora_marker else None), component=None)
    mode = lora_mode(fused, inputs.lora_marker, inputs.where)
    return assign_experts(read_adapters(inputs, options), inputs, options) if mode else {}


def lora_summary(adapters: dict[str, LoraAdapter], inputs: ExportInputs) -> dict:
    summary = next(iter(adapters.values())).summary()
    if len(adapters) > 1 or inputs.experts:
        folders = inputs.expert_folders or {}
        summary["experts"] = {folders.get(name, name): adapter.summary() for name, adapter in adapters.items()}
    return summary


@dataclass
class _PlannedAdapter:
    subfolder: str  # the release's expert subfolder, "" for one model
    output: AdapterOutput
    chosen: TransformerChoice | None  # the model it is for, when known
    component: str  # the pipeline component it is written for (its task's transformer folder)


def adapter_precision(options: ExportOptions) -> PrecisionPolicy | AsRead:
    """An adapter keeps the dtype it was trained in (as read), unless --dtype asks for another: then every floating
    tensor is cast to it, but the --keep-fp32 globs."""
    return AsRead() if options.dtype is None else PrecisionPolicy.build(options.dtype, (), options.keep_fp32)


def written_precision(folder: FolderPlan) -> str:
    """The dtypes of the adapter files as written (what the summary and the card say), by the kind of tensor."""
    tensors = {name: tensor for planned in folder.files if isinstance(planned, TensorFile)
               for name, tensor in planned.tensors.items()}
    return describe_written(tensors, adapter_part)


def _adapter_target(adapter: LoraAdapter, inputs: ExportInputs, options: ExportOptions,
                    component: str) -> tuple[TransformerChoice | None, dict]:
    """The model the adapter is for, when known (--base, --model-name, or the base weights the run saved), and the
    schema its names and shapes are checked against (else: the family's layout, names only)."""
    where, base = inputs.where_of(component), inputs.base
    recognised = adapter_recognised(adapter)
    if base is None and not options.model_name and recognised is not None and recognised.variant is None:
        # A custom size: an adapter needs only its modules' names and shapes, which the run's own weights give.
        schema = adapter.base_shapes()
        check_fits(adapter, schema, where)
        return None, schema
    family = model_family(adapter, base, options)
    held_in = base_transformer_folder(component, family, options.model_type, inputs.base)
    if (base is not None and base.config(held_in)) or recognised is not None or options.model_name:
        request = target_request(options, base, held_in, inputs.expert_names)
        chosen = choose_transformer(recognised, family, request, where)
        check_fits(adapter, chosen.target.schema, where)
        return chosen, chosen.target.schema
    return None, adapter.names


def _plan_adapters(adapters: dict[str, LoraAdapter], inputs: ExportInputs, options: ExportOptions,
                   format_name: str) -> dict[str, _PlannedAdapter]:
    planned = {}
    for component, adapter in adapters.items():
        told = adapter_task_options(adapter, options, inputs.where_of(component))
        chosen, schema = _adapter_target(adapter, inputs, told, component)
        base_model = options.base_model or (chosen.variant.hub_id if chosen and chosen.published else None)
        written = written_component(adapter, told)
        output = plan_output(adapter, format_name, schema, adapter_precision(options), inputs.where_of(component),
                             base_model, written)
        planned[component] = _PlannedAdapter(inputs.expert_folders.get(component, ""), output, chosen, written)
    return planned


def _in(subfolder: str, name: str) -> str:
    return f"{subfolder}/{name}" if subfolder else name


def _card_facts(adapters: dict[str, LoraAdapter], planned: dict[str, _PlannedAdapter], files: dict[str, str],
                options: ExportOptions) -> AdapterCardFacts:
    """What the card says the adapter is for: the model --base, --model-name or the run's weights name, else the
    family."""
    first, chosen = next(iter(adapters.values())), next(iter(planned.values())).chosen
    published = chosen is not None and chosen.published
    return AdapterCardFacts(chosen.family if chosen else first.family, chosen.label if chosen else first.family.name,
                            chosen.variant if chosen else None,
                            options.base_model or (chosen.variant.hub_id if published else None),
                            {each.subfolder: adapters[component] for component, each in planned.items()}, files)


def plan_adapter_export(inputs: ExportInputs, adapters: dict[str, LoraAdapter], options: ExportOptions,
                        output: str) -> tuple[FolderPlan, ExportResult]:
    """The adapter file (one per expert, in the release's expert subfolders) in --lora-format's layout, the files
    its loader reads beside it, and a model card."""
    lora_format = writable_format(options.lora_format or DEFAULT_LORA_FORMAT)
    # one adapter trained across every expert goes into each: written once
    first_of = {id(adapter): component for component, adapter in reversed(adapters.items())}
    planned = _plan_adapters({c: a for c, a in adapters.items() if first_of[id(a)] == c}, inputs, options,
                             lora_format.name)
    folder = FolderPlan()
    for each in planned.values():
        folder.add(TensorFile(_in(each.subfolder, each.output.file), each.output.tensors,
                              metadata=each.output.metadata),
                   *(TextFile(_in(each.subfolder, name), text) for name, text in each.output.side_files.items()))
    files = {}
    for component, adapter in adapters.items():
        each = planned[first_of[id(adapter)]]
        # the card loads each into its pipeline component: an expert's own (transformer_2), else its task's
        files[each.component if component == "transformer" else component] = _in(each.subfolder, each.output.file)
    facts = _card_facts(adapters, planned, files, options)
    written = written_precision(folder)
    folder.add(TextFile("README.md", adapter_card(facts, lora_format, options, inputs.source, written)))
    folder.check()
    first = next(iter(adapters.values()))
    result = ExportResult(output, "lora adapter", facts.label, folder.paths, folder.tensors, folder.total_bytes,
                          written, family=first.family.name,
                          lora={**lora_summary(adapters, inputs), "written_as": lora_format.name},
                          source=info_dict(inputs.source.info),
                          notes=[*inputs.source.info.notes, *(n for a in adapters.values() for n in a.warnings)])
    return folder, result


def _verify(output, request):
    from ..verify_adapter import verify_adapter_folder

    return verify_adapter_folder(output, request)


FORMAT = OutputFormat(
    name="lora",
    title="a LoRA adapter (--lora-format's layout), what --to diffusers writes for a LoRA run unless fused",
    writes="adapter",
    within="diffusers",
    takes=frozenset({"lora_format", "push_to_hub", "private"}),
    verify=_verify,
)
