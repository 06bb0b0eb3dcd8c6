"""The tensor-core performance model of ``benchmarks/gpu/model.py`` (predictions only; no GPU).

Checks what the model must get right whatever its constants: the convolutions it walks, that no
prediction beats the tensor-core peak it assumes, that a 3-channel stem is bound by its scalar
staging's instruction issue (from its SASS) and has no input gradient, that the SIMT input gradient
pays s^2, the issue term and the step's other kernels, the tile choices, and that the printed table
labels every figure a prediction.
"""
import pytest

pytest.importorskip("numba", reason="the performance model reads the tile tables of cuda_kernels, which needs numba "
                                    "(pip install numba numba-cuda)")
from benchmarks.gpu.model import (H200, ConvShape, conv_shapes, predict_conv, predict_step,  # noqa: E402
                                  print_conv_predictions, sass_counts)
from benchmarks.gpu.step_common import resnet18_cifar_blueprint, zoo_model  # noqa: E402


def test_resnet50_has_53_convolutions_at_the_torchvision_sizes():
    shapes = conv_shapes(zoo_model("resnet50", 1000)(), 256, 224)
    assert len(shapes) == 53
    # the stem reads the AMP input slot's 8 channels (3 real, zero-padded: the aligned kernels)
    assert (shapes[0].hw, shapes[0].c_in, shapes[0].kernel, shapes[0].stride, shapes[0].first) == (224, 8, 7, 2, True)
    assert [s.hw for s in shapes if s.kernel == 3] == [56] * 3 + [56] + [28] * 3 + [28] + [14] * 5 + [14] + [7] * 2
    assert shapes[-1].out_hw == 7 and not any(s.first for s in shapes[1:])


@pytest.mark.parametrize("shape", [ConvShape("c", 256, 56, 64, 64, 3, 1, 1), ConvShape("c", 512, 8, 256, 512, 3, 2, 1),
                                   ConvShape("c", 64, 14, 1024, 2048, 1, 2, 0)])
def test_no_prediction_beats_the_assumed_tensor_core_peak(shape):
    for kind, (mma, simt) in predict_conv(shape).items():
        assert 0 < mma.tflops <= H200.tensor_fp16_flops * H200.mma_sync_share / 1e12, kind
        assert simt.seconds > mma.seconds, kind


def test_stems_have_no_input_gradient_run_padded_and_simt_dgrad_pays_stride_squared():
    stem = predict_conv(ConvShape("stem", 8, 32, 8, 64, 7, 2, 3, first=True))   # 3 channels, as the AMP plan pads them
    assert set(stem) == {"forward", "wgrad"} and all(mma is not None for mma, _ in stem.values())
    assert conv_shapes(zoo_model("resnet50", 1000)(), 8, 224)[0].c_in == 8   # the model is given the padded channels
    strided = predict_conv(ConvShape("c", 8, 16, 64, 64, 3, 2, 1))
    assert strided["dgrad"][1].seconds - H200.launch_s == pytest.approx(4 * (strided["forward"][1].seconds - H200.launch_s))


def test_every_tensor_core_kernel_has_its_sass_count():
    from cuda_kernels.mma_kernels import all_mma_kernels
    assert set(sass_counts()) == set(all_mma_kernels())


def test_the_issue_term_follows_the_sass_counts(monkeypatch):
    """A loop that issues k times the instructions takes k times as long once issue bounds it (the issue's
    arithmetic: 11.7 per HMMA caps a 128x128 forward near 366 TFLOP/s at 4 warps per scheduler)."""
    shape = ConvShape("c", 256, 56, 256, 256, 3, 1, 1)
    counts = dict(sass_counts())
    name = next(k for k in counts if k.startswith("mma_conv2d_forward_bn_stats_128x128"))
    for per_hmma, expected_tflops in ((11.7, 366.0), (23.4, 183.0)):
        monkeypatch.setattr("benchmarks.gpu.model.sass_counts", lambda counts=dict(counts, **{name: per_hmma}): counts)
        mma = predict_conv(shape)["forward"][0]
        assert mma.bound == "instruction issue"
        steady = 4 * H200.sms * H200.clock_hz * 16 * 8 * 16 * 2 / per_hmma / 1e12   # one HMMA: 4096 flops
        assert steady == pytest.approx(expected_tflops, rel=0.01)
        assert mma.tflops < steady


