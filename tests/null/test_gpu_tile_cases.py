"""The device preflight's tile cases (``benchmarks.gpu.tile_cases``): every GPU tile x {forward, dgrad, wgrad},
each launch with at least 2 blocks in each grid dimension it has and a reduction of at least 5 k-tiles (the
3-stage ring wraps). The grids are read from the launches the kernels' own host code makes (host stand-ins,
no device); the cases run numerically in tests/cuda/test_gpu_tile_cases.py (simulator) and on a GPU."""
import numpy as np
import pytest

pytest.importorskip("numba", reason="the cases launch cuda_kernels' tensor-core kernels, which need numba")

from benchmarks.gpu.kernel_cases import DryLauncher  # noqa: E402
from benchmarks.gpu.tile_cases import CASES, DIRECTION_TILES, K_TILES, excluded_tiles  # noqa: E402
from cuda_kernels import mma_conv, mma_dgrad, mma_wgrad  # noqa: E402
from cuda_kernels.mma_tiles import GPU_TILES  # noqa: E402


class GridLauncher(DryLauncher):
    def launch(self, spec, grid, block, *args):
        super().launch(spec, grid, block, *args)
        self.grids = getattr(self, "grids", []) + [(spec.name, grid)]


def launched(case):
    n, h, w_, c_in, c_out, k, s, p = case.shape
    x, w = np.empty((n, h, w_, c_in), np.float16), np.empty((c_out, k, k, c_in), np.float16)
    dy = np.empty((n, h, w_, c_out), np.float16)
    launcher = GridLauncher()
    {"forward": lambda: mma_conv.conv2d_forward(launcher, x, w, dy, s, p, 1, tile=case.tile),
     "dgrad": lambda: mma_dgrad.conv2d_backward_data(launcher, w, dy, x, s, p, False, tile=case.tile),
     "wgrad": lambda: mma_wgrad.conv2d_backward_weight(launcher, x, w, dy, np.empty(w.shape, np.float32), s, p,
                                                        tile=case.tile)}[case.direction]()
    return [(name, tuple(grid)) for name, grid in launcher.grids if name.startswith("mma_")]


def test_every_gpu_tile_has_a_case_in_each_direction_its_table_has():
    assert DIRECTION_TILES["forward"] == GPU_TILES
    want = {f"{d}:{t.name}" for d, tiles in DIRECTION_TILES.items() for t in tiles}
    assert set(CASES) == want and len(want) >= 3 * len(GPU_TILES) - 2


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_launches_its_tile_on_two_blocks_per_grid_dimension_and_wraps_the_ring(name):
    case = CASES[name]
    (kernel, grid), = launched(case)
    assert kernel.endswith("_" + case.tile.name), kernel
    assert grid[:2] == case.blocks and min(grid[:2]) >= 2, (grid, case.blocks)
    assert grid[2] == 1 or grid[2] >= 2
    assert case.k_tiles >= K_TILES


def test_a_failed_or_crashed_case_excludes_its_direction_and_tile():
    assert excluded_tiles({"forward:128x128x32": "ok", "wgrad:64x64x32": "failed", "dgrad:128x64x32": "crashed"}) \
        == "dgrad:128x64x32,wgrad:64x64x32"
