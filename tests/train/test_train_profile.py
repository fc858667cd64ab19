"""``train.profile_steps``: traces and measured terms in the cost model's own terms."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from legato.cost import predict
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy
from legato.train.profile import StepProfiler, op_class, terms_table


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("aten::mm", "gemm"),
        ("aten::addmm", "gemm"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("flash_fwd_kernel", "attention"),
        ("aten::add_", "memory-bound"),
        ("aten::softmax", "memory-bound"),
        ("c10d::allreduce_", "comm:all_reduce"),
        ("c10d::_allgather_base_", "comm:all_gather"),
        ("c10d::_reduce_scatter_base_", "comm:reduce_scatter"),
        ("c10d::alltoall_base_", "comm:all_to_all"),
        ("c10d::send", "comm:p2p"),
        ("_c10d_functional::wait_tensor", "comm:wait"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm:all_gather"),
    ],
)
def test_ops_fall_in_the_cost_models_classes(name: str, kind: str) -> None:
    assert op_class(name) == kind


def test_measured_terms_add_up_to_the_step_and_sit_beside_the_prediction(tmp_path) -> None:
    """Three steps of matmuls and attention: the first warms up, two are measured; the
    classes and the host remainder add up to the step, and the table has both columns."""
    x = torch.randn(256, 256, requires_grad=True)
    profiler = StepProfiler(tmp_path, 0, torch.device("cpu"), steps=2)
    with profiler:
        for _ in range(3):
            with profiler.step():
                q = x[None, None]
                attn = torch.nn.functional.scaled_dot_product_attention(q, q, q)
                ((x @ x).relu().sum() + attn.sum()).backward()
            profiler.advance()
    assert profiler.done
    m = profiler.measured
    assert m.steps == 2 and m.step_time_s > 0
    assert m.compute_by_class_s["gemm"] > 0 and m.compute_by_class_s["attention"] > 0
    total = sum(m.compute_by_class_s.values()) + sum(m.exposed_comm_s.values()) + m.host_s
    assert total == pytest.approx(m.step_time_s, rel=1e-6)
    trace = json.loads((tmp_path / "profile" / "trace_rank0.json").read_text())
    assert trace["traceEvents"]
    cluster = load_cluster("local-cpu", devices_per_node=1)
    prediction = predict(load_model("tiny"), cluster, Strategy())
    doc = profiler.write_terms(prediction)
    assert json.loads((tmp_path / "profile" / "terms.json").read_text()) == doc
    assert doc["predicted"]["step_time_s"] == prediction.step_time_s
    lines = terms_table(doc)
    assert lines[1].startswith("step") and any(line.startswith("compute: gemm") for line in lines)


def test_a_two_process_run_writes_each_ranks_trace_and_measures_its_all_reduce(
    small_train_args, tmp_path
) -> None:
    run = tmp_path / "run"
    args = small_train_args(run, "--train.steps=3", "--parallel.cluster=none",
                            "--parallel.strategy=dp=2,zero=0", "--parallel.nproc=2")  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "legato.cli.main", "train", *args, "--profile"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    folder = run / "profile"
    assert {p.name for p in folder.iterdir()} == {"trace_rank0.json", "trace_rank1.json",
                                                  "terms.json"}  # fmt: skip
    doc = json.loads((folder / "terms.json").read_text())
    assert doc["measured"]["steps"] == 2  # steps 2 and 3; the first warmed up
    assert doc["measured"]["comm_s"]["all_reduce"] > 0  # DDP's gradient buckets
    assert doc["predicted"] is None  # parallel.cluster = none
    assert "profiled 2 steps" in out.stdout + out.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["profiled"] for r in records] == [True, True, True]  # warm-up and 2 measured
