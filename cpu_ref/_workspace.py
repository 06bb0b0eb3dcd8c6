"""Scratch memory a kernel keeps between calls: `workspace`.

Most kernels need no memory beyond the plan's arena. Those that do (the Winograd convolution's transformed weight
and tile chunks, `cpu_ref._conv`) allocated fresh arrays on every call, and the pages of a fresh multi-megabyte
array are faulted in again each time: in a resnet50 batch-8 forward, the 4 MB transformed weight of a 256-channel
layer cost about 1.6 ms a call, against 0.4 ms for the same transform into memory already touched. A workspace is
allocated once per thread and name, grown when a call needs more, and kept for the thread's lifetime (a few
megabytes: the largest call's size, per name).
"""
import math
import threading

import numpy as np


class _Buffers(threading.local):
    def __init__(self):
        self.by_name = {}


_BUFFERS = _Buffers()


def workspace(name: str, shape) -> np.ndarray:
    """A float32 array of ``shape``, contents undefined, from the calling thread's buffer ``name``: the memory a
    later call with the same name on the same thread gets again, so a kernel must be done with it when it
    returns (every caller is: the arrays never outlive the call)."""
    size = math.prod(shape)
    buffer = _BUFFERS.by_name.get(name)
    if buffer is None or buffer.size < size:
        buffer = _BUFFERS.by_name[name] = np.empty(size, np.float32)
    return buffer[:size].reshape(shape)
