"""What an export reports: the folder written, what it holds, and what the user should know."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ExportResult:
    output: str
    component: str
    model: str
    files: list[str]
    tensors: int
    total_bytes: int
    precision: str
    family: str = ""
    dropped: dict[str, str] = field(default_factory=dict)
    ignored: int = 0
    linked: dict[str, str] = field(default_factory=dict)
    lora: dict | None = None
    notes: list[str] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    pushed_to: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)
