"""Loading specs by preset name, from TOML/JSON files and dicts, and the one-line errors."""

from __future__ import annotations

import json

import pytest

from legato.errors import SpecError
from legato.specs import (
    DTYPES,
    list_clusters,
    list_devices,
    list_models,
    load_cluster,
    load_device,
    load_model,
)

GPT3_SIZES = ["1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b", "175b", "310.1b",
              "529.6b", "1008b"]  # fmt: skip
EXPECTED_MODELS = {
    *(f"gpt3-{size}" for size in GPT3_SIZES),
    *["llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"],
    *["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"],
    *["tiny", "tiny-gpt", "tiny-moe", "tiny-deepseek"],
}
EXPECTED_DEVICES = [
    "a100-40g",
    "a100-80g",
    "h100",
    "h200",
    "h800",
    "rtx4090",
    "ascend-910b",
    "ascend-910c",
    "cpu",
]
EXPECTED_CLUSTERS = [
    "dgx-a100",
    "dgx-h100",
    "hgx-h200",
    "h800",
    "rtx4090-pcie",
    "cloudmatrix384",
    "local-cpu",
]


def _one_line_error(match: str):
    return pytest.raises(SpecError, match=match)


def test_all_presets_present_and_load():
    assert set(list_models()) == EXPECTED_MODELS
    assert list_devices() == EXPECTED_DEVICES
    assert list_clusters() == EXPECTED_CLUSTERS
    for name in list_models():
        assert load_model(name).name == name
    for name in list_devices():
        device = load_device(name)
        assert set(device.peak_tflops) <= set(DTYPES)
        assert device.description
    for name in list_clusters():
        assert load_cluster(name).device.name in EXPECTED_DEVICES


def test_preset_shapes():
    qwen = load_model("qwen3-235b-a22b")
    assert (qwen.head_dim, qwen.qk_norm, qwen.moe.num_experts, qwen.moe.top_k) == (
        128,
        True,
        128,
        8,
    )
    assert qwen.moe.num_shared_experts == 0
    ds = load_model("deepseek-v3")
    assert ds.mla is not None and ds.moe.router_score == "sigmoid"
    assert ds.num_moe_layers == 58 and ds.moe.num_shared_experts == 1
    gpt = load_model("gpt3-175b")
    assert (gpt.num_layers, gpt.hidden_size, gpt.num_heads, gpt.ffn_hidden_size) == (
        96,
        12288,
        96,
        4 * 12288,
    )
    assert gpt.tied_embeddings and gpt.bias and gpt.position == "learned" and gpt.mlp == "gelu"


def test_devices():
    h100 = load_device("h100")
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=1e-3)
    assert h100.memory_bytes == 80 * 2**30
    with _one_line_error("device a100-80g has no fp8 peak; it supports fp32, tf32, bf16, fp16"):
        load_device("a100-80g").peak_flops("fp8")


def test_cluster_presets_and_nodes():
    dgx = load_cluster("dgx-a100", nodes=4)
    assert dgx.world_size == 32
    assert [lv.span for lv in dgx.levels] == [8, 32]
    assert dgx.levels[0].bandwidth_gbps == 300 and dgx.levels[1].bandwidth_gbps == 25
    cm = load_cluster("cloudmatrix384")
    assert cm.world_size == 384
    assert [lv.span for lv in cm.levels] == [8, 384, 384]
    cm2 = load_cluster("cloudmatrix384", nodes=96)
    assert [lv.span for lv in cm2.levels] == [8, 384, 768]
    assert load_cluster("local-cpu", devices_per_node=4).world_size == 4


def test_model_user_files_toml_and_json(tmp_path):
    toml = tmp_path / "mine.toml"
    toml.write_text(
        "hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nvocab_size = 300\nseq_len = 32\n"
        "[moe]\nnum_experts = 4\ntop_k = 1\nexpert_ffn_hidden_size = 96\n"
    )
    spec = load_model(toml)
    assert spec.name == "mine" and spec.moe.num_experts == 4
    data = {"name": "j", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 300,
            "seq_len": 32, "mla": {"kv_lora_rank": 16, "qk_nope_head_dim": 8,
                                   "qk_rope_head_dim": 8, "v_head_dim": 8}}  # fmt: skip
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert load_model(str(path)).mla.kv_lora_rank == 16
    assert load_model(data) == load_model(path)


