"""The device preflight's tile cases (``benchmarks.gpu.tile_cases``: every GPU tile x {forward, dgrad, wgrad},
2 blocks per grid dimension, 5 k-tiles, NaN-poisoned outputs) run here in the simulator, as on the GPU:
the same function, the same shapes, the same comparison with the numpy spec.

Their shapes cannot shrink (4 blocks x 5 k-tiles each): 20-50 s per case here. CI runs the smallest tile
of each direction; ``BLUEPRINT_SIM_TILE_CASES=all`` runs all of them (~15 minutes on 2 cores)."""
import os
import zlib

import pytest

from benchmarks.gpu.tile_cases import CASES, DIRECTION_TILES, run_case

ALL = os.environ.get("BLUEPRINT_SIM_TILE_CASES") == "all"
CHEAPEST = {f"{d}:{min(tiles, key=lambda t: (t.threads, t.bm * t.bn)).name}" for d, tiles in DIRECTION_TILES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tile_case_equals_the_numpy_spec(name):
    if not (ALL or name in CHEAPEST):
        pytest.skip(f"20-50 s in the simulator; CI runs {sorted(CHEAPEST)}; BLUEPRINT_SIM_TILE_CASES=all runs it")
    result = run_case(name, seed=zlib.crc32(name.encode()))
    assert result["ok"], result.get("error")
    assert result["kernel"].endswith(CASES[name].tile.name) and result["unwritten_or_wrong"] == 0
