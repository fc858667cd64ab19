"""The cost model against published training runs, per source table.

No constant is fitted on these rows: the device profiles come from micro-benchmarks only
(``legato.devices``), so every figure here is out of sample. The bounds are regression
guards just above what the mechanism-based model reaches (BENCHMARKS.md, cost-model
section; the issue's goal is 20% per source and 15% over sources). Known misses: MT-NLG's
DeepSpeed run was ~25% slower per GPU than Megatron-LM's on the same model and GPUs
(Korthikanti's Table 5, which the model matches); vTrain's small GPTs are host-bound and
the per-kernel host cost is a published prior, not a measurement (docs/cost_model.md);
MosaicML's attention kernels are priced by the A100 law fitted on serving prefill rows.
"""

from __future__ import annotations

import pytest

from legato.cost.published import build_case, errors_by_source, evaluate, read_rows

# mean absolute error bound per source (prefix of its name), just above today's figure
BOUNDS = {
    "Narayanan2021": 0.065,
    "Korthikanti2022 Table": 0.065,
    "Korthikanti2022 text": 0.03,
    "Smith2022": 0.22,
    # the stages that ran (embedding and head as pipeline layers): the 128-layer stand-in
    # it replaced timed two blocks that do not exist and hid H100's over-prediction (13.4%)
    "Llama3": 0.21,
    "pytorch/torchtitan": 0.045,
    "MosaicML llm-foundry, A100 80GB": 0.195,
    "MosaicML llm-foundry, A100 40GB": 0.205,
    "vTrain": 0.295,
}


@pytest.fixture(scope="module")
def results():
    return evaluate()


def test_every_row_is_predicted(results):
    assert len(results) == len(read_rows())
    assert all(r.predicted > 0 for r in results)


def test_mean_error_per_table(results):
    """Out of sample (profiles fitted on micro-benchmarks only): each table within its
    regression bound."""
    errors = errors_by_source(results)
    assert len(errors) == 9
    for source, (mean, _, _) in errors.items():
        (bound,) = [b for k, b in BOUNDS.items() if source.startswith(k)]
        assert mean < bound, f"{source}: mean error {mean:.1%}"


def test_rows_map_to_the_sources_layout():
    rows = {row["row_id"]: row for row in read_rows()}
    ptdp = build_case(rows["ptdp-1008B"])
    assert (ptdp.strategy.tp, ptdp.strategy.pp, ptdp.strategy.dp) == (8, 64, 6)
    assert ptdp.strategy.num_microbatches == 512 and ptdp.strategy.recompute == "full"
    seqsel = build_case(rows["seqsel-175B-selective+SP"])
    assert seqsel.strategy.sp and seqsel.strategy.recompute == "selective"
    assert seqsel.strategy.vpp == 3 and not seqsel.runtime.flash_attention
    llama = build_case(rows["llama3-405b-16384-cp16"])
    assert llama.counted.num_layers == 126 and llama.model.seq_len == 131072
    assert llama.cluster.world_size == 16384 and llama.strategy.cp == 16
    titan = build_case(rows["titan-Llama2-70B-full-2"])
    assert titan.model.num_kv_heads == 8 and titan.strategy.zero == 3


def test_every_mosaicml_run_fits_its_gpu(results):
    """They all ran: A100-40GB rows included (MPT-350M at micro-batch 18 fits once the
    PURE bf16 loss keeps its logits in bf16)."""
    mosaic = [r for r in results if r.case.family == "MosaicML"]
    assert len(mosaic) == 139
    assert [r.case.row["row_id"] for r in mosaic if not r.fits] == []
