"""FP8 numerics: tile-wise GEMM error vs tensor-wise FP8, and a tiny model trained in FP8.

Part 1 (``metric: gemm_row_rel_error``, lower is better): ``y = x @ w.T`` against the fp32
product, as the mean over rows of ``|y_i - y_ref_i| / |y_ref_i|`` (every token counts
equally). Inputs: Gaussian; sparse outlier values (0.1% of entries at 1e3, 1e4, 1e5 x);
outlier channels (8 of K at 100 x); tokens whose magnitudes spread over orders of magnitude
(log-normal, sigma 3, as gradients do), both as the forward/dgrad operand and in the
weight-gradient GEMM, which contracts over tokens; weights whose 128x128 blocks differ in
scale (log-normal, sigma 2). ``value`` is tile-wise FP8 (1x128 activations, 128x128 weights, emulated),
``baseline`` tensor-wise FP8 (ours; torchao's ``Float8Linear`` tensor-wise gives identical
errors, checked in ``extra`` at the ``--quick`` size), ``ratio = value / baseline``; our
row-wise, torchao's row-wise ``Float8Linear`` and bf16 errors are in ``extra``. torchao
(the ``dev`` extra) is required: without it the benchmark stops with one line rather than
printing rows that silently lack the comparison.

Part 2 (``metric: final_loss``): preset ``tiny`` on the built-in corpus (byte tokenizer)
trained for ``--steps`` steps in fp32 and with every block linear in tile-wise FP8
(emulated), same data and initialisation; ``ratio`` = FP8 / fp32 final loss (mean of the
last 10% of steps); the largest gap of the smoothed curves is in ``extra``.

    python benchmarks/fp8_numerics.py [--quick] [--steps N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from legato.data import ByteTokenizer, PackedDataset, builtin_corpus_path, prepare_tokens
from legato.models import build_model
from legato.precision import convert_to_fp8, fake_quantize, get_recipe
from legato.specs import load_model
from report import print_row, result_row

BENCHMARK = "fp8_numerics"


def _torchao_linear(recipe: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """torchao's float8 training linear as a function of (x, w); exits if torchao is missing."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise SystemExit(
            f"fp8_numerics: torchao is needed for its comparison columns ({exc}); "
            "install it with pip install -e '.[dev]'"
        ) from None

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        layer = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False))
        layer[0].weight.data.copy_(w)
        convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(recipe))
        with torch.no_grad():
            return layer(x).float()

    return run


def _ours(recipe: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    r = get_recipe(recipe)
    return lambda x, w: fake_quantize(x, r.act_tile) @ fake_quantize(w, r.weight_tile).T


CASES = (
    "gaussian",
    "outlier_values_1e3",
    "outlier_values_1e4",
    "outlier_values_1e5",
    "outlier_channels",
    "token_spread",
    "wgrad_token_spread",
    "weight_block_spread",
)


def _operands(case: str, t: int, k: int, n: int, g: torch.Generator):
    """(a, b) of the GEMM ``a @ b.T``; ``a`` is the activation-like operand."""
    x = torch.randn(t, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    if case.startswith("outlier_values"):
        scale = float(case.rsplit("_", 1)[1])
        x = torch.where(torch.rand(t, k, generator=g) < 1e-3, x * scale, x)
    elif case == "outlier_channels":
        x[:, torch.randperm(k, generator=g)[:8]] *= 100.0
    elif case == "token_spread":
        x = x * torch.exp(3.0 * torch.randn(t, 1, generator=g))
    elif case == "wgrad_token_spread":  # dW = dY.T @ X: contraction over tokens
        dy = torch.randn(k, n, generator=g) * torch.exp(3.0 * torch.randn(k, 1, generator=g))
        return dy.T.contiguous(), torch.randn(k, t, generator=g).T.contiguous()
    elif case == "weight_block_spread":
        blocks = torch.exp(2.0 * torch.randn(-(-n // 128), -(-k // 128), generator=g))
        w = w * blocks.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return x, w


def _row_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((y - ref).norm(dim=1) / ref.norm(dim=1)).mean())


def gemm_errors(t: int, k: int, n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ao_row = _torchao_linear("rowwise")
    # torchao's tensor-wise path runs CPU torch._scaled_mm with one scale, which takes
    # minutes at 512 x 1024 x 512; at the --quick size it equals ours bit for bit.
    # Above that size the torchao_tensorwise column is null (skipped), not missing.
    ao_tensor = _torchao_linear("tensorwise") if t * k * n <= 1 << 25 else None
    rows = []
    for case in CASES:
        x, w = _operands(case, t, k, n, g)
        ref = x @ w.T
        errors = {
            "tilewise": _row_error(_ours("tilewise")(x, w), ref),
            "rowwise": _row_error(_ours("rowwise")(x, w), ref),
            "tensorwise": _row_error(_ours("tensorwise")(x, w), ref),
            "bf16": _row_error((x.bfloat16() @ w.bfloat16().T).float(), ref),
        }
        errors["torchao_rowwise"] = _row_error(ao_row(x, w), ref)
        errors["torchao_tensorwise"] = _row_error(ao_tensor(x, w), ref) if ao_tensor else None
        errors["ratio_vs_rowwise"] = errors["tilewise"] / errors["rowwise"]
        rows.append(
            result_row(
                BENCHMARK,
                {"inputs": case, "shape": [*x.shape, w.shape[0]]},
                "gemm_row_rel_error",
                errors["tilewise"],
                "tensorwise",
                errors["tensorwise"],
                extra=errors,
            )
        )
    return rows


def train_losses(
    fp8: bool, steps: int, tokens, seq_len: int, batch: int
) -> tuple[list[float], float]:
    spec = load_model("tiny").with_(vocab_size=ByteTokenizer.vocab_size, seq_len=seq_len)
    model = build_model(spec, seed=0)
    if fp8:
        convert_to_fp8(model, "tilewise", backend="emulated")
    data = PackedDataset(tokens, seq_len, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    losses, start = [], time.perf_counter()
    for _ in range(steps):
        inputs, labels = data.next_batch(batch)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def _smooth(xs: list[float], w: int) -> list[float]:
    return [
        sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1])
        for i in range(len(xs))
    ]


def training_row(steps: int, seq_len: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        path = builtin_corpus_path(cache, seed=0, target_bytes=1_000_000)
        tokens = prepare_tokens(path, ByteTokenizer())
    ref, ref_s = train_losses(False, steps, tokens, seq_len, batch)
    fp8, fp8_s = train_losses(True, steps, tokens, seq_len, batch)
    tail = max(1, steps // 10)
    final_ref, final_fp8 = sum(ref[-tail:]) / tail, sum(fp8[-tail:]) / tail
    w = max(1, steps // 20)
    gap = max(abs(a - b) for a, b in zip(_smooth(ref, w), _smooth(fp8, w), strict=True))
    return result_row(
        BENCHMARK,
        {"preset": "tiny", "steps": steps, "seq_len": seq_len, "batch": batch},
        "final_loss",
        final_fp8,
        "fp32",
        final_ref,
        extra={
            "first_loss": ref[0],
            "max_smoothed_gap": gap,
            "fp8_seconds": fp8_s,
            "fp32_seconds": ref_s,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small GEMMs and 60 steps")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = (256, 512, 256) if args.quick else (512, 1024, 512)
    for row in gemm_errors(*shape):
        print_row(row)
    steps = args.steps or (60 if args.quick else 300)
    print_row(training_row(steps, seq_len=128, batch=8))


if __name__ == "__main__":
    main()
