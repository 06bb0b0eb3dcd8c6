"""fit() keeps one step in flight: step k+1 is submitted before step k's result is read, so a device
executor runs step k while the host prepares batch k+1; the history is that of the steps run in order."""
from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task.data import ArrayDataset, digits

BATCH, SIZE = 32, 160     # 5 steps per epoch


def _task():
    train, _ = digits()
    data = ArrayDataset(train.x[:SIZE], train.y[:SIZE])
    return (DeepLearningTask().model(BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(10))))
            .optimizer(SGD().lr(0.05)).data(train=data, batch_size=BATCH).epochs(2).seed(1).progress(False))


class _Recorded:
    """Wraps a submitted step: logs when its result is read."""

    def __init__(self, log, index, pending):
        self.log, self.index, self.pending = log, index, pending

    def result(self):
        self.log.append(("result", self.index))
        return self.pending.result()


def test_fit_submits_the_next_step_before_reading_the_last():
    task = _task()
    executor = task.session().executor
    log, submit = [], executor.submit_train_step

    def recorded_submit(x, y, lr):
        index = sum(1 for event, _ in log if event == "submit")
        log.append(("submit", index))
        return _Recorded(log, index, submit(x, y, lr))

    executor.submit_train_step = recorded_submit
    task.fit()
    steps = 2 * SIZE // BATCH
    expected = [("submit", 0)]
    for k in range(1, SIZE // BATCH):
        expected += [("submit", k), ("result", k - 1)]
    expected.append(("result", SIZE // BATCH - 1))      # the epoch's last step is read before validation
    expected += [(event, k + SIZE // BATCH) for event, k in expected]
    assert log == expected and len(log) == 2 * steps


def test_pipelined_fit_equals_step_by_step_training():
    """The same steps called one at a time through train_step give bit-identical weights and losses."""
    task = _task()
    history = task.fit()
    reference = _task()
    session = reference.session()
    loader, _, _ = reference._loaders()
    losses = []
    for epoch in range(2):
        order = loader.order(epoch)
        for step in range(loader.steps_per_epoch):
            x, y = loader.batch(epoch, step, order)
            lr = reference.scheduler_config.lr_at(epoch, step, loader.steps_per_epoch, reference.base_lr, 2)
            losses.append(session.executor.train_step(x, y, lr))
    ours = task.session().executor.state_dict()
    for name, value in session.executor.state_dict().items():
        assert value.tobytes() == ours[name].tobytes(), name
    per_epoch = [sum(losses[i * 5:(i + 1) * 5]) for i in range(2)]
    assert [round(r.train_loss * SIZE, 3) for r in history] == [round(l * BATCH, 3) for l in per_epoch]
