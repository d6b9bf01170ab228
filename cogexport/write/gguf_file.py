"""Write a GGUF file from a checked plan, one tensor at a time, with llama.cpp's own ``gguf`` writer for the container.

The header (every tensor's name, type, shape and offset) depends only on the plan, so it is written first; then each
tensor is loaded, quantized and written, and dropped before the next: memory holds one tensor and its bytes. Written
as part of a folder (``GgufFile``), the tensors are quantized ahead by the folder's worker threads (torch's
operations release the GIL: quantizing is compute, one core a tensor), each handed to the writer in the file's order,
while the job's reading thread reads the next tensors' values (read_ahead.py): memory holds one tensor being
quantized per worker, two read ahead, and quantized bytes within the feed's budget. The key-value data
is what ComfyUI-GGUF's ``tools/convert.py`` and ``llama-quantize`` write for an image model:
``general.architecture``, ``general.quantization_version`` and ``general.file_type``; a tensor stored in another
shape than its own gets ``comfy.gguf.orig_shape.<name>`` (an array of int32), which ComfyUI-GGUF's loader restores;
the plan's string keys follow (LTX-2's release ``config``, which ComfyUI-GGUF hands to ComfyUI's model detection).
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch

from ..finite_values import NonfiniteValuesError
from ..lazy import LazyTensor
from ..quantize import quantize_tensor
from ..quantize.policy import GgufPlan, PlannedTensor
from .file_parts import FileLayout, placed_one_after_another, write_run
from .io_engine import TensorFeed
from .read_ahead import ReadAhead

if TYPE_CHECKING:
    import gguf

    from ..quantize.processes import QuantizingProcesses
    from ..quantize.threads import QuantizingThreads

    QuantizingPool = QuantizingProcesses | QuantizingThreads

ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."


def build_writer(plan: GgufPlan) -> gguf.GGUFWriter:
    """A GGUFWriter holding the plan's key-value data and tensor infos (nothing written yet)."""
    import gguf  # imported by GGUF jobs only: 20 ms of every other start

    writer = gguf.GGUFWriter(path=None, arch=plan.architecture)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(plan.preset.file_type)
    for key, value in plan.strings.items():
        writer.add_string(key, value)
    for tensor in plan.tensors:
        if tensor.stored_shape != tensor.shape:
            writer.add_array(ORIG_SHAPE_KEY + tensor.name, [int(d) for d in tensor.shape])
        writer.add_tensor_info(tensor.name, tensor.stored_shape, np.dtype(np.float32), tensor.nbytes,
                               raw_dtype=tensor.type.code)
    return writer


def gguf_layout(plan: GgufPlan) -> FileLayout:
    """Where everything lies in the file: the header, key-value data and tensor infos as llama.cpp's own writer
    writes them (into a scratch file: it writes only to files), then each tensor's data at the next multiple of the
    file's alignment, padded with zeros to the next one, as that writer pads them."""
    writer = build_writer(plan)
    with tempfile.TemporaryDirectory(prefix="cogexport-gguf-header-") as scratch:
        header_file = Path(scratch) / "header.gguf"
        try:
            writer.write_header_to_file(path=header_file)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
        finally:
            writer.close()
        header = header_file.read_bytes()
    return placed_one_after_another(header, [(tensor.name, tensor.nbytes) for tensor in plan.tensors],
                                    writer.data_alignment)


def stored_bytes(tensor: PlannedTensor, processes: QuantizingPool | None = None) -> torch.Tensor:
    """The planned tensor loaded and quantized: its bytes in the file (flat uint8), by ``processes`` where given
    (pieces of a big tensor in worker threads or processes), else here. NaN or infinite values are the quantizer's to
    count, as it checks every value anyway (``NonfiniteValuesError``: the writer's watch decides)."""
    def load() -> torch.Tensor:
        return tensor.source.load().reshape(tensor.stored_shape)

    try:
        if processes is None:
            return quantize_tensor(load(), tensor.type.name, tensor.name).reshape(-1)
        return processes.quantize(load, tensor.type.name, tensor.name).reshape(-1)
    except NonfiniteValuesError as met:
        if met.write_anyway is not None:
            write_anyway = met.write_anyway
            met.write_anyway = lambda: write_anyway().reshape(-1)
        raise


def quantized(tensor: PlannedTensor, processes: QuantizingPool | None = None) -> LazyTensor:
    """The planned tensor's bytes in the file, quantized when loaded (``stored_bytes``): what a feed loads ahead."""
    return LazyTensor(torch.Size([tensor.nbytes]), torch.uint8, lambda: stored_bytes(tensor, processes),
                      f"{tensor.name} as {tensor.type.name}")


def write_gguf(path: Path, plan: GgufPlan, on_tensor: Callable[[str, int], None] | None = None,
               payloads: Iterator[torch.Tensor] | None = None) -> int:
    """Stream ``plan`` into the GGUF file ``path``; returns the bytes of tensor data written. ``payloads``: each
    tensor's bytes in the file's order (``quantized`` loaded), else each is quantized here in turn.

    ``on_tensor(name, nbytes)`` is called after each tensor (progress bars). On any error the partial file is
    removed and the error raised (a bad value names its tensor: a ``CogExportError``).
    """
    path = Path(path)
    layout = gguf_layout(plan)
    try:
        with ExitStack() as stack:
            if payloads is None:
                payloads = iter(stack.enter_context(TensorFeed([quantized(tensor) for tensor in plan.tensors])))
            return write_run(path, layout, range(len(layout.tensors)), payloads, whole=True, on_tensor=on_tensor)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@dataclass
class GgufFile:
    """A GGUF file of an output folder (see folder_plan.py): its path in the folder and its checked plan."""

    path: str
    plan: GgufPlan
    # where big tensors are quantized (None: in the writing thread); how, not what: left out of the plan's digest
    processes: QuantizingPool | None = field(default=None, metadata={"how": True})
    # the job's reading thread: the tensors after those being quantized are read meanwhile (None: each is read
    # where it is quantized)
    reading: ReadAhead | None = field(default=None, metadata={"how": True})

    @property
    def nbytes(self) -> int:
        return self.plan.nbytes

    @property
    def tensor_count(self) -> int:
        return len(self.plan.tensors)

    def write_order(self) -> list[LazyTensor]:
        """The tensors' bytes in the order they are written (the payloads ``write`` takes)."""
        sources = (self.reading or ReadAhead(0)).sequence([tensor.source for tensor in self.plan.tensors])
        return [quantized(replace(tensor, source=source), self.processes)
                for tensor, source in zip(self.plan.tensors, sources)]

    def write_names(self) -> list[str]:
        return [tensor.name for tensor in self.plan.tensors]

    def layout(self) -> FileLayout:
        """Where the header and each tensor lie in the file (a torchrun job's ranks may write runs of it)."""
        return gguf_layout(self.plan)

    def write(self, root: Path, on_tensor: Callable[[str, int], None] | None,
              payloads: Iterator[torch.Tensor] | None = None) -> None:
        target = root / self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(target, self.plan, on_tensor, payloads)
