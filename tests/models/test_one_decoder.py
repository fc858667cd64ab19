"""Training, multi-LoRA fine-tuning and serving run one ``Block.forward``: a change planted
in it makes all three disagree with transformers (+ PEFT); without it all three agree.

(Training is checked against transformers, not against one legato process: the parallel
equality suites compare legato with legato, both sides running the same block.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from legato.data.tokenizer import ByteTokenizer
from legato.errors import ConfigError
from legato.lora.hf_interop import llama_config, to_hf_llama
from legato.lora.packed_model import MultiLoraModel, TaskRows
from legato.lora.peft_io import save_adapter
from legato.lora.task_data import Sequences
from legato.models import Block, build_model
from legato.models.hf_checkpoint import save_safetensors
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.paged_model import PagedKVCache, PagedModel, StepRows
from legato.serve.sampling import SamplingParams
from legato.specs.registry import load_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # peft on transformers 5

PROMPTS = ["The cat sat on", "Once upon a time"]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """A tiny Llama in legato and in transformers, an adapter, and what transformers +
    PEFT compute: the loss of a batch, the adapter's logits, its greedy continuations."""
    peft = pytest.importorskip("peft")
    folder = tmp_path_factory.mktemp("one_decoder")
    model = build_model(load_model("tiny").with_(num_layers=2), seed=0)
    adapter = generated_adapters(model, count=1, rank=4, seed=1)["lora-0"]
    save_safetensors(model, folder / "base")
    llama_config(model.spec).save_pretrained(folder / "base")
    save_adapter(adapter, folder / "lora", str(folder / "base"))
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    tokenizer = ByteTokenizer()
    with torch.no_grad():
        loss = to_hf_llama(model)(input_ids=ids, labels=ids).loss
        tuned = peft.PeftModel.from_pretrained(to_hf_llama(model), folder / "lora").eval()
        logits = tuned(input_ids=ids).logits
        suppressed = list(range(tokenizer.vocab_size, model.spec.vocab_size))
        tokens = {}
        for prompt in PROMPTS:
            prompt_ids = torch.tensor([tokenizer.encode(prompt)])
            out = tuned.generate(input_ids=prompt_ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 suppress_tokens=suppressed, eos_token_id=None, pad_token_id=0)  # fmt: skip
            tokens[prompt] = out[0, prompt_ids.shape[1] :].tolist()
    return model, adapter, ids, tokenizer, loss, logits, tokens


def _training_matches(model, ids, loss) -> bool:
    logits = model(ids)
    ours = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    return torch.allclose(ours, loss, rtol=1e-5, atol=1e-6)


def _fine_tuning_matches(model, adapter, ids, logits) -> bool:
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    rows = TaskRows("t", adapter, Sequences(ids, ids, positions, None))
    ours, _ = MultiLoraModel(model).eval().logits([rows])
    return torch.allclose(ours.view_as(logits), logits, rtol=1e-5, atol=1e-5)


def _serving_matches(model, adapter, tokenizer, tokens) -> bool:
    engine = Engine(
        model, tokenizer, {"lora-0": adapter}, EngineConfig(block_size=4, num_blocks=32)
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    requests = engine.generate(prompts, params, ["lora-0"] * len(PROMPTS))
    return [r.output for r in requests] == [tokens[p] for p in PROMPTS]


def _planted(self, x, ctx):
    """``Block.forward`` with the MLP's residual branch halved."""
    x = x + self.self_attn(self.input_layernorm(x), ctx)
    return x + 0.5 * self.mlp(self.post_attention_layernorm(x), ctx)


@pytest.mark.parametrize("plant", [False, True], ids=["as-is", "planted"])
def test_a_change_in_the_block_reaches_training_fine_tuning_and_serving(
    references, monkeypatch, plant
):
    model, adapter, ids, tokenizer, loss, logits, tokens = references
    if plant:
        monkeypatch.setattr(Block, "forward", _planted)
    with torch.no_grad():
        found = {
            "training": _training_matches(model, ids, loss),
            "fine-tuning": _fine_tuning_matches(model, adapter, ids, logits),
            "serving": _serving_matches(model, adapter, tokenizer, tokens),
        }
    assert found == dict.fromkeys(found, not plant)


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-deepseek", "tiny-gpt"])
def test_every_family_runs_the_flat_paths_as_the_batch_path(preset):
    """MoE, MLA + shared experts, learned positions + biases + LayerNorm: the fine-tuning
    rows and (but MLA) the serving steps give the logits of the training forward."""
    model = build_model(load_model(preset).with_(num_layers=2), seed=0).eval()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).expand_as(ids)
    with torch.no_grad():
        full = model(ids)
        rows = TaskRows("t", None, Sequences(ids, ids, positions, None))
        packed, _ = MultiLoraModel(model).eval().logits([rows])
    torch.testing.assert_close(packed.view_as(full), full, rtol=1e-5, atol=1e-5)
    if model.spec.mla is not None:
        with pytest.raises(ConfigError, match=r"--model: serving .* uses MLA"):
            PagedModel(model, PagedKVCache(model, 8, 4))
        return
    runner = PagedModel(model, PagedKVCache(model, 8, 4))
    first = runner.step([StepRows(ids[0, :7].tolist(), 0, [0, 1, 2], None)])
    steps = [runner.step([StepRows([ids[0, p].item()], p, [0, 1, 2], None)]) for p in range(7, 12)]
    torch.testing.assert_close(torch.cat([first, *steps]), full[0, 6:], rtol=1e-5, atol=1e-5)
