"""The README.md model card of an exported folder: its metadata block written by huggingface_hub's ModelCardData.

Its metadata is what the Hub reads (library, base model and how this model relates to it, pipeline tag);
its text says how the folder was made: the command, the source checkpoint and step, and the dtype policy. The card is
the text ModelCard(...) would give back (it only parses the block and writes it again the same way); ModelCard
itself is not imported, since it brings in huggingface_hub's Hub client, about 0.1 s of every export's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from huggingface_hub.repocard_data import ModelCardData


@dataclass
class CardFacts:
    title: str
    base_model: str | None
    relation: str  # "finetune" or "adapter"
    pipeline_tag: str
    pipeline_class: str
    command: str
    source: str  # what was read, e.g. "SAT checkpoint runs/x, tag 1000 (iteration 1000)"
    precision: str
    details: list[str] = field(default_factory=list)
    usage: str = ""
    tags: tuple[str, ...] = ()
    layout: str = "Diffusers"  # the format the folder's files are in


def model_card(facts: CardFacts) -> str:
    data = ModelCardData(library_name="diffusers", base_model=facts.base_model, pipeline_tag=facts.pipeline_tag,
                         tags=[*facts.tags, "cogexport"], base_model_relation=facts.relation)
    base = f"[{facts.base_model}](https://huggingface.co/{facts.base_model})" if facts.base_model else "its base model"
    lines = [
        f"# {facts.title}",
        "",
        f"A {'fine-tune' if facts.relation == 'finetune' else 'LoRA adapter'} of {base}, exported to "
        f"{facts.layout} format by cogexport.",
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
