import re

import pytest

from legato.specs.registry import load_model
from legato.specs.strategy import Strategy, StrategyError


def test_parse_round_trip_and_2d_tp():
    s = Strategy.parse("dp=32,tp=4x2,pp=4,vpp=2,schedule=interleaved,mbs=1,gbs=512,sp=1")
    assert (s.tp, s.tp_x, s.tp_y, s.sp) == (8, 4, 2, True)
    assert s.world_size == 32 * 8 * 4
    assert s.num_microbatches == 16
    assert Strategy.parse(s.to_string()) == s


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("dp=2,tq=2", "bad item 'tq=2'"),
        ("dp=two", "strategy.dp must be an integer"),
        ("dp=0", "strategy.dp must be >= 1"),
        ("recompute=some", "strategy.recompute must be one of none, selective, full"),
        ("schedule=magic", "strategy.schedule must be one of"),
        ("tp=3,tp_y=2", "bad item 'tp_y=2'"),
        ("ep=2,moe_overlap=fast", "strategy.moe_overlap must be one of none, domino, comet"),
        ("moe_overlap=comet,moe_chunks=0", "strategy.moe_chunks must be >= 1"),
        ("moe_groups=2", "moe_groups=2 need moe_overlap domino or comet"),
        ("swap=maybe", "strategy.swap must be 0/1/true/false"),
        ("loss_chunk=-1", "strategy.loss_chunk must be >= 0"),
        ("loss_chunk=4k", "strategy.loss_chunk must be an integer"),
    ],
)
def test_malformed_strategy_is_one_line_error(text, fragment):
    with pytest.raises(StrategyError, match=fragment) as err:
        Strategy.parse(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text, devices, fragment",
    [
        ("dp=4,tp=2", 16, "must equal the device count 16"),
        ("tp=3,dp=1", 3, "tp \\(3\\) must divide num_heads \\(32\\)"),
        ("pp=64,gbs=128", 64, "pp\\*vpp \\(64\\) must be at most num_layers \\(32\\)"),
        ("dp=4,mbs=3,gbs=16", 4, "gbs \\(16\\) must be a multiple of mbs\\*dp"),
        ("pp=4,gbs=2,schedule=zb-h1", 4, "zb-h1 needs at least pp=4 micro-batches"),
        ("pp=2,vpp=2,gbs=8", 2, "vpp=2 needs schedule interleaved"),
        ("dp=2,ep=2,gbs=2", 2, "ep/etp need an MoE model"),
        ("dp=2,gbs=2,moe_overlap=domino", 2, "moe_overlap=domino needs an MoE model"),
    ],
)
def test_strategy_that_does_not_fit_names_the_constraint(text, devices, fragment):
    with pytest.raises(StrategyError, match=fragment):
        Strategy.parse(text).check(load_model("llama2-7b"), devices)


def test_expert_parallel_constraints():
    mixtral = load_model("mixtral-8x7b")
    Strategy.parse("dp=8,ep=8,gbs=8").check(mixtral, 8)
    with pytest.raises(StrategyError, match=r"ep \(3\) must divide moe\.num_experts"):
        Strategy.parse("dp=3,ep=3,gbs=3,tp=1").check(mixtral.with_(num_layers=32), 3)


def test_2d_tensor_parallel_splits_heads_over_tp_y_only():
    llama = load_model("llama3-8b")  # 32 heads, 8 KV heads
    Strategy.parse("tp=2x8,gbs=1").check(llama, 16)  # tp=16 > 8 KV heads, but tp_y=8 divides
    with pytest.raises(StrategyError, match=r"tp_y \(16\) must divide num_kv_heads \(8\)"):
        Strategy.parse("tp=1x16,gbs=1").check(llama, 16)


def test_device_techniques_round_trip():
    text = "dp=8,ep=8,gbs=8,moe_overlap=comet,moe_chunks=4,moe_groups=2,swap=1,loss_chunk=4096"
    s = Strategy.parse(text)
    assert (s.moe_overlap, s.moe_chunks, s.moe_groups) == ("comet", 4, 2)
    assert s.swap is True and s.loss_chunk == 4096
    assert Strategy.parse(s.to_string()) == s
    assert s.to_string().endswith(
        "moe_overlap=comet,moe_chunks=4,moe_groups=2,swap=1,loss_chunk=4096"
    )
    plain = Strategy.parse("dp=8,gbs=8,swap=false,loss_chunk=0")
    assert plain == Strategy(dp=8, gbs=8)
    assert "swap" not in plain.to_string() and "moe" not in plain.to_string()
    assert Strategy.parse("dtype=fp8").dtype == "fp8"


