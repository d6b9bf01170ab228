"""A read-only file view of one byte range of a bigger file, for archives stored inside other files.

A DCP ``.distcp`` file packs one complete torch.save (zip) archive per tensor chunk back to back; ``zipfile`` looks
for an archive's directory at the end of what it is given, so each chunk is opened through a window that ends where
the chunk ends. Positions inside the window count from the chunk's first byte.
"""

from __future__ import annotations

import errno
import io
import os


class ByteWindow(io.RawIOBase):
    """Bytes ``offset .. offset + length`` of an open binary file, seekable like a file of ``length`` bytes."""

    def __init__(self, handle, offset: int, length: int) -> None:
        super().__init__()
        self._fd, self._offset, self._length, self._position = handle.fileno(), offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._length}[whence]
        if base + position < 0:  # as a file does: zipfile takes an OSError here for "no zip64 record"
            raise OSError(errno.EINVAL, "negative seek position")
        self._position = base + position
        return self._position

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self._length - self._position))
        data = os.pread(self._fd, count, self._offset + self._position) if count else b""
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)
