"""The device arena: one allocation sized by the MemoryPlan, every tensor a view of it.

Views are made once, by slicing the uint8 buffer and reinterpreting it
(``buffer[off:off + n].view(dtype).reshape(shape)``): zero-copy, and the one form that
also works in the CUDA simulator. Offsets must be 256-byte aligned, like the planner's.
"""
import numpy as np
from numba import cuda

from .elementwise import fill_zero
from .graph import synchronize
from .tape import Immediate

ALIGNMENT = 256


class DeviceArena:
    """``DeviceArena(nbytes)``: one ``cuda.device_array(nbytes, uint8)`` (rounded up to 256 bytes)."""

    def __init__(self, nbytes):
        if nbytes <= 0:
            raise ValueError(f"DeviceArena: nbytes must be positive, got {nbytes}")
        self.nbytes = -(-int(nbytes) // ALIGNMENT) * ALIGNMENT
        self.buffer = cuda.device_array(self.nbytes, np.uint8)

    def _check_slice(self, offset, nbytes, what):
        if offset % ALIGNMENT:
            raise ValueError(f"DeviceArena.{what}: offset {offset} is not a multiple of {ALIGNMENT} bytes; "
                             f"offsets come from the MemoryPlan, which aligns every slice")
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"DeviceArena.{what}: bytes [{offset}, {offset + nbytes}) leave the arena "
                             f"of {self.nbytes} bytes")

    def view(self, offset, shape, dtype):
        """A typed C-contiguous view of ``prod(shape)`` elements starting at byte ``offset``."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self._check_slice(offset, nbytes, "view")
        return self.buffer[offset:offset + nbytes].view(dtype).reshape(shape)

    def zero(self, launcher=None):
        """Set every byte to 0 (a kernel launch; ``launcher`` defaults to the default stream)."""
        fill_zero(launcher or Immediate(), self.buffer.view(np.uint32))

    def upload(self, offset, host, stream):
        """Copy the host array ``host`` into the arena at byte ``offset``, queued on ``stream``.

        Asynchronous only if ``host`` is pinned (``cuda.pinned_array``); a step's per-step inputs
        go through ``cuda_kernels.transfer``'s pinned staging instead.
        """
        host = np.ascontiguousarray(host)
        self._check_slice(offset, host.nbytes, "upload")
        self.buffer[offset:offset + host.nbytes].copy_to_device(host.reshape(-1).view(np.uint8), stream=stream)

    def download(self, offset, shape, dtype, stream):
        """A host copy of the view at ``offset``, after everything queued on ``stream`` (synchronises it)."""
        host = self.view(offset, shape, dtype).copy_to_host(stream=stream)
        synchronize(stream)
        return host
