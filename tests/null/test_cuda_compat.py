"""``cuda_kernels.compat``: the one module that imports cuda.core and numba-cuda's private names; what an
older install lacks and the fallback taken, with stand-ins for those installs (no GPU, no simulator). And
``tile_exclusions``: an excluded tensor-core tile runs SIMT."""
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("numba", reason="cuda_kernels needs numba (and numba-cuda) to import")

from cuda_kernels import compat, graph, mma_conv, mma_ops, tile_exclusions  # noqa: E402
from cuda_kernels.mma_tiles import GPU_TILES  # noqa: E402
from benchmarks.gpu.kernel_cases import DryLauncher  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def importer(modules):
    """An ``import_module`` over stand-in modules; any other name is an ImportError, as when it is absent."""
    def import_module(name):
        if name not in modules:
            raise ImportError(f"No module named {name!r}")
        return modules[name]
    return import_module


def test_this_install_has_every_feature_but_the_opt_in_disk_cache():
    features = compat.features()
    assert [n for n, f in features.items() if not f.available] == ["disk-cache"], features


def test_an_older_cuda_core_without_the_graph_module_gives_eager_replay_not_a_crash(monkeypatch):
    old = compat.graph_capture(importer({"cuda.core": SimpleNamespace(Device=object)}))   # cuda.core 0.x
    assert not old.available and "cuda.core.graph" in old.why and old.fallback.startswith("eager replay")
    monkeypatch.setitem(compat.FEATURES, "graph-capture", old)
    monkeypatch.setattr(graph.cuda, "is_available", lambda: True)   # as on a GPU machine
    available, why = graph.graph_support()
    assert not available and why == old.why
    plan = graph.plan_replay("graph", True, (available, why))
    assert (plan.mode, plan.fell_back) == ("eager", True)
    assert compat.graph_capture(importer({})).available is False    # no cuda.core at all


def test_a_numba_cuda_without_the_handle_accessor_runs_the_wide_tiles_simt(monkeypatch):
    class CodeLibrary:   # no get_cufunc
        pass
    old = compat.dynamic_shared(importer({"numba.cuda.codegen": SimpleNamespace(CUDACodeLibrary=CodeLibrary)}))
    assert not old.available and old.fallback.startswith("static shared memory only")
    features = dict(compat.FEATURES, **{"dynamic-shared": old})
    tile = GPU_TILES[0]
    assert tile_exclusions.excluded("dgrad", tile, 96 * 1024, features, frozenset())
    assert not tile_exclusions.excluded("dgrad", tile, 40 * 1024, features, frozenset())
    with pytest.raises(RuntimeError, match="get_cufunc"):
        monkeypatch.setitem(compat.FEATURES, "dynamic-shared", old)
        compat.loaded_handle(object())


def test_a_numba_cuda_without_shared_alignment_runs_no_tensor_core_kernel():
    class Decl:
        def generic(self):
            def typer(shape, dtype):
                pass
            return typer
    old = compat.shared_alignment(importer({"numba.cuda.cudadecl": SimpleNamespace(Cuda_array_decl=Decl)}))
    assert not old.available and "alignment" in old.why
    features = dict(compat.FEATURES, **{"shared-alignment": old})
    assert tile_exclusions.excluded("forward", GPU_TILES[-1], 0, features, frozenset())


def _forward_launches():
    x, w = np.empty((4, 16, 16, 32), np.float16), np.empty((64, 3, 3, 32), np.float16)
    y = np.empty((4, 16, 16, 64), np.float16)
    launcher = DryLauncher()
    mma_ops.conv2d_forward(launcher, x, w, y, 1, 1, 1)
    return launcher.names, mma_conv.forward_tile(w.shape, y.size)


def test_an_excluded_tile_runs_its_direction_simt(monkeypatch):
    names, tile = _forward_launches()
    assert names == [f"mma_conv2d_forward_{tile.name}"]
    monkeypatch.setattr(tile_exclusions, "EXCLUDED", tile_exclusions.parse(f"forward:{tile.name}"))
    names, _ = _forward_launches()
    assert names and not any(n.startswith("mma_") for n in names), names
    monkeypatch.setattr(tile_exclusions, "EXCLUDED", tile_exclusions.parse(f"wgrad:{tile.name}"))
    assert _forward_launches()[0] == [f"mma_conv2d_forward_{tile.name}"]   # another direction: untouched


def test_exclusions_parse_and_refuse_a_bad_item():
    pairs = tile_exclusions.parse("forward:128x128x32, wgrad:64x64x32,")
    assert pairs == {("forward", "128x128x32"), ("wgrad", "64x64x32")}
    assert tile_exclusions.parse(tile_exclusions.format_exclusions(pairs)) == pairs
    with pytest.raises(ValueError, match="got 'backward:128x128x32'"):
        tile_exclusions.parse("backward:128x128x32")


def test_no_module_but_compat_imports_cuda_core_or_numba_cuda_private_names():
    pattern = re.compile(r"^\s*(from cuda\.core\b|import cuda\.core\b)|\._codelibrary\b|from numba\.cuda\.\w+ import _",
                         re.M)
    offenders = [str(path.relative_to(REPO)) for folder in ("cuda_kernels", "benchmarks", "blueprint", "cpu_ref")
                 for path in sorted((REPO / folder).rglob("*.py"))
                 if path.name != "compat.py" and pattern.search(path.read_text())]
    assert not offenders, f"import these through cuda_kernels/compat.py: {offenders}"


KEYS = """
import hashlib, json
from types import SimpleNamespace
from cuda_kernels import compat
from cuda_kernels.mma_kernels import all_mma_kernels
from cuda_kernels.registry import all_kernels
codegen = SimpleNamespace(magic_tuple=lambda: ("nvptx64-nvidia-cuda", "sm_90", ""))
digest = compat.source_digest()
print(json.dumps({name: hashlib.sha256(repr(compat.named_kernel_cache(spec.pyfunc, name, digest)._index_key(
    tuple(spec.signature), codegen)).encode()).hexdigest() for name, spec in {**all_kernels(), **all_mma_kernels()}.items()}))
"""


def test_the_disk_cache_keys_are_the_same_in_every_process_and_differ_between_kernels():
    """A kernel compiled by the warm-up process must be found by the next one: numba's own key pickles the
    tensor-core kernels' closures, which differ between processes; ``NamedKernelCache``'s must not."""
    import json
    import subprocess
    import sys
    runs = [json.loads(subprocess.run([sys.executable, "-c", KEYS], cwd=REPO, capture_output=True, text=True,
                                      check=True, timeout=300).stdout) for _ in range(2)]
    assert runs[0] == runs[1]
    assert len(set(runs[0].values())) == len(runs[0]) and any(n.startswith("mma_") for n in runs[0])


def test_the_cache_key_follows_the_kernels_source(tmp_path):
    (tmp_path / "_a.py").write_text("x = 1\n")
    before = compat.source_digest(tmp_path)
    (tmp_path / "_a.py").write_text("x = 2\n")
    assert compat.source_digest(tmp_path) != before
