"""A network nested deeper than the DSL's old recursive walks allowed (`net = seq(net, relu())`
340 times: `save()` used to raise RecursionError) trains, saves and resumes."""
import numpy as np

from blueprint import BluePrint, cbr, fc, gap, relu, seq
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task.data import ArrayDataset

DEPTH = 340


def test_a_340_deep_chain_trains_saves_and_resumes(tmp_path):
    net = cbr(4, 3, 1, 1)
    for _ in range(DEPTH):
        net = seq(net, relu())
    bp = BluePrint(seq(net, gap(), fc(2)))
    rng = np.random.default_rng(0)
    data = ArrayDataset(rng.standard_normal((16, 4, 4, 1)).astype(np.float32), np.arange(16) % 2)

    def make_task():
        return DeepLearningTask().model(bp).optimizer(SGD().lr(0.1)).data(train=data, batch_size=8).progress(False)

    task = make_task().epochs(1)
    history = task.fit()
    assert len(history) == 1 and np.isfinite(history[0].train_loss)
    assert sum(layer.kind == "relu" for layer in task.session().plan.arch.layers) == DEPTH + 1  # + the cbr's
    path = task.save(tmp_path / "deep.safetensors")
    resumed = make_task().epochs(2).resume(path)
    saved, loaded = task.session().executor.state_dict(), resumed.session().executor.state_dict()
    assert saved.keys() == loaded.keys() and all(np.array_equal(saved[k], loaded[k]) for k in saved)