def test_cluster_user_files(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(
        'device = "h100"\nnodes = 4\ndevices_per_node = 4\n'
        "[intra_node]\nbandwidth_gbps = 100\nlatency_us = 3\n"
        "[inter_node]\nbandwidth_gbps = 12.5\nlatency_us = 10\n"
    )
    lab = load_cluster(path)
    assert lab.name == "lab" and lab.world_size == 16
    assert [(lv.span, lv.bandwidth_gbps, lv.latency_us) for lv in lab.levels] == [
        (4, 100, 3),
        (16, 12.5, 10),
    ]
    assert load_cluster(path, nodes=2).world_size == 8
    # its own unnamed link is not labelled with the device's ("NVLink 4 ...")
    assert lab.levels[0].name == "intra-node (100 GB/s per direction)"
    # A supernode level; the intra-node link defaults to the device's own.
    table = {"device": "ascend-910c", "nodes": 4, "devices_per_node": 8,
             "supernode": {"bandwidth_gbps": 392, "latency_us": 3, "nodes": 2},
             "inter_node": {"bandwidth_gbps": 50, "latency_us": 8}}  # fmt: skip
    json_path = tmp_path / "sn.json"
    json_path.write_text(json.dumps(table))
    sn = load_cluster(json_path)
    assert [lv.span for lv in sn.levels] == [8, 16, 32]
    assert sn.levels[0].name == load_device("ascend-910c").link.name


@pytest.mark.parametrize(
    ("load", "name", "message"),
    [
        (load_model, "llama2-7", r"^unknown model 'llama2-7' \(did you mean 'llama2-7b'\?\); known models: "),
        (load_device, "b200", r"^unknown device 'b200'.*; known devices: a100-40g, a100-80g"),
        (load_cluster, "dgx-b200", r"^unknown cluster 'dgx-b200'.*known clusters: dgx-a100"),
    ],
)  # fmt: skip
def test_unknown_preset(load, name, message):
    with _one_line_error(message):
        load(name)


BASE_MODEL = "hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nvocab_size = 300\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hidden_size = = 3\n", r"bad\.toml: malformed TOML"),
        (BASE_MODEL + 'seq_len = "long"\n', r"bad\.toml: model\.seq_len: expected an integer, got 'long'"),
        (BASE_MODEL, r"bad\.toml: model\.seq_len: required field is missing"),
        (BASE_MODEL + "seq_len = 8\nlayers = 3\n", r"bad\.toml: model\.layers: unknown field"),
        (BASE_MODEL + 'seq_len = 8\nmlp = "relu"\n', r"model\.mlp: must be one of 'gelu' \| 'swiglu'"),
        (BASE_MODEL + "seq_len = 8\n[moe]\nnum_experts = 4\ntop_k = 5\nexpert_ffn_hidden_size = 8\n",
         r"bad\.toml: moe\.top_k must be between 1 and moe\.num_experts \(4\), got 5"),
    ],
)  # fmt: skip
def test_bad_model_files(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with _one_line_error(message) as info:
        load_model(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"nodes": 2, "devices_per_node": 8}, r"cluster\.device: required field is missing"),
        ({"device": "h100", "devices_per_node": "eight"}, r"cluster\.devices_per_node: expected an integer"),
        ({"device": "h100", "devices_per_node": 8, "nodes": 2}, r"cluster\.inter_node: required for 2 nodes"),
        ({"device": "h100", "devices_per_node": 8, "intra_node": {"bandwidth_gbps": 1}},
         r"cluster\.intra_node\.latency_us: required field is missing"),
        ({"device": "h100", "devices_per_node": 8, "intra_node": {"bandwidth_gbps": 0, "latency_us": 1}},
         r"^cluster\.intra_node: .*bandwidth_gbps must be > 0, got 0"),
        ({"device": "tpu", "devices_per_node": 8}, r"unknown device 'tpu'"),
        ({"device": "h100", "devices_per_node": 0}, r"devices_per_node must be >= 1"),
    ],
)  # fmt: skip
def test_bad_cluster_tables(table, message):
    with _one_line_error(message):
        load_cluster(table)


def test_bad_device_table():
    table = {"name": "x", "peak_tflops": {"int4": 1.0}, "memory_gib": 1,
             "memory_bandwidth_gbps": 1, "link": {"name": "l", "bandwidth_gbps": 1, "latency_us": 1}}  # fmt: skip
    with _one_line_error(r"peak_tflops\.int4: unknown dtype; allowed: fp32, tf32, bf16, fp16, fp8"):
        load_device(table)


def test_missing_file():
    with _one_line_error(r"nowhere\.toml: file not found"):
        load_model("nowhere.toml")
