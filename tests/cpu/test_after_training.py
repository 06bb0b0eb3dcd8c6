"""README's "Inference and export" section, mirrored one-for-one: every command and every call in it
runs here (the text of each block is compared with README, so the two cannot drift apart), and
`blueprint predict` / `blueprint export` are checked against the Python API."""
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from blueprint.cli import main
from blueprint.task.data import digits

README = Path(__file__).resolve().parents[2] / "README.md"
COMMANDS = """\
blueprint train --epochs 3 --out runs/digits
blueprint predict runs/digits/checkpoint.safetensors images.npy --top-k 3
blueprint predict runs/digits/checkpoint.safetensors images.npy --json
blueprint export runs/digits/checkpoint.safetensors --onnx small_cnn.onnx
"""
PYTHON = """\
from blueprint import Model
from blueprint.task.data import digits

model = Model.load("runs/digits/checkpoint.safetensors")   # BluePrint, weights, normalisation
images = digits()[1].x[:10]                                   # uint8 (10, 8, 8, 1), raw as in training
classes = model.predict(images)                               # (10,) int64
logits = model.logits(images, batch_size=4)                   # (10, 10) float32: batches of 4, 4 and 2
probabilities = model.probabilities(images)                   # softmax of the logits
model.export_onnx("small_cnn.onnx")                           # dynamic batch; batch=8 fixes it
"""
TORCHVISION = """\
import torchvision
from blueprint import InputSpec, Model, zoo

reference = torchvision.models.resnet18()        # weights="IMAGENET1K_V1" downloads the trained ones
imagenet = InputSpec((224, 224, 3), "uint8", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
model = Model(zoo.resnet18(), imagenet).load_state_dict(reference.state_dict())
"""


def readme_blocks():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Inference and export\n", 1)[1].split("\n## ", 1)[0]
    return [body for _, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)]


def test_the_mirrored_blocks_are_readmes():
    assert readme_blocks() == [COMMANDS, PYTHON, TORCHVISION]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Where README's commands run: a trained run folder and images.npy."""
    folder = tmp_path_factory.mktemp("after_training")
    np.save(folder / "images.npy", digits()[1].x[:10])
    return folder


def run(line, capsys):
    """A README command line, through the CLI's `main`: (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = main(shlex.split(line)[1:])
    out, err = capsys.readouterr()
    return status, out, err


def test_readmes_commands_and_calls(workdir, capsys, monkeypatch):
    onnx = pytest.importorskip("onnx",
                               reason="onnx not installed: README's export needs pip install \".[onnx]\" in the blueprint-nn source tree")
    monkeypatch.chdir(workdir)
    train, predict_text, predict_json, export = COMMANDS.splitlines()
    assert run(train, capsys)[0] == 0
    # the Python block, line for line
    from blueprint import Model
    from blueprint.task.data import digits

    model = Model.load("runs/digits/checkpoint.safetensors")   # BluePrint, weights, normalisation
    images = digits()[1].x[:10]                                   # uint8 (10, 8, 8, 1), raw as in training
    classes = model.predict(images)                               # (10,) int64
    logits = model.logits(images, batch_size=4)                   # (10, 10) float32: batches of 4, 4 and 2
    probabilities = model.probabilities(images)                   # softmax of the logits
    model.export_onnx("small_cnn.onnx")                           # dynamic batch; batch=8 fixes it

    assert classes.shape == (10,) and classes.dtype == np.int64 and logits.shape == (10, 10)
    assert np.array_equal(classes, logits.argmax(axis=1)) and np.allclose(probabilities.sum(axis=1), 1, atol=1e-6)
    assert set(model._executors) >= {4, 2}                            # the last partial batch got its own plan

    status, out, _ = run(predict_text, capsys)
    lines = out.splitlines()
    assert status == 0 and len(lines) == 10
    assert [int(line.split(": ")[1].split(" ")[0]) for line in lines] == classes.tolist()
    assert all(len(line.split(", ")) == 3 for line in lines)

    status, out, _ = run(predict_json, capsys)
    rows = json.loads(out)
    assert status == 0 and [r["index"] for r in rows] == list(range(10))
    for row, expected in zip(rows, probabilities):
        ranked = [entry["class"] for entry in row["top_k"]]
        assert len(ranked) == 5 and ranked[0] == int(expected.argmax())
        assert np.allclose([entry["probability"] for entry in row["top_k"]], expected[ranked], rtol=1e-6)

    Path("small_cnn.onnx").unlink()
    status, out, _ = run(export, capsys)
    assert status == 0 and Path("small_cnn.onnx").is_file() and "NCHW (N, 1, 8, 8)" in out
    status, out, _ = run(export.replace("small_cnn.onnx", "small_cnn_8.onnx") + " --batch 8", capsys)
    assert status == 0 and "NCHW (8, 1, 8, 8)" in out and "output 'logits' (8, 10)" in out
    dims = onnx.load("small_cnn_8.onnx").graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [8, 1, 8, 8]


PREDICT_ERRORS = [   # (file, what it holds, the message's fix)
    ("nchw.npy", lambda x: x.transpose(0, 3, 1, 2), "x.transpose(0, 2, 3, 1)"),
    ("scaled.npy", lambda x: x.astype(np.float32) / 255, "trained on uint8 images"),
    ("objects.npy", lambda x: np.array([{"a": 1}], dtype=object), "not a .npy file of numbers"),
]


def test_predict_takes_one_sample_and_refuses_what_it_would_get_wrong(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    checkpoint = "runs/digits/checkpoint.safetensors"
    if not Path(checkpoint).is_file():   # when run alone
        assert run("blueprint train --epochs 1 --out runs/digits", capsys)[0] == 0
    images = digits()[1].x[:2]
    np.save("one.npy", images[0])
    status, out, _ = run(f"blueprint predict {checkpoint} one.npy --top-k 1", capsys)
    assert status == 0 and out.startswith("0: ") and len(out.splitlines()) == 1
    for name, content, message in PREDICT_ERRORS:
        np.save(name, content(images), allow_pickle=True)   # the object array needs it to be written
        status, out, err = run(f"blueprint predict {checkpoint} {name}", capsys)
        assert (status, out) == (2, "") and err.startswith("error: ") and message in err, err


def torch_resnet18():
    """`torchvision.models.resnet18`, imported by tests/support/torchvision_ref.py (which works even
    where torchvision's C++ operators fail to register against this torch build)."""
    from tests.support import torchvision_ref
    return torchvision_ref.torchvision_or_skip().models.resnet18()


def test_readmes_torchvision_weights():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: the torchvision example needs it")
    from blueprint import InputSpec, Model, zoo

    reference = torch_resnet18()        # weights="IMAGENET1K_V1" downloads the trained ones
    imagenet = InputSpec((224, 224, 3), "uint8", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    model = Model(zoo.resnet18(), imagenet).load_state_dict(reference.state_dict())
    image = np.random.default_rng(0).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
    normalised = imagenet.normalise(image, "test")
    with torch.no_grad():
        expected = reference.eval()(torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy())).numpy()
    assert np.allclose(model.logits(image), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
