"""A training graph's BatchNorm chains (`cpu_ref._executor._find_train_chains`): BatchNorm with the batch's
statistics, then the residual add and/or ReLU, in one pass (`cpu_ref._norm.batchnorm_forward_train` with
``residual`` and ``relu``) gives the same bits as the kernels run one by one, into a separate array or over the
residual, with few and many channels, NaN and infinities included, serially and on the thread pool; and the
executor's chains (``train_epilogues``) leave every zoo model's training steps unchanged (losses, parameters,
gradients, optimizer state, running statistics), in the arena and with separate buffers. A chain whose output
would overlap BatchNorm's input (which its backward reads) is not taken."""
import numpy as np
import pytest

from blueprint import zoo
from blueprint.optim import SGD
from cpu_ref import CpuExecutor
from cpu_ref import _executor as E
from cpu_ref import kernels as K
from planner.ops import Prim
from planner.plan import Role
from tests.cpu.test_eval_epilogue import _zoo_plan

F32 = np.float32


def _bn_inputs(m, c, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, c)) * 3 + 1).astype(F32)
    gamma, beta = rng.uniform(0.5, 2, c).astype(F32), rng.standard_normal(c).astype(F32)
    residual = rng.standard_normal((m, c)).astype(F32)
    residual[0, 0], residual[1, -1], residual[2, 0] = np.nan, np.inf, -np.inf
    return x, gamma, beta, residual


def _stats(c):
    """save_mean, save_invstd, running_mean, running_var."""
    return np.empty(c, F32), np.empty(c, F32), np.zeros(c, F32), np.ones(c, F32)


@pytest.mark.parametrize("m, c", [(37, 3), (300, 16), (129, 64), (64, 200)])
@pytest.mark.parametrize("add, relu, into", [(False, True, "separate"), (True, False, "separate"),
                                             (True, True, "separate"), (True, False, "residual"),
                                             (True, True, "residual")])
def test_the_chain_gives_the_bits_of_the_kernels_one_by_one(pool, m, c, add, relu, into):
    x, gamma, beta, residual = _bn_inputs(m, c)
    stats = _stats(c)
    want = np.empty((m, c), F32)
    K.batchnorm_forward_train(x, gamma, beta, want, *stats, 0.1, 1e-5)
    if add:
        K.add_forward(want, residual, want)
    if relu:
        K.activation_forward("relu", want.reshape(-1), want.reshape(-1))
    got_stats = _stats(c)
    out = residual.copy() if into == "residual" else np.full((m, c), np.nan, F32)
    K.batchnorm_forward_train(x, gamma, beta, out, *got_stats, 0.1, 1e-5, K.local_channel_sums,
                              out if into == "residual" else residual if add else np.zeros((0, 0), F32), relu)
    assert np.array_equal(out, want, equal_nan=True), f"largest difference {np.nanmax(np.abs(out - want))}"
    for got, expected in zip(got_stats, stats):
        assert np.array_equal(got, expected)


# zoo models with BatchNorm -> ReLU, -> add, and -> add -> ReLU chains (mobilenet_v2: add only, its ReLU6 is not
# taken), small: (name, input H, W, C, batch; mobilenet_v2 at batch 4: at 2 its last BatchNorms see 2 values a
# channel, and the second step's parameters overflow)
ZOO = [("resnet20", (16, 16, 3), 4), ("resnet18", (32, 32, 3), 2), ("resnet50", (32, 32, 3), 2),
       ("mobilenet_v2", (32, 32, 3), 4)]


def _train_chains(ex, shape):
    variant = ex._variant_for(shape, "train")
    return {i: c for i, c in ex._op_chains(variant, "train", ex._variant_views(variant)).items() if c is not None}


@pytest.mark.parametrize("name, hwc, batch", ZOO, ids=[m[0] for m in ZOO])
@pytest.mark.parametrize("separate", [False, True], ids=["arena", "separate buffers"])
def test_the_chains_leave_every_zoo_models_training_steps_unchanged(name, hwc, batch, separate):
    entry = zoo.MODELS[name]
    shape = (batch, *hwc)
    plan = _zoo_plan(name, shape)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(shape).astype(F32), rng.integers(0, entry.num_classes, batch)
    results = []
    for chained in (True, False):
        ex = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9), seed=3, separate_buffers=separate,
                         train_epilogues=chained)
        losses = [ex.train_step(x, y, 0.01) for _ in range(2)]
        if chained:
            chains = _train_chains(ex, shape)
            assert chains, f"{name}: no BatchNorm ran a chain"
        state = {region: ex._regions[region].copy() for region in ("params", "grads", "optim")}
        results.append((losses, state, ex.forward(x, train=True)))
    (losses, state, logits), (want_losses, want_state, want_logits) = results
    assert np.isfinite(want_losses).all()
    assert losses == want_losses
    for region in state:
        assert np.isfinite(want_state[region]).all(), region
        assert np.array_equal(state[region], want_state[region]), region
    assert np.array_equal(logits, want_logits)


def test_the_zoo_exercises_each_kind_of_chain():
    """The models above have ``bn -> relu``, ``bn -> add`` and ``bn -> add -> relu`` chains, so that the test above
    checks each."""
    kinds = set()
    for name, hwc, batch in ZOO:
        shape = (batch, *hwc)
        kinds.update((c.residual is not None, c.relu) for c in _train_chains(CpuExecutor(_zoo_plan(name, shape)), shape)
                     .values())
    assert kinds == {(False, True), (True, False), (True, True)}, kinds


def test_no_chain_writes_over_batchnorms_input():
    """Where a chain's output would lie over BatchNorm's input (which its backward reads), the chain is not taken."""
    shape = (4, 16, 16, 3)
    plan = _zoo_plan("resnet20", shape)
    ex = CpuExecutor(plan)
    views = dict(ex._variant_views("train"))
    chains = E._find_train_chains(plan, "train", views)
    ops = plan.graphs["train"].ops
    head, chain = next((i, c) for i, c in chains.items() if c is not None)
    assert ops[head].kind == Prim.BN2D.value
    views[chain.out] = views[ops[head].read(Role.X)]
    assert head not in E._find_train_chains(plan, "train", views)


@pytest.mark.parametrize("add", [False, True], ids=["bn-relu", "bn-add-relu"])
def test_no_chain_takes_a_value_another_op_reads(add, monkeypatch):
    """Where another op (a backward one, say) also reads BatchNorm's output, the chain that would leave it unwritten
    is not taken."""
    shape = (4, 16, 16, 3)
    plan = _zoo_plan("resnet20", shape)
    views = CpuExecutor(plan)._variant_views("train")
    ops = plan.graphs["train"].ops
    head = next(i for i, c in E._find_train_chains(plan, "train", views).items()
                if c is not None and (c.residual is not None) == add)
    y = ops[head].written(Role.Y)
    real = E.lifetimes

    def read_later(graph):
        touched = real(graph)
        touched[y] = (touched[y][0], len(graph.ops) - 1)
        return touched
    monkeypatch.setattr(E, "lifetimes", read_later)
    assert head not in E._find_train_chains(plan, "train", views)
