"""asv benchmarks of the transient-tensor offset allocator, compiled and its same source uncompiled.

Run directly (``python -m benchmarks.bench_memory_alloc`` from the repository root) for a
one-screen summary: time per implementation, the speedup, and arena / lower bound.
"""
import importlib
import timeit

import numpy as np

from planner._build import is_compiled, source

_memory = importlib.import_module("planner._memory")
_memory_py = source("planner._memory")
_memory_c = _memory if is_compiled(_memory) else None
IMPLEMENTATIONS = {"cython": _memory_c, "pure": _memory_py}
# Batch 32, fp16 NHWC activations of ResNet's four stages.
STAGE_BYTES = [32 * 2 * hw * hw * c for hw, c in ((56, 256), (28, 512), (14, 1024), (7, 2048))]


def resnet152_training(n_layers=700, seed=0):
    """A training step's tensors, ~3,000 of them: each forward op's output lives until its
    backward op (80%) or only to the next op; one-op workspaces forward and backward; every
    third op a residual input living 3 ops; each backward op's gradient lives 2 ops."""
    rng = np.random.default_rng(seed)
    last_op = 2 * n_layers - 1
    tensors = []  # (size, first, last)
    for t in range(n_layers):
        size = STAGE_BYTES[4 * t // n_layers] * rng.uniform(0.25, 1.0)
        backward = last_op - t
        tensors.append((size, t, backward if rng.random() < 0.8 else t + 1))
        tensors.append((size * rng.uniform(0.5, 1.0), backward, min(backward + 1, last_op)))
        tensors.append((size * rng.uniform(0.1, 2.0), t, t))
        tensors.append((size * rng.uniform(0.1, 2.0), backward, backward))
        if t % 3 == 0:
            tensors.append((size, t, min(t + 3, last_op)))
    sizes, first, last = (np.array(column) for column in zip(*tensors))
    return sizes.astype(np.int64), first.astype(np.int32), last.astype(np.int32)


def random_tensors(n=2000, n_ops=4000, seed=0):
    """Sizes log-uniform in 256 B .. 4 MiB; 80% live 1-5 ops, the rest up to half the schedule."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(256), np.log(4 << 20), n)).astype(np.int64)
    first = rng.integers(0, n_ops, n)
    lengths = np.where(rng.random(n) < 0.8, rng.integers(0, 5, n), rng.integers(0, n_ops // 2, n))
    return sizes, first.astype(np.int32), (first + lengths).astype(np.int32)


PROBLEMS = {"resnet152_training": resnet152_training, "random_2000": random_tensors}


class MemoryAllocator:
    params = (list(IMPLEMENTATIONS), list(PROBLEMS))
    param_names = ["implementation", "problem"]

    def setup(self, implementation, problem):
        self.allocator = IMPLEMENTATIONS[implementation]
        if self.allocator is None:
            raise NotImplementedError("planner._memory is not compiled: run `python setup.py build_ext --inplace`")
        self.problem = PROBLEMS[problem]()

    def time_assign_offsets(self, implementation, problem):
        self.allocator.assign_offsets(*self.problem)

    def time_live_lower_bound(self, implementation, problem):
        self.allocator.live_lower_bound(*self.problem)

    def track_arena_over_lower_bound(self, implementation, problem):
        return self.allocator.assign_offsets(*self.problem)[1] / self.allocator.live_lower_bound(*self.problem)

    track_arena_over_lower_bound.unit = "ratio"


def _best_seconds(function, problem, repeats):
    return min(timeit.repeat(lambda: function(*problem), number=1, repeat=repeats))


if __name__ == "__main__":
    for name, make in PROBLEMS.items():
        problem = make()
        pure = _best_seconds(_memory_py.assign_offsets, problem, 3)
        arena = _memory_py.assign_offsets(*problem)[1]
        line = f"{name} ({len(problem[0])} tensors): pure {pure * 1e3:.1f} ms"
        if _memory_c is not None:
            cython = _best_seconds(_memory_c.assign_offsets, problem, 50)
            line += f", cython {cython * 1e3:.2f} ms, speedup {pure / cython:.0f}x"
        print(line + f", arena / lower bound {arena / _memory_py.live_lower_bound(*problem):.4f}")
