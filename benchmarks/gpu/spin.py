"""A short spin kernel launched before each timed group of eager launches, so that the device queue
stays ahead of the host: while the GPU sleeps, the host enqueues the whole group (launches and the
events between them), and the events then time the kernels, not the 20-40 us of host launch cost
between them (a graph-captured segment would also do; this protocol uses the spin)."""
from numba import cuda

HOST_LAUNCH_US = 40.0     # numba's host cost per launch, upper end (CUDA-NOTES: 6-9 us launch + argument handling)
MARGIN = 2.0


@cuda.jit
def _spin(rounds):
    if cuda.grid(1) == 0:
        for _ in range(rounds):
            cuda.nanosleep(1000)     # ~1 us per round (the hardware may sleep up to twice that)


def spin_us(entries):
    """How long to spin ahead of ``entries`` launches: twice their host launch cost."""
    return MARGIN * HOST_LAUNCH_US * max(entries, 1)


def spin_before(entries):
    """``before(stream)``: one single-thread launch that keeps the GPU busy ~``spin_us(entries)``."""
    rounds = int(spin_us(entries))

    def before(stream):
        _spin[1, 32, stream](rounds)
    return before
