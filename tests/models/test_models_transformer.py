"""Forward behaviour of the reference transformer: shapes, causality, positions, masks."""

from __future__ import annotations

import pytest
import torch

from legato.errors import ConfigError, SpecError
from legato.models import build_model
from legato.models.moe import MoE


def _ids(spec, batch=2, seq=10, seed=0):
    return torch.randint(
        0, spec.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed)
    )


def test_forward_shapes_and_hidden_states(zoo_spec):
    model = build_model(zoo_spec, seed=0)
    ids = _ids(zoo_spec)
    logits = model(ids)
    hidden = model.hidden_states(ids)
    assert logits.shape == (2, 10, zoo_spec.vocab_size)
    assert hidden.shape == (2, 10, zoo_spec.hidden_size)
    torch.testing.assert_close(logits, hidden @ model.output_weight().T)
    assert len(model.blocks) == zoo_spec.num_layers
    assert model.blocks is model.model.layers
    moe_layers = [i for i, b in enumerate(model.blocks) if isinstance(b.mlp, MoE)]
    assert moe_layers == [i for i in range(zoo_spec.num_layers) if zoo_spec.is_moe_layer(i)]


def test_causal_future_token_does_not_change_past(zoo_spec):
    model = build_model(zoo_spec, seed=1)
    ids = _ids(zoo_spec)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % zoo_spec.vocab_size
    before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6])
    assert not torch.allclose(before[:, 6:], after[:, 6:])


def test_backward_reaches_every_parameter(zoo_spec):
    model = build_model(zoo_spec, seed=2)
    model(_ids(zoo_spec, batch=2, seq=12)).logsumexp(-1).mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name


def test_explicit_default_positions_and_causal_mask_match_default(zoo_spec):
    model = build_model(zoo_spec, seed=3)
    ids = _ids(zoo_spec)
    positions = torch.arange(10).expand(2, 10)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    reference = model(ids)
    torch.testing.assert_close(model(ids, position_ids=positions), reference)
    torch.testing.assert_close(model(ids, positions, attn_mask=causal), reference)


def test_packed_documents_with_reset_positions_equal_separate_runs(zoo):
    """The attention-mask hook: two documents packed in one row, positions reset at the
    boundary and a block-diagonal causal mask, give the logits of running them apart."""
    spec = zoo["llama"]
    model = build_model(spec, seed=4)
    first, second = _ids(spec, 1, 6, seed=1), _ids(spec, 1, 4, seed=2)
    packed = torch.cat((first, second), dim=1)
    positions = torch.cat((torch.arange(6), torch.arange(4))).unsqueeze(0)
    doc = torch.tensor([0] * 6 + [1] * 4)
    mask = (doc[:, None] == doc[None, :]) & torch.ones(10, 10, dtype=torch.bool).tril()
    logits = model(packed, positions, attn_mask=mask)
    torch.testing.assert_close(logits[:, :6], model(first))
    torch.testing.assert_close(logits[:, 6:], model(second))


def test_tied_and_untied_embeddings(zoo):
    tied = build_model(zoo["gpt"], seed=0)
    untied = build_model(zoo["gpt"].with_(tied_embeddings=False), seed=0)
    assert "lm_head.weight" not in tied.state_dict()
    assert tied.lm_head is None
    assert tied.output_weight() is tied.model.embed_tokens.weight
    assert "lm_head.weight" in untied.state_dict()
    assert untied.output_weight() is not untied.model.embed_tokens.weight
    vocab, hidden = zoo["gpt"].vocab_size, zoo["gpt"].hidden_size
    n_tied = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + vocab * hidden
    # The tied head's gradient lands on the embedding.
    ids = _ids(zoo["gpt"])
    tied(ids)[..., 5].sum().backward()
    assert tied.model.embed_tokens.weight.grad[5].abs().sum() > 0


def test_hf_llama_names(zoo):
    keys = set(build_model(zoo["qwen3"], device="meta").state_dict())
    expected = {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        *(
            f"model.layers.{i}.{name}.weight"
            for i in range(2)
            for name in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "self_attn.q_norm",
                "self_attn.k_norm",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
                "input_layernorm",
                "post_attention_layernorm",
            )
        ),
    }
    assert keys == expected
    gpt = set(build_model(zoo["gpt"], device="meta").state_dict())
    assert "model.embed_positions.weight" in gpt
    assert "model.layers.0.input_layernorm.bias" in gpt
    assert "model.layers.0.mlp.up_proj.bias" in gpt
    assert "model.layers.0.mlp.gate_proj.weight" not in gpt


def test_too_long_input_is_a_config_error(zoo):
    model = build_model(zoo["llama"], seed=0)
    with pytest.raises(ConfigError, match="seq_len is 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_mla_needs_rope(zoo):
    with pytest.raises(SpecError, match="mla needs position"):
        build_model(zoo["deepseek"].with_(position="learned"), device="meta")