def test_moe_overlap_needs_expert_parallelism_without_expert_tp():
    mixtral = load_model("mixtral-8x7b")
    Strategy.parse("dp=8,ep=8,gbs=8,moe_overlap=domino,moe_chunks=2").check(mixtral, 8)
    with pytest.raises(StrategyError, match=r"moe_overlap=comet needs ep > 1") as err:
        Strategy.parse("dp=8,gbs=8,moe_overlap=comet").check(mixtral, 8)
    assert "\n" not in str(err.value)
    with pytest.raises(StrategyError, match=r"moe_overlap=comet needs etp=1"):
        Strategy.parse("dp=4,tp=2,ep=4,etp=2,sp=1,gbs=4,moe_overlap=comet").check(mixtral, 8)


def test_expert_parallelism_folds_over_tensor_parallel_ranks_when_dp_cp_is_too_small():
    """Megatron-Core's MoE parallel folding: ep=16 with tp=4 x dp=8 (Qwen3-235B's layout)
    is accepted; it needs etp=1, 1-D tp with sp, and ep dividing tp*dp*cp."""
    qwen = load_model("qwen3-235b-a22b")
    folded = Strategy.parse("dp=8,tp=4,sp=1,pp=8,ep=16,gbs=64")
    folded.check(qwen, 256)
    assert folded.folded_ep and folded.expert_dp == 2
    plain = Strategy.parse("dp=8,tp=4,sp=1,ep=8,gbs=8")
    assert not plain.folded_ep and plain.expert_dp == 1
    for text, fragment in [
        ("dp=8,tp=4,pp=8,ep=16,gbs=64", r"folds over tensor-parallel ranks: that needs etp=1"),
        ("dp=8,tp=4,sp=1,pp=8,ep=16,etp=2,gbs=64", r"got etp=2, tp=4x1, sp=1"),
        ("dp=8,tp=4,sp=1,pp=8,ep=64,gbs=64", r"ep \(64\) must divide tp\*dp\*cp \(32\)"),
    ]:
        with pytest.raises(StrategyError, match=fragment):
            Strategy.parse(text).check(qwen, 256)


def test_megatrons_uneven_pipeline_splits():
    """The first/last rank's blocks given (the rest split evenly), or the embedding and
    the loss counted as layers (their stages hold one block fewer, none when one deep):
    Llama 3 405B's 126 layers + embedding + head fill 16 x 8 one-layer chunks."""
    from legato.specs.strategy import stage_layers

    def split(layers: int, text: str) -> tuple[int, ...]:
        return stage_layers(layers, Strategy.parse(f"{text},gbs=64"))

    llama = split(126, "pp=16,vpp=8,schedule=interleaved,embedding_stage=1,loss_stage=1")
    assert llama == (0, *[1] * 126, 0)
    assert split(61, "pp=16,first_stage_layers=1") == (1, *[4] * 15)  # DeepSeek-V3's 61
    assert split(30, "pp=4,first_stage_layers=6,last_stage_layers=6") == (6, 9, 9, 6)
    assert split(4, "pp=2,schedule=interleaved,vpp=2,loss_stage=1") == (2, 1, 1, 0)
    # ZB-V: rank 0 holds virtual stages 0 and 2p - 1, and gives each its share
    assert split(14, "pp=4,schedule=zb-v,vpp=2,first_stage_layers=2") == (1, 2, 2, 2, 2, 2, 2, 1)
    assert split(10, "pp=2") == (5, 5)  # balanced when none is given


@pytest.mark.parametrize(
    ("layers", "text", "fragment"),
    [
        (4, "pp=2,first_stage_layers=4", "leave 0 of num_layers (4) to the other 1"),
        (5, "pp=3,first_stage_layers=2", "they must split them evenly"),
        (4, "pp=2,embedding_stage=1,first_stage_layers=1", "not both (as Megatron-LM)"),
        (4, "embedding_stage=1", "they need pp > 1"),
        (2, "pp=2,schedule=interleaved,vpp=2,first_stage_layers=1", "without a layer"),
    ],
)
def test_uneven_splits_that_cannot_be_built_are_one_line_errors(layers, text, fragment):
    from legato.specs.strategy import stage_layers

    with pytest.raises(StrategyError, match=re.escape(fragment)) as err:
        stage_layers(layers, Strategy.parse(f"{text},gbs=8"))
    assert "\n" not in str(err.value)