def test_a_step_adds_its_other_kernels_bytes_at_the_streaming_bandwidth_and_a_gap_each():
    shapes = conv_shapes(resnet18_cifar_blueprint(), 64, 32)
    bare = predict_step(shapes, 0.0, 0)
    step = predict_step(shapes, 4.3e9, 2)     # 4.3 GB at 4.3 TB/s: 1 ms
    assert bare.other_s == 0 and step.gemm_s == bare.gemm_s > 0
    assert step.other_s == pytest.approx(1e-3) and step.other_launches == 2
    assert step.seconds == pytest.approx(bare.seconds + 1e-3 + 2 * H200.launch_s)


def test_the_printed_table_labels_its_figures_predictions(capsys):
    print_conv_predictions((("resnet18-cifar b64", resnet18_cifar_blueprint, 64, 32),))
    out = capsys.readouterr().out
    assert "PREDICTED" in out and "(prediction)" in out and "layer4.1.conv2" in out


# ---- the tile table (GPU tiles: this tier runs without the simulator) ----------------------------------------
from cuda_kernels.mma_dgrad import DGRAD_TILES  # noqa: E402
from cuda_kernels.mma_tiles import MmaTile, choose_tile  # noqa: E402
from cuda_kernels.mma_wgrad import WGRAD_TILES  # noqa: E402

TILE_CHOICES = [  # (m, n, tiles, min_blocks, expected): no tile mostly padding, the GPU filled
    (256 * 56 * 56, 256, None, 132, "128x128x32"),    # ResNet-50 layer1 1x1 expand
    (256 * 56 * 56, 64, None, 132, "128x64x32"),      # 64-channel layers: no 128-wide tile
    (512 * 32 * 32, 16, None, 132, "128x16x32"),      # 16-channel CIFAR layers
    (512 * 16 * 16, 32, None, 132, "128x32x32"),
    (2 * 14 * 14, 64, None, 132, "128x16x32"),        # no tile fills the GPU: the smallest (most blocks)
    (64, 576, WGRAD_TILES, 1, "64x64x32"),            # wgrad: Cout 64, no 128-row tile; splits fill the GPU
    (16, 16, WGRAD_TILES, 1, "128x16x32"),            # nothing fits: the least padded
    (256 * 28 * 28, 512, DGRAD_TILES, 132, "128x128x32"),  # 49.5 KB with .trans B: dynamic shared memory
    (512, 4608, WGRAD_TILES, 1, "128x128x32"),             # wgrad of a 512-channel 3x3: 51 KB, dynamic
]


@pytest.mark.parametrize("m, n, tiles, min_blocks, expected", TILE_CHOICES)
def test_choose_tile(m, n, tiles, min_blocks, expected):
    tile = choose_tile(m, n, tiles, min_blocks=min_blocks)
    assert tile.name == expected
    assert tiles is None or tile in tiles


def test_a_tile_whose_warps_do_not_divide_it_is_refused():
    with pytest.raises(ValueError, match="warp tiles must be multiples of 16x16, got 4x4 warps"):
        MmaTile(32, 32, 4, 4)


# ---- measured vs predicted per layer (gpu_check --quick's breakdown), on hand-made entries -------------------
from types import SimpleNamespace  # noqa: E402

from benchmarks.gpu.kernels import compare_families  # noqa: E402
from benchmarks.gpu.layers import per_layer  # noqa: E402
from cuda_kernels.gemm import GEOMETRY_FIELDS  # noqa: E402


def _launch(name, batch, hw, c_in, c_out, k, s, p, groups=1):
    out = (hw + 2 * p - k) // s + 1
    g = dict(gemm_m=0, gemm_n=0, gemm_k=0, batch=batch, h=hw, w=hw, c_in=c_in, oh=out, ow=out, c_out=c_out, kh=k,
             kw=k, stride=s, pad=p, groups=groups, k_chunk=0, accumulate=0)
    return SimpleNamespace(kind="kernel", name=name, args=("x", "w", tuple(g[f] for f in GEOMETRY_FIELDS)))


