"""The main job, one room per step: what the user asked (options.py), what is read (inputs.py), the models to write
(parts.py) or the adapter job (adapters.py), every file of the output (diffusers_layout.py, original_writers.py,
cards.py), and the staged write (publish.py); ``export`` (to Diffusers) and ``export_original`` (``--to original``)
on top."""

from .options import ExportOptions, check_options, command_line
from .result import ExportResult
from .to_diffusers import export
from .to_original import export_original
from .to_quantized import export_gguf

__all__ = ["ExportOptions", "ExportResult", "check_options", "command_line", "export", "export_gguf", "export_original"]
