"""A `Model` and an executor shared by threads (issue 24, item 5): each call holds the executor's
arena for its whole run, so concurrent calls give exactly the logits of the same calls made one
after another (before, 109-131 of 200 calls per thread came back with another call's values)."""
import sys
import threading

import numpy as np
import pytest

from blueprint import BluePrint, Model, bn, conv, fc, gap, relu, seq
from blueprint import InputSpec

NET = BluePrint(seq(conv(8, 3, 1, 1), bn(), relu(), conv(8, 3, 1, 1), relu(), gap(), fc(3)))
CALLS = 40
THREADS = 3


@pytest.fixture
def frequent_switches():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)      # interleave the threads as often as the interpreter can
    yield
    sys.setswitchinterval(previous)


def _race(call, inputs):
    """`call(x)` for each thread's inputs, all threads started together; the results by thread."""
    results = [[None] * CALLS for _ in inputs]
    start = threading.Barrier(len(inputs))

    def run(index):
        start.wait()
        for k, x in enumerate(inputs[index]):
            results[index][k] = call(x)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _inputs():
    rng = np.random.default_rng(1)
    return [[rng.standard_normal((4, 6, 6, 2)).astype(np.float32) for _ in range(CALLS)] for _ in range(THREADS)]


def test_threads_sharing_a_model_get_their_own_logits(frequent_switches):
    model = Model(NET, InputSpec((6, 6, 2), "float32"))
    inputs = _inputs()
    expected = [[model.logits(x) for x in xs] for xs in inputs]
    got = _race(model.logits, inputs)
    wrong = sum(not np.array_equal(g, e) for gs, es in zip(got, expected) for g, e in zip(gs, es))
    assert wrong == 0, f"{wrong} of {THREADS * CALLS} calls returned another call's logits"


def test_threads_sharing_an_executor_get_their_own_logits(frequent_switches):
    executor = Model(NET, InputSpec((6, 6, 2), "float32"))._executor(4)
    inputs = _inputs()
    expected = [[executor.forward(x) for x in xs] for xs in inputs]
    got = _race(executor.forward, inputs)
    wrong = sum(not np.array_equal(g, e) for gs, es in zip(got, expected) for g, e in zip(gs, es))
    assert wrong == 0, f"{wrong} of {THREADS * CALLS} calls returned another call's logits"