def test_per_layer_joins_each_pass_of_each_layer_with_its_prediction():
    a, b = (8, 16, 64, 64, 3, 1, 1), (8, 16, 64, 128, 1, 2, 0)
    entries = [SimpleNamespace(kind="upload", name="input", args=()),
               _launch("mma_conv2d_forward_64x64x32", *a), SimpleNamespace(kind="kernel", name="fill_zero_u32",
                                                                            args=("sums",)),
               _launch("mma_conv2d_forward_bn_stats_64x64x32", *a), _launch("conv2d_forward", *b),
               _launch("depthwise_forward", 8, 16, 64, 64, 3, 1, 1, groups=64),
               _launch("conv2d_backward_weight", *b), _launch("mma_conv2d_backward_weight_64x64x32", *a),
               _launch("mma_conv2d_backward_data_128x64x32", *a),
               _launch("mma_conv2d_backward_weight_64x64x32", *a), _launch("mma_conv2d_backward_data_128x64x32", *a)]
    timed = [(e.kind, e.name, float(i + 1)) for i, e in enumerate(entries)]   # entry i took i+1 ms
    rows = {(r["layer"], r["pass"]): r for r in per_layer(entries, timed)}
    assert set(rows) == {("conv 64>64 k3s1 16px #0", "forward"), ("conv 64>64 k3s1 16px #1", "forward"),
                         ("conv 64>128 k1s2 16px #0", "forward"), ("dwconv 64>64 k3s1 16px #0", "forward"),
                         ("conv 64>128 k1s2 16px #0", "wgrad"), ("conv 64>64 k3s1 16px #1", "wgrad"),
                         ("conv 64>64 k3s1 16px #1", "dgrad"), ("conv 64>64 k3s1 16px #0", "wgrad"),
                         ("conv 64>64 k3s1 16px #0", "dgrad")}
    # backward runs the layers last-first: the first wgrad launch of shape a is layer #1's
    assert rows["conv 64>64 k3s1 16px #1", "wgrad"]["measured_ms"] == 8.0
    assert rows["conv 64>64 k3s1 16px #0", "dgrad"]["measured_ms"] == 11.0
    mma = predict_conv(ConvShape("", 8, 16, 64, 64, 3, 1, 1))
    layer = rows["conv 64>64 k3s1 16px #0", "forward"]
    assert layer["predicted_ms"] == pytest.approx(mma["forward"][0].seconds * 1e3)
    assert layer["ratio"] == pytest.approx(2.0 / layer["predicted_ms"])
    simt = rows["conv 64>128 k1s2 16px #0", "wgrad"]   # a SIMT kernel is set beside the SIMT prediction;
    expected = predict_conv(ConvShape("", 8, 16, 64, 128, 1, 2, 0, first=True))["wgrad"][1]   # no dgrad: first
    assert simt["predicted_ms"] == pytest.approx(expected.seconds * 1e3) and simt["bound"] == "issue"
    assert rows["dwconv 64>64 k3s1 16px #0", "forward"]["predicted_ms"] is None   # grouped: no model


def test_a_geometry_kernel_with_no_known_pass_is_refused():
    with pytest.raises(ValueError, match="add its pass to PASSES"):
        per_layer([_launch("conv2d_mystery", 8, 16, 64, 64, 3, 1, 1)], [("kernel", "conv2d_mystery", 1.0)])


def test_compare_families_pairs_mma_rows_with_their_simt_twins():
    report = [dict(row="conv3x3-64 fwd mma", us=10.0), dict(row="conv3x3-64 fwd simt", us=250.0),
              dict(row="depthwise3x3-144 fwd simt", us=5.0), dict(row="linear 512-1000 bwd mma", us=4.0)]
    lines = compare_families(report)
    assert report[0]["speedup"] == 25.0 and report[0]["simt_us"] == 250.0
    assert "speedup" not in report[3] and "speedup" not in report[1]   # no simt twin; simt rows unchanged
    assert len(lines) == 2 and lines[1].split()[-1] == "25.00"
