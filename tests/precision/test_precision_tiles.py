"""Tile quantisation: round-trip error bounds, padding, exact transposes, outlier isolation."""

from __future__ import annotations

import pytest
import torch

from legato.errors import ConfigError
from legato.precision import FP8_MAX, fake_quantize, get_recipe, quantize_tiles

TILES = [(1, 128), (128, 128), (1, None), (None, None), (32, 64)]


def _with_outliers(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    hits = torch.rand(shape, generator=g) < 0.002
    return torch.where(hits, x * 1000.0, x)


@pytest.mark.parametrize("tile", TILES)
def test_round_trip_error_within_e4m3_bound(tile) -> None:
    """e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; below the smallest
    normal (2^-6 in scaled units) the absolute error is at most half a subnormal step."""
    x = _with_outliers((3, 200, 300))
    q = quantize_tiles(x, tile)
    back = q.dequantize()
    tr, tc = q.tile
    scale = q.scale.repeat_interleave(tr, -2).repeat_interleave(tc, -1)[..., :200, :300]
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)
    assert back.shape == x.shape
    assert bool(((back - x).abs() <= bound).all())
    assert float((q.data.float().abs()).max()) <= FP8_MAX


def test_padding_and_scale_shapes() -> None:
    x = torch.randn(130, 200)
    act = quantize_tiles(x, (1, 128))
    assert act.data.shape == (130, 256) and act.scale.shape == (130, 2)
    w = quantize_tiles(x, (128, 128))
    assert w.data.shape == (256, 256) and w.scale.shape == (2, 2)
    assert bool((w.data[130:].float() == 0).all())  # padding is zeros
    assert quantize_tiles(x, (None, None)).scale.shape == (1, 1)


def test_amax_maps_to_fp8_max_and_small_integers_are_exact() -> None:
    x = torch.randint(-8, 9, (4, 256)).float()
    x[:, 0] = 448.0  # every row tile containing 448 gets scale 1
    x[:, 128] = 448.0
    q = quantize_tiles(x, (1, 128))
    assert torch.equal(q.scale, torch.ones(4, 2))
    assert torch.equal(q.dequantize(), x)


def test_transpose_of_square_blocks_is_exact() -> None:
    w = _with_outliers((300, 200))
    q = quantize_tiles(w, (128, 128))
    assert torch.equal(q.t().dequantize(), q.dequantize().T)
    assert q.t().tile == (128, 128)


def test_tiles_keep_small_rows_that_tensorwise_flushes() -> None:
    """Token magnitudes spread over orders of magnitude (as gradients do): one tensor-wise
    scale pushes the small rows into e4m3's subnormals or to zero, row tiles do not."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 1024, generator=g) * torch.exp(3 * torch.randn(256, 1, generator=g))

    def row_error(tile) -> float:
        d = (fake_quantize(x, tile) - x).norm(dim=1) / x.norm(dim=1)
        return float(d.mean())

    assert row_error((1, 128)) < 0.04
    assert row_error((1, 128)) < row_error((None, None)) / 5


def test_zero_tiles_and_bf16_inputs() -> None:
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[1, :4] = torch.tensor([448.0, -2.0, 0.5, 0.25])
    back = fake_quantize(x, (1, 128))
    assert back.dtype == torch.bfloat16 and torch.equal(back, x)  # zero tiles stay 0, no NaN


def test_training_dtypes_name_recipes() -> None:
    assert get_recipe("fp8") is get_recipe("tilewise")
    assert get_recipe("fp8-rowwise").act_tile == (1, None)


def test_unknown_recipe_and_1d_input_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="allowed: tilewise, rowwise, tensorwise"):
        get_recipe("blockwise")
    with pytest.raises(ConfigError, match=">= 2 dims"):
        quantize_tiles(torch.ones(3), (1, 128))
