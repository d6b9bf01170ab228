"""The main job, one room per step: what the user asked (options.py), what is read (inputs.py), the models to write
(parts.py) or the adapter job (adapters.py), every file of the output (diffusers_layout.py, original_writers.py,
cards.py), and the staged write (publish.py); on top, one module per output format, each declaring its
``OutputFormat`` (output_formats.py is the registry): ``export`` (to Diffusers), ``export_original`` (``--to
original``), ``export_gguf`` and ``export_comfyui``, and the LoRA adapter (adapters.py)."""

from .options import ExportOptions, check_options, command_line
from .output_formats import OutputFormat, output_format, output_formats, register_output_format
from .result import ExportResult
from .to_comfyui import export_comfyui
from .to_diffusers import export
from .to_gguf import export_gguf
from .to_original import export_original

__all__ = ["ExportOptions", "ExportResult", "OutputFormat", "check_options", "command_line", "export", "export_comfyui",
           "export_gguf", "export_original", "output_format", "output_formats", "register_output_format"]
