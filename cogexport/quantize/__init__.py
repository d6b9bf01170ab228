"""Quantized outputs: GGML block quantizers (tensor in, bytes out), the per-family quantization policy and the plan of a
GGUF file, and the checks ``verify`` runs on quantized files."""

from .formats import WRITABLE, GgmlType, ggml_type, ggml_type_of
from .policy import PRESETS, GgufPlan, PlannedTensor, Preset, QuantizationPolicy, plan_gguf, preset_named, \
    quantizable_families, quantization_policy
from .rows import quantize_tensor

__all__ = ["WRITABLE", "GgmlType", "ggml_type", "ggml_type_of", "quantize_tensor", "PRESETS", "GgufPlan",
           "PlannedTensor", "Preset", "QuantizationPolicy", "plan_gguf", "preset_named", "quantizable_families",
           "quantization_policy"]
