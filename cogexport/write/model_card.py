"""The README.md model card of an exported folder: its metadata block written by huggingface_hub's ModelCardData.

Its metadata is what the Hub reads (library, base model and how this model relates to it, pipeline tag);
its text says how the folder was made: the command, the source checkpoint and step, and the dtype policy. The card is
the text ModelCard(...) would give back (it only parses the block and writes it again the same way); ModelCard
itself is not imported, since it brings in huggingface_hub's Hub client, about 0.1 s of every export's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from huggingface_hub.repocard_data import ModelCardData

# What the output is made of, as the card says it; each with the Hub's base_model_relation (which allows adapter,
# merge, quantized and finetune only, and none for a plain conversion: the Hub must not list a release's own weights
# as a fine-tune of it).
FINETUNE, CONVERSION, ADAPTER, QUANTIZED_FINETUNE, QUANTIZED_CONVERSION = (
    "fine-tune", "conversion", "adapter", "quantized fine-tune", "quantized conversion")
_RELATIONS = {FINETUNE: "finetune", CONVERSION: None, ADAPTER: "adapter", QUANTIZED_FINETUNE: "finetune",
              QUANTIZED_CONVERSION: "quantized"}
_INTRO = {FINETUNE: "A fine-tune of {base}", CONVERSION: "The weights of {base}",
          ADAPTER: "A LoRA adapter for {base}", QUANTIZED_FINETUNE: "A quantized fine-tune of {base}",
          QUANTIZED_CONVERSION: "A quantized copy of {base}"}
_INTRO_NO_BASE = {CONVERSION: "A model", QUANTIZED_CONVERSION: "A quantized model"}  # (of no published model)
# said on the card of an output whose source records no training: cogexport cannot tell a release from a fine-tune
# saved as plain weights, so it claims no training
_NO_TRAINING = ("The source records no training step, so this card claims no fine-tune; if these weights were trained, "
                "add `base_model_relation: finetune` to the metadata.")


@dataclass
class CardFacts:
    title: str
    base_model: str | None
    made: str  # one of FINETUNE, CONVERSION, ADAPTER, QUANTIZED_FINETUNE, QUANTIZED_CONVERSION
    pipeline_tag: str | None
    command: str
    source: str  # what was read, e.g. "SAT checkpoint runs/x, tag 1000 (iteration 1000)"
    precision: str
    details: list[str] = field(default_factory=list)
    usage: str = ""
    tags: tuple[str, ...] = ()
    layout: str = "Diffusers"  # the format the folder's files are in
    library: str | None = "diffusers"  # what loads them, for the Hub (None: the family's own code, ComfyUI)

    @property
    def relation(self) -> str | None:
        """The Hub's base_model_relation: only with a base model, and only where it holds."""
        return _RELATIONS[self.made] if self.base_model else None


def model_card(facts: CardFacts) -> str:
    data = ModelCardData(library_name=facts.library, base_model=facts.base_model, pipeline_tag=facts.pipeline_tag,
                         tags=[*facts.tags, "cogexport"], base_model_relation=facts.relation)
    base = f"[{facts.base_model}](https://huggingface.co/{facts.base_model})" if facts.base_model else "its base model"
    intro = _INTRO[facts.made] if facts.base_model else _INTRO_NO_BASE.get(facts.made, _INTRO[facts.made])
    untrained = [_NO_TRAINING] if facts.made in (CONVERSION, QUANTIZED_CONVERSION) else []
    lines = [
        f"# {facts.title}",
        "",
        f"{intro.format(base=base)}, exported to {facts.layout} format by cogexport.",
        *(line for note in untrained for line in ("", note)),
        "",
        "## Use",
        "",
        "```python",
        facts.usage.strip(),
        "```",
        "",
        "## How this folder was made",
        "",
        f"- Command: `{facts.command}`",
        f"- Source: {facts.source}",
        f"- Precision: {facts.precision}",
        *[f"- {line}" for line in facts.details],
        "",
    ]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)
