"""Host <-> device transfers of a step, ordered on the step's stream.

A step's per-step inputs (the batch, the labels, the learning rate) and the values the host
reads back (loss, number correct, logits) each have a fixed arena slot. Every copy between a
slot and the host goes through a pinned staging buffer and is issued on the step's stream,
so the first kernel that reads an input runs after its upload and a download runs after the
last kernel that writes its slot (a synchronous default-stream copy is NOT ordered with a
non-blocking stream). The host waits on an event, never on the whole device.

Double buffering: every staging buffer exists twice, used by alternate steps ("turns"). The
host fills turn k+1's input buffers (fp32 -> fp16 cast included) while the device still runs
step k; before overwriting a buffer it waits on the event recorded after that buffer's last
upload (turn k-1, long finished). A step's outputs land in its turn's output buffers and are
read after the turn's "done" event, so the result of step k can be read after step k+1 was
submitted. The copy itself is queued behind step k on the same stream (one stream keeps the
order trivially right); what overlaps the device's work is the host's preparation.

The CUDA simulator has synchronous streams and events and no pinned memory: the same code runs
there, with ordinary host arrays standing in for pinned ones (``pinned_empty``, the one place).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from .registry import SIMULATOR

TURNS = 2   # double buffering


def pinned_empty(shape, dtype):
    """A page-locked host array (an ordinary one in the simulator, which has no pinned memory)."""
    if SIMULATOR:
        return np.empty(shape, dtype)
    return cuda.pinned_array(shape, dtype)


def new_event():
    return cuda.event(timing=False) if not SIMULATOR else cuda.event()


class Staging:
    """The staging buffers and events of one recorded step (inputs by name, outputs by name: each a device view,
    the values' exact shape: a padded stem's batch is uploaded with its real channels, ``CudaExecutor._uploaded_as``).

    ``trace``: a list to which every stream operation and host wait/read is appended as
    ``(kind, name)`` when set (tests check the order; ``None`` in use)."""

    def __init__(self, inputs: dict, outputs: dict):
        self.inputs = {name: StagedSlot(name, view) for name, view in inputs.items()}
        self.outputs = {name: StagedSlot(name, view) for name, view in outputs.items()}
        self.uploaded = [new_event() for _ in range(TURNS)]   # recorded after a turn's uploads
        self.done = [new_event() for _ in range(TURNS)]       # recorded after a turn's downloads
        self.turn = -1          # the turn being submitted / last submitted
        self.trace = None

    def note(self, kind, name):
        if self.trace is not None:
            self.trace.append((kind, name))

    def begin(self, values: dict):
        """Start a new turn: wait until its input buffers are free, then fill them with ``values``."""
        if sorted(values) != sorted(self.inputs):
            raise ValueError(f"Staging.begin: expected values for {sorted(self.inputs)}, got {sorted(values)}")
        self.turn += 1
        buffer = self.turn % TURNS
        self.uploaded[buffer].synchronize()      # the upload of turn - 2 read these buffers
        self.note("host_wait", "uploaded")
        for name, value in values.items():
            self.inputs[name].fill(buffer, value)
        return self.turn

    def result(self, turn):
        """The host copies of the outputs of ``turn`` (after waiting on its event)."""
        if not 0 <= self.turn - turn < TURNS:
            raise RuntimeError(f"Staging.result: the outputs of step {turn} were overwritten by step {self.turn}; "
                               f"read a step's result before submitting {TURNS} more steps")
        buffer = turn % TURNS
        self.done[buffer].synchronize()
        self.note("host_wait", "done")
        self.note("host_read", ",".join(self.outputs))
        return {name: slot.host[buffer] for name, slot in self.outputs.items()}


class StagedSlot:
    """One arena slot (a device view) and its two pinned host buffers, of the slot's shape and type."""

    def __init__(self, name, view):
        self.name, self.view = name, view
        self.host = [pinned_empty(view.shape, view.dtype) for _ in range(TURNS)]
        self.shape = tuple(view.shape)   # of the values

    def fill(self, buffer, value):
        value = np.asarray(value)
        if value.size != np.prod(self.shape):
            raise ValueError(f"staged input {self.name!r}: expected {int(np.prod(self.shape))} values "
                             f"({self.shape}), got {value.size} ({value.shape})")
        np.copyto(self.host[buffer], value.reshape(self.shape), casting="unsafe")


# ---- tape entries (``LaunchTape`` records them next to the kernel launches) ---------------------------------

@dataclass(frozen=True)
class Upload:
    """Copy the current turn's pinned buffer of ``slot`` into its arena slot, on the stream."""
    staging: Staging
    slot: StagedSlot
    kind = "upload"

    @property
    def name(self):
        return self.slot.name

    def run(self, stream):
        self.slot.view.copy_to_device(self.slot.host[self.staging.turn % TURNS], stream=stream)
        self.staging.note("upload", self.slot.name)


@dataclass(frozen=True)
class Download:
    """Copy the arena slot of ``slot`` into the current turn's pinned buffer, on the stream."""
    staging: Staging
    slot: StagedSlot
    kind = "download"

    @property
    def name(self):
        return self.slot.name

    def run(self, stream):
        self.slot.view.copy_to_host(self.slot.host[self.staging.turn % TURNS], stream=stream)
        self.staging.note("download", self.slot.name)


@dataclass(frozen=True)
class RecordEvent:
    """Record the current turn's ``which`` event ("uploaded" or "done") on the stream."""
    staging: Staging
    which: str
    kind = "event"

    @property
    def name(self):
        return self.which

    def run(self, stream):
        getattr(self.staging, self.which)[self.staging.turn % TURNS].record(stream)
        self.staging.note("event", self.which)


def record_transfers(tape, staging: Staging, body):
    """Record on ``tape``: every upload, the "uploaded" event, ``body(tape)`` (the kernels), every
    download, the "done" event: the order a step's stream must see."""
    for slot in staging.inputs.values():
        tape.add(Upload(staging, slot))
    tape.add(RecordEvent(staging, "uploaded"))
    body(tape)
    for slot in staging.outputs.values():
        tape.add(Download(staging, slot))
    tape.add(RecordEvent(staging, "done"))
