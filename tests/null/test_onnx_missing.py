"""Without the optional onnx package, the export says which extra to install (and writes nothing)."""
import sys

import pytest

from blueprint import _onnx


@pytest.mark.parametrize("batch", [None, 8])
def test_export_without_onnx_names_the_extra_and_writes_nothing(tmp_path, monkeypatch, batch):
    monkeypatch.setitem(sys.modules, "onnx", None)   # `import onnx` now raises ImportError, as when it is absent
    out = tmp_path / "model.onnx"
    with pytest.raises(ImportError, match=r"ONNX export needs the onnx package: pip install \"\.\[onnx\]\" in the blueprint-nn source tree"):
        _onnx.export_onnx(object(), out, batch=batch)   # refused before the model is looked at
    assert not out.exists()
