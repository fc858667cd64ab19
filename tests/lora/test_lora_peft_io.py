"""Adapters saved in PEFT's format: names, atomic replacement, and loading into PEFT."""

from __future__ import annotations

import json

import pytest
import torch
from lora_fixtures import SPEC, synthetic_stream, task
from safetensors.torch import load_file

from legato.errors import CheckpointError
from legato.lora import (
    AdapterShape,
    LoraAdapter,
    MultiLoraModel,
    MultiTaskTrainer,
    PackingScheduler,
    TaskRows,
    load_adapter,
    save_adapter,
)
from legato.lora.task_data import Sequences
from legato.models import build_model, save_safetensors


def _trained_adapter(base, **fields):
    """An adapter after two steps, so both factors are non-zero."""
    trainer = MultiTaskTrainer(MultiLoraModel(base), PackingScheduler(4096))
    trainer.add_task(task("t", steps=2, **fields), synthetic_stream(5))
    return trainer.run()["t"]


def test_saved_keys_and_config_are_what_peft_writes_for_llama(tmp_path):
    base = build_model(SPEC, seed=0)
    shape = AdapterShape(4, 8.0, 0.05, ("q_proj", "down_proj"))
    folder = save_adapter(LoraAdapter("t", shape, base, seed=1), tmp_path / "t", "tiny")
    tensors = load_file(folder / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers"
    assert tensors[f"{prefix}.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)
    assert tensors[f"{prefix}.1.self_attn.q_proj.lora_B.weight"].shape == (32, 4)
    assert tensors[f"{prefix}.1.mlp.down_proj.lora_A.weight"].shape == (4, 64)
    assert len(tensors) == 2 * 2 * 2  # 2 layers x 2 targets x (A, B)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["down_proj", "q_proj"]


def test_round_trip_and_atomic_replacement(tmp_path):
    base = build_model(SPEC, seed=0)
    first = _trained_adapter(base, rank=3, target_modules=["v_proj", "up_proj"])
    save_adapter(first, tmp_path / "t", "tiny")
    second = LoraAdapter("t", AdapterShape(2, 4.0, 0.0, ("k_proj",)), base, seed=9)
    save_adapter(second, tmp_path / "t", "tiny")  # replaces the older adapter whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no staging leftovers
    loaded = load_adapter(tmp_path / "t", base)
    assert loaded.shape == second.shape and loaded.paths == second.paths
    for (_, a1, b1), (_, a2, b2) in zip(
        loaded.named_factors(), second.named_factors(), strict=True
    ):
        assert torch.equal(a1, a2) and torch.equal(b1, b2)


def test_loading_into_another_model_reports_the_mismatch(tmp_path):
    base = build_model(SPEC, seed=0)
    save_adapter(
        LoraAdapter("t", AdapterShape(2, 4.0, 0.0, ("q_proj",)), base), tmp_path / "t", "x"
    )
    wider = build_model(SPEC.with_(hidden_size=64), seed=0)
    with pytest.raises(CheckpointError, match="has shape"):
        load_adapter(tmp_path / "t", wider)
    gelu = build_model(SPEC.with_(mlp="gelu"), seed=0)
    save_adapter(
        LoraAdapter("g", AdapterShape(2, 4.0, 0.0, ("gate_proj",)), base), tmp_path / "g", "x"
    )
    with pytest.raises(CheckpointError, match="'gate_proj' is not a linear layer"):
        load_adapter(tmp_path / "g", gelu)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers API
def test_peft_loads_our_adapter_onto_transformers_llama_with_the_same_outputs(tmp_path):
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from legato.lora.hf_interop import llama_config

    base = build_model(SPEC, seed=0)
    save_safetensors(base, tmp_path / "base")
    llama_config(SPEC).save_pretrained(tmp_path / "base")
    targets = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "lm_head"]
    adapter = _trained_adapter(base, rank=4, alpha=12.0, dropout=0.1, target_modules=targets)
    save_adapter(adapter, tmp_path / "adapter", str(tmp_path / "base"))

    hf = LlamaForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    ids = torch.randint(0, SPEC.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
        model = MultiLoraModel(base).eval()
        positions = torch.arange(24).expand(2, 24)
        rows = TaskRows("t", adapter, Sequences(ids, ids, positions, None))
        ours, _ = model.logits([rows])
    torch.testing.assert_close(ours.view(2, 24, -1), theirs, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), peft_model.disable_adapter():
        plain = peft_model(input_ids=ids).logits
    assert (theirs - plain).abs().max() > 1e-4  # the adapter changes the outputs
    torch.testing.assert_close(plain, base(ids), rtol=1e-5, atol=1e-5)
