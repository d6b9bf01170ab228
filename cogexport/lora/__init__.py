"""LoRA adapters in every trainer's layout, LyCORIS's LoKr and LoHa included: read (read.py), held in Diffusers
module names with each module's strength (adapter.py; LyCORIS's factor math in lycoris.py), renamed module by module
with a family's key maps (modules.py), written in the layout a loader wants (write.py) or fused into the model
(fuse.py); which expert of a two-expert model an adapter is for (experts.py).

Formats are grammars shared by every family, each carrying what it knows and its tables' defaults (formats.py); what
differs between families is data: the layouts each family lists in its family.toml ([[lora.layout]]: a format and the
key map that names its modules, and only what differs from the format's defaults), read into tables by tables.py.
"""

from ..keymap.table_fields import LoraLayout
from .adapter import LoraAdapter, LoraModule
from .formats import FORMATS, WRITABLE, LoraFormat, register_format, writable_format, writable_formats
from .fuse import base_weights, check_fits, plan_fused
from .read import read_adapter
from .write import AdapterOutput, plan_output

__all__ = ["FORMATS", "LoraAdapter", "LoraFormat", "LoraLayout", "LoraModule", "WRITABLE", "AdapterOutput",
           "base_weights", "check_fits", "plan_fused", "plan_output", "read_adapter", "register_format",
           "writable_format", "writable_formats"]
