"""The gloo all-reduce of one data-parallel step, at the gradient-region sizes of zoo models.

    torchrun --nproc-per-node 2 -m benchmarks.gloo_allreduce [resnet20 resnet50 ...] [--repeats 20]

Each rank all-reduces (sum) a float32 array as large as the model's ``grads`` region (the planner's
memory plan, alignment padding included) through a zero-copy ``torch.from_numpy`` view, as
`blueprint.distributed` does every step, then scales it by 1 / world size. Rank 0 prints the median
and the spread over ``--repeats`` timed runs after 3 warm-up runs (wall clock, `time.perf_counter`).
"""
import argparse
import time

import numpy as np

WARMUP = 3


def gradient_bytes(model: str) -> int:
    from blueprint import zoo
    from planner import ArchPlan
    from planner.compiler import Compiler
    entry = zoo.MODELS[model]
    h, w, c = entry.input_shape
    plan = Compiler(ArchPlan.from_blueprint(entry.build(), in_channels=c)).compile(
        {"train": (1, h, w, c), "eval": (1, h, w, c)})
    return plan.memory.regions["grads"][1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet20", "resnet50"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    from blueprint.distributed import Distributed
    dist = Distributed.from_environment()
    dist.start()
    for model in args.models:
        nbytes = gradient_bytes(model)
        grads = np.ones(nbytes // 4, np.float32)
        inverse = np.float32(1 / dist.world_size)
        times = []
        for run in range(WARMUP + args.repeats):
            start = time.perf_counter()
            dist.all_reduce_sum(grads, "benchmark all-reduce")
            np.multiply(grads, inverse, out=grads)
            if run >= WARMUP:
                times.append(time.perf_counter() - start)
        if dist.is_writer:
            ms = np.array(times) * 1e3
            print(f"{model}: {nbytes / 2**20:.2f} MiB of gradients, {dist.world_size} ranks: all-reduce + mean "
                  f"median {np.median(ms):.2f} ms (min {ms.min():.2f}, max {ms.max():.2f}, {args.repeats} runs)",
                  flush=True)


if __name__ == "__main__":
    main()
