"""Quantized outputs: GGML block quantizers (tensor in, bytes out) and the per-family quantization policy."""

from .formats import WRITABLE, GgmlType, ggml_type, ggml_type_of
from .rows import quantize_tensor

__all__ = ["WRITABLE", "GgmlType", "ggml_type", "ggml_type_of", "quantize_tensor"]
