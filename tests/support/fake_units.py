"""Units for ``benchmarks.gpu.isolate``'s tests: each does to its process what a faulting kernel can."""
import os
import signal
import time


def returns(value):
    return {"value": value, "pid": os.getpid()}


def finds_a_difference():
    return {"ok": False, "error": "max |error| 3.0 > tolerance"}


def raises():
    raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS (stand-in)")


def exits(status):
    os._exit(status)


def kills_itself(name):
    os.kill(os.getpid(), getattr(signal, name))
    time.sleep(60)


def hangs():
    while True:
        time.sleep(1)


def returns_numpy():
    import numpy as np
    return {"error": np.float32(0.5), "shape": np.array([2, 3]), "ok": np.bool_(True)}
