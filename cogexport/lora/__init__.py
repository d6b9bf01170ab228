"""LoRA adapters in every trainer's layout: read (read.py), held in Diffusers module names with each module's
strength (adapter.py), renamed module by module with a family's key maps (modules.py), written in the layout a
loader wants (write.py) or fused into the model (fuse.py).

Formats are grammars shared by every family (formats.py); what differs between families is data: one table per
family and format in key_maps/<family>/*_lora.toml (tables.py) naming the key map that names its modules.
"""

from .adapter import LoraAdapter, LoraModule
from .formats import WRITABLE
from .fuse import base_weights, check_fits, plan_fused
from .read import read_adapter
from .write import AdapterOutput, plan_output

__all__ = ["LoraAdapter", "LoraModule", "WRITABLE", "AdapterOutput", "base_weights", "check_fits", "plan_fused",
           "plan_output", "read_adapter"]
