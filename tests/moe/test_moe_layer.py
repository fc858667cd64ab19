"""The dropless layer against a per-token loop, every schedule's decomposition against the
plain layer (one process), and the statistics it records."""

from __future__ import annotations

import pytest
import torch
from moe_testlib import CONFIGS, grads, make_layer, per_token_reference, tokens

from legato.errors import ConfigError, SpecError
from legato.moe import Overlap
from legato.moe.chunked_overlap import column_slices
from legato.specs.model import MoESpec


@pytest.mark.parametrize("impl", ["auto", "loop"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_dropless_layer_equals_per_token_loop(name, impl):
    layer = make_layer(name)
    layer.experts.gemm_impl = impl
    hidden = CONFIGS[name][0]
    x = tokens(11, hidden, seed=2).view(1, 11, hidden).requires_grad_()
    out = layer(x)
    expected = per_token_reference(layer, x)
    torch.testing.assert_close(out, expected)

    params = list(layer.parameters())
    ours = grads(out, [x, *params])
    theirs = grads(expected, [x, *params])
    for (pname, _), a, b in zip(layer.named_parameters(), ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(a, b, msg=pname)
    torch.testing.assert_close(ours[0], theirs[0])

    counts = layer.last_expert_counts
    assert counts.sum() == 11 * layer.top_k  # dropless: every slot is computed
    assert counts[-1] == 0  # an expert with no tokens...
    idle_grad = ours[1 + [n for n, _ in layer.named_parameters()].index("experts.up_proj")][-1]
    assert torch.count_nonzero(idle_grad) == 0  # ...gets a zero gradient, not None


SCHEDULES = [
    Overlap.domino(),
    Overlap.domino(chunks=3, groups=2),
    Overlap.comet(chunks=1, groups=1),
    Overlap.comet(chunks=2, groups=2),
    Overlap.comet(chunks=3, groups=4),
]


@pytest.mark.parametrize("overlap", SCHEDULES, ids=lambda o: f"{o.schedule}-{o.chunks}-{o.groups}")
def test_schedules_decompose_without_changing_results(overlap):
    plain = make_layer("gelu-sigmoid-bias-shared")
    other = make_layer("gelu-sigmoid-bias-shared")
    other.overlap = overlap
    x = tokens(9, 16, seed=3).requires_grad_()
    out, expected = other(x), plain(x)
    torch.testing.assert_close(out, expected)
    for a, b in zip(
        grads(out, [x, *other.parameters()]), grads(expected, [x, *plain.parameters()]), strict=True
    ):
        torch.testing.assert_close(a, b)


def test_experts_compute_in_the_autocast_dtype():
    layer = make_layer("swiglu-softmax")
    x = tokens(8, 16, seed=4)
    seen = []
    original = layer.experts.hidden
    layer.experts.hidden = lambda rows, *a: seen.append(rows.dtype) or original(rows, *a)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert seen == [torch.bfloat16]
    torch.testing.assert_close(out.float(), layer(x), atol=0.05, rtol=0.05)
    out.float().sum().backward()
    assert layer.experts.up_proj.grad.dtype == torch.float32


def test_column_slices_cover_the_width_in_aligned_groups():
    assert column_slices(64, 3) == [slice(0, 16), slice(16, 40), slice(40, 64)]
    assert column_slices(10, 3) == [slice(0, 3), slice(3, 6), slice(6, 10)]
    assert column_slices(4, 8) == [slice(i, i + 1) for i in range(4)]


def test_layer_records_losses_and_counts():
    layer = make_layer("swiglu-softmax")
    layer(tokens(6, 16, seed=5))
    assert layer.last_expert_counts.tolist() == layer.gate.load.long().tolist()
    assert layer.last_aux_loss.requires_grad and layer.last_z_loss.requires_grad
    assert layer.last_aux_loss.item() >= 1.0 - 1e-6  # 1 only when perfectly balanced


@pytest.mark.parametrize(
    ("make", "error", "field"),
    [
        (lambda: Overlap("pipelined"), ConfigError, "moe.overlap.schedule"),
        (lambda: Overlap.comet(chunks=0), ConfigError, "moe.overlap.chunks"),
        (lambda: Overlap("plain", groups=2), ConfigError, "moe.overlap.groups"),
        (lambda: MoESpec(num_experts=4, top_k=5, expert_ffn_hidden_size=8), SpecError, "moe.top_k"),
    ],
)
def test_bad_settings_raise_one_line_errors_naming_the_field(make, error, field):
    with pytest.raises(error, match=field) as info:
        make()
    assert "\n" not in str(info.value)
