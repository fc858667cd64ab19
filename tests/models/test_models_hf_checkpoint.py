"""Hugging Face name map and safetensors files: round trips and strict error reports."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from legato.errors import CheckpointError
from legato.models import build_model, load_hf_state_dict, load_safetensors, save_safetensors
from legato.models.hf_checkpoint import to_hf_state_dict


def _ids(spec):
    return torch.randint(0, spec.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))


def test_safetensors_round_trip_gives_identical_logits(zoo_spec, tmp_path):
    source = build_model(zoo_spec, seed=1)
    written = save_safetensors(source, tmp_path)
    assert [p.name for p in written] == ["model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    fresh = build_model(zoo_spec, seed=2)
    load_safetensors(fresh, tmp_path)
    assert torch.equal(fresh(_ids(zoo_spec)), source(_ids(zoo_spec)))


def test_moe_experts_are_per_expert_tensors_in_hf_names(zoo, tmp_path):
    model = build_model(zoo["deepseek"], seed=0)
    save_safetensors(model, tmp_path)
    keys = set(load_file(tmp_path / "model.safetensors"))
    layer = "model.layers.1.mlp"
    for j in range(4):
        for name in ("gate_proj", "up_proj", "down_proj"):
            assert f"{layer}.experts.{j}.{name}.weight" in keys
    assert f"{layer}.gate.weight" in keys
    assert f"{layer}.gate.e_score_correction_bias" in keys
    assert f"{layer}.shared_experts.down_proj.weight" in keys
    assert not any(k.endswith("experts.gate_proj") for k in keys)
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # first layer is dense
    state = to_hf_state_dict(model)
    stacked = model.blocks[1].mlp.experts.down_proj
    assert torch.equal(state[f"{layer}.experts.2.down_proj.weight"], stacked[2])


def test_mixtral_style_names(zoo, tmp_path):
    model = build_model(zoo["mixtral"], seed=0)  # spec name "mixtral-mini": Mixtral style
    state = to_hf_state_dict(model)
    prefix = "model.layers.0.block_sparse_moe"
    assert f"{prefix}.gate.weight" in state
    w1, w3, w2 = (state[f"{prefix}.experts.1.{w}.weight"] for w in ("w1", "w3", "w2"))
    experts = model.blocks[0].mlp.experts
    assert torch.equal(w1, experts.gate_proj[1])
    assert torch.equal(w3, experts.up_proj[1])
    assert torch.equal(w2, experts.down_proj[1])
    assert not any(".mlp." in k for k in state)
    # The same model in Qwen style loads from a Qwen-style file.
    save_safetensors(model, tmp_path, hf_style="qwen")
    fresh = build_model(zoo["mixtral"], seed=3)
    load_safetensors(fresh, tmp_path, hf_style="qwen")
    assert torch.equal(fresh(_ids(zoo["mixtral"])), model(_ids(zoo["mixtral"])))


def test_expert_biases_map_to_per_expert_bias_tensors(zoo):
    state = to_hf_state_dict(build_model(zoo["gelu-moe"], seed=0))
    assert state["model.layers.0.mlp.experts.3.up_proj.bias"].shape == (24,)
    assert state["model.layers.0.mlp.experts.3.down_proj.bias"].shape == (32,)


def test_sharded_save_writes_index_and_loads(zoo, tmp_path):
    spec = zoo["deepseek"]
    model = build_model(spec, seed=4)
    save_safetensors(model, tmp_path)  # a single file first: the sharded save replaces it
    written = save_safetensors(model, tmp_path, max_shard_bytes=20_000)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" not in names
    assert "model.safetensors.index.json" in names
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 2 and len(written) == len(shards) + 1
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(to_hf_state_dict(model))
    assert set(index["weight_map"].values()) == set(shards)
    fresh = build_model(spec, seed=5)
    load_safetensors(fresh, tmp_path / "model.safetensors.index.json")
    assert torch.equal(fresh(_ids(spec)), model(_ids(spec)))
    # Saving small again removes the stale shards and index.
    save_safetensors(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_strict_errors_name_first_key_and_count(zoo):
    model = build_model(zoo["deepseek"], seed=0)
    state = dict(to_hf_state_dict(model))

    missing = {k: v for k, v in state.items() if ".experts.3." not in k}
    with pytest.raises(
        CheckpointError, match=r"3 missing key\(s\), first 'model\.layers\.1\.mlp\.experts\.3\."
    ):
        load_hf_state_dict(model, missing)

    extra = {**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"1 unexpected key\(s\), first 'model\.layers\.9"):
        load_hf_state_dict(model, extra)

    wrong = {**state, "model.embed_tokens.weight": torch.zeros(60, 32)}
    with pytest.raises(CheckpointError, match=r"1 mismatched key\(s\), first 'model\.embed_tokens"):
        load_hf_state_dict(model, wrong)

    wrong["model.embed_tokens.weight"] = torch.full((61, 32), 7.0)
    load_hf_state_dict(model, wrong)  # right shape again: loads
    assert torch.equal(model.model.embed_tokens.weight, torch.full((61, 32), 7.0))


def test_failed_load_leaves_model_untouched(zoo):
    model = build_model(zoo["llama"], seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: torch.zeros_like(v) for k, v in to_hf_state_dict(model).items()}
    del state["lm_head.weight"]
    with pytest.raises(CheckpointError, match="1 missing"):
        load_hf_state_dict(model, state)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_unreadable_checkpoints_are_checkpoint_errors(zoo, tmp_path):
    model = build_model(zoo["llama"], seed=0)
    with pytest.raises(CheckpointError, match=r"neither model\.safetensors"):
        load_safetensors(model, tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_safetensors(model, tmp_path / "nope.safetensors")
    corrupt = tmp_path / "model.safetensors"
    corrupt.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_safetensors(model, tmp_path)
    save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(CheckpointError, match="unexpected key"):
        load_safetensors(model, tmp_path / "other.safetensors")


def test_bad_hf_style(zoo):
    model = build_model(zoo["deepseek"], device="meta")
    with pytest.raises(CheckpointError, match="hf_style must be"):
        to_hf_state_dict(model, hf_style="gpt")
    with pytest.raises(CheckpointError, match="no shared experts"):
        to_hf_state_dict(model, hf_style="mixtral")
