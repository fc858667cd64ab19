"""One process: FP8 training, activation swap and the chunked loss from the strategy, and
the one-line errors of expert-parallel strategies the trainer does not run."""

from __future__ import annotations

import pytest

from legato.precision import Fp8Linear
from legato.train.config import load_config
from legato.train.trainer import Trainer


def _trainer(small_train_args, run, *extra: str) -> tuple[Trainer, list[float]]:
    trainer = Trainer(load_config(None, small_train_args(run, "--parallel.nproc=1", *extra)))
    return trainer, trainer.fit().losses


def test_fp8_trains_close_to_fp32(small_train_args, tmp_path) -> None:
    """Tile-wise FP8 block linears (bf16 elsewhere, fp32 masters) track fp32 within 0.1."""
    _, fp32 = _trainer(small_train_args, tmp_path / "a", "--train.steps=3")
    trainer, fp8 = _trainer(
        small_train_args, tmp_path / "b", "--train.steps=3", "--train.dtype=fp8"
    )
    assert fp8[-1] < fp8[0]
    assert fp8 == pytest.approx(fp32, abs=0.1) and fp8 != fp32
    linears = {type(m).__name__ for n, m in trainer.model.named_modules() if n.endswith("_proj")}
    assert linears == {"Fp8Linear"}
    assert not isinstance(trainer.model.lm_head, Fp8Linear)
    assert all(
        p.dtype.is_floating_point and p.dtype.itemsize == 4 for p in trainer.model.parameters()
    )


@pytest.mark.parametrize("option", ["swap=1", "loss_chunk=96", "swap=1,loss_chunk=96"])
def test_swap_and_chunked_loss_equal_the_plain_run(option, small_train_args, tmp_path) -> None:
    _, plain = _trainer(small_train_args, tmp_path / "a", "--train.steps=3")
    trainer, got = _trainer(
        small_train_args, tmp_path / "b", "--train.steps=3", f"--parallel.strategy={option}"
    )
    if "swap" in option:  # activations really went to the host and came back
        assert trainer.swap.stats.to_host > 0 and trainer.swap.stats.to_device > 0
    else:
        assert trainer.swap is None
    assert got == pytest.approx(plain, abs=1e-5, rel=0)


@pytest.mark.parametrize(
    ("strategy", "extra", "message"),
    [
        ("ep=4", [], r"ep \(4\) must divide tp\*dp\*cp \(2\)"),
        (
            "pp=2,schedule=zb-h1,recompute=full",
            ["--train.moe_aux_loss_coef=0"],
            r"recompute=full with zb-h1 is not executed",
        ),
    ],
)
def test_unsupported_layouts_are_one_line_errors(
    strategy, extra, message, small_train_args, tmp_path
):
    args = small_train_args(
        tmp_path, "--model.preset=tiny-moe", "--model.overrides={num_layers = 2}", *extra
    )
    with pytest.raises(Exception, match=message) as info:
        config = load_config(None, [*args, f"--parallel.strategy={strategy}"])
        config.job(Trainer(config).spec, 2)
    assert "\n" not in str(info.value)


def test_ep_smaller_than_dp_holds_each_expert_on_several_ranks(small_train_args, tmp_path) -> None:
    args = [*small_train_args(tmp_path), "--train.micro_batch_size=2"]
    config = load_config(None, [*args, "--parallel.strategy=ep=2"])
    config.model.preset = "tiny-moe"
    config.model.overrides = {"num_layers": 2}
    assert config.job(Trainer(config).spec, 4).strategy.expert_dp == 2
