"""Run in a fresh process by tests/cpu/test_disk_cache.py: CPU kernels at work, and what numba compiled.

    python -m tests.support.cache_probe every_kind   one training step of the every-kind network (every CPU
                                                    kernel family, spans only: the tensors are small)
    python -m tests.support.cache_probe pair DIR     the activation kernels generated from the scalar pair in
                                                    DIR/edited_pair.py, span and thread-pool loop, both directions

Prints one JSON line: ``compiled``, the functions numba compiled as ``module:qualname`` (its
"numba:compile" events; a kernel loaded from the disk cache raises none), and the results, for
comparison across processes. The caller sets NUMBA_CACHE_DIR.
"""
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from numba.core import event

COMPILED = []


class _Compiled(event.Listener):
    def on_start(self, ev):
        function = ev.data["dispatcher"].py_func
        COMPILED.append(f"{function.__module__}:{function.__qualname__}")

    def on_end(self, ev):
        pass


def every_kind() -> dict:
    from tests.support.every_kind import every_kind_plan

    from cpu_ref import CpuExecutor
    plan = every_kind_plan()
    x = np.random.default_rng(0).standard_normal(plan.variants["train"].input_shape).astype(np.float32)
    return {"loss": CpuExecutor(plan, seed=1).train_step(x, np.array([0, 3]), lr=0.01)}


def pair(folder: str) -> dict:
    from tests.support.toy_activation import SQUARE_ROW

    from cpu_ref._activation import pointwise
    spec = importlib.util.spec_from_file_location("edited_pair", Path(folder) / "edited_pair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels = pointwise(dataclasses.replace(SQUARE_ROW, scalar_forward=module.pair, scalar_backward=module.pair_grad))
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    dy, a, b = np.ones_like(x), np.float32(0), np.float32(0)
    out = {name: np.zeros_like(x) for name in ("y_span", "y_parallel", "dx_span", "dx_parallel")}
    kernels.forward[0](x, out["y_span"], a, b, 0, 1)
    kernels.forward[1](x, out["y_parallel"], a, b, 2)
    kernels.backward[0](x, dy, out["dx_span"], a, b, False, 0, 1)
    kernels.backward[1](x, dy, out["dx_parallel"], a, b, False, 2)
    return {name: values.tolist() for name, values in out.items()}


if __name__ == "__main__":
    event.register("numba:compile", _Compiled())
    result = every_kind() if sys.argv[1] == "every_kind" else pair(sys.argv[2])
    print(json.dumps({"compiled": sorted(COMPILED), **result}))
