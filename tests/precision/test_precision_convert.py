"""convert_to_fp8 on the reference models: what is converted, and that it still trains."""

from __future__ import annotations

import torch

from legato.models import build_model
from legato.precision import Fp8Linear, convert_to_fp8
from legato.specs import load_model


def _spec(name: str):
    return load_model(name).with_(num_layers=2, vocab_size=258, seq_len=64)


def test_converts_linears_and_experts_but_not_head_or_router() -> None:
    model = build_model(_spec("tiny-moe"), seed=0)
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    names = convert_to_fp8(model)
    assert "model.layers.0.self_attn.q_proj" in names
    assert "model.layers.1.mlp.experts" in names
    assert "lm_head" not in names and not any(n.endswith("gate") for n in names)
    assert isinstance(model.model.layers[0].self_attn.o_proj, Fp8Linear)
    assert list(model.state_dict()) == keys  # checkpoints and HF mapping unchanged
    assert [id(p) for p in model.parameters()] == params  # optimizers stay valid


def test_fp8_model_output_and_grads_track_the_original() -> None:
    spec = _spec("tiny-moe")
    ids = torch.randint(0, 258, (2, 64), generator=torch.Generator().manual_seed(0))
    ref, fp8 = build_model(spec, seed=0), build_model(spec, seed=0)
    convert_to_fp8(fp8, "tilewise")
    outs = []
    for model in (ref, fp8):
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        outs.append(logits.detach())
    assert not torch.equal(outs[0], outs[1])
    assert float((outs[1] - outs[0]).norm() / outs[0].norm()) < 0.05
    for (name, p), q in zip(ref.named_parameters(), fp8.parameters(), strict=True):
        assert q.grad is not None, name
        rel = float((q.grad - p.grad).norm() / p.grad.norm().clamp(min=1e-12))
        assert rel < 0.3, (name, rel)  # ~0.1 typical; the router up to ~0.25
