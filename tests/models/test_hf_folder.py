"""Hugging Face model folders in: spec from config.json, weights from (sharded) safetensors,
checked against transformers' own models of each family, and written back out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hf_folders import FAMILIES, hf_config, random_hf_model, save_hf_folder, transformers
from legato.data import ByteTokenizer
from legato.errors import CheckpointError, ConfigError
from legato.models import build_model
from legato.models.hf_folder import load_weights, read_spec
from legato.models.rope import RotaryEmbedding
from legato.specs.hf_config import hf_architecture, spec_from_hf_config
from legato.specs.registry import load_model
from legato.train.export import export_hf


def _ids(vocab: int = 258) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))


def _legato(folder: Path):
    model = build_model(read_spec(folder), seed=1)
    load_weights(model, folder)
    return model.eval()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, atol=1e-5 * scale, rtol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_loss_match_transformers(family: str, tmp_path: Path) -> None:
    hf, folder = save_hf_folder(family, tmp_path / family)
    assert len(list(folder.glob("model-*.safetensors"))) > 1  # the index and its shards
    ours, ids = _legato(folder), _ids()
    assert ours.spec.name == family
    _assert_close(_logits(ours, ids), _logits(hf, ids))
    loss = F.cross_entropy(_logits(ours, ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    torch.testing.assert_close(loss, hf(ids, labels=ids).loss, atol=1e-5, rtol=1e-5)


def test_llama3_rope_tables_match_transformers() -> None:
    config = hf_config("llama3")
    spec = spec_from_hf_config(config.to_dict() | {"architectures": ["LlamaForCausalLM"]}, "x")
    assert spec.rope_scaling is not None and spec.rope_theta == 500000.0
    ours = RotaryEmbedding(spec.head_dim, 64, spec.rope_theta, spec.rope_scaling)
    plain = RotaryEmbedding(spec.head_dim, 64, spec.rope_theta)
    theirs = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.arange(64)[None]
    cos, sin = theirs(torch.zeros(1, 64, spec.head_dim), positions)
    torch.testing.assert_close(ours(positions), (cos, sin), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(plain(positions)[0], cos, atol=1e-3)  # the scaling matters


@pytest.mark.parametrize("family", list(FAMILIES))
def test_config_round_trips_through_spec(family: str) -> None:
    config = hf_config(family).to_dict()
    config["architectures"] = [f"{type(hf_config(family)).__name__[:-6]}ForCausalLM"]
    spec = spec_from_hf_config(config, family)
    written = hf_architecture(spec)
    assert written.name == config["architectures"][0]
    assert spec_from_hf_config(written.config, family) == spec
    # transformers reads what we write as the same configuration
    again = transformers.AutoConfig.for_model(**written.config).to_dict()
    assert spec_from_hf_config({**again, "architectures": [written.name]}, family) == spec


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_writes_the_family_back(family: str, tmp_path: Path) -> None:
    hf, folder = save_hf_folder(family, tmp_path / family)
    out = export_hf(_legato(folder), ByteTokenizer(), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert (
        config["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]
    )
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    _assert_close(_logits(back, _ids()), _logits(hf, _ids()))


def test_bf16_folder_loads_into_fp32_model(tmp_path: Path) -> None:
    hf = random_hf_model(hf_config("mixtral")).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "m", max_shard_size="30KB")
    ours = _legato(tmp_path / "m")
    experts = ours.blocks[1].mlp.experts.down_proj
    assert experts.dtype == torch.float32
    theirs = hf.state_dict()["model.layers.1.mlp.experts.down_proj"]  # [E, h, ffn] in v5
    torch.testing.assert_close(experts, theirs.float(), atol=0, rtol=0)


def test_folder_is_a_model_wherever_a_preset_is(tmp_path: Path) -> None:
    _, folder = save_hf_folder("qwen3_moe", tmp_path / "q3")
    spec = load_model(str(folder))
    assert spec == read_spec(folder)
    assert spec.moe.first_dense_layers == 1 and spec.moe.layer_freq == 1 and spec.qk_norm


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures: 'GPT2LMHeadModel'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters.rope_type"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.rope_type: 'linear'"),
        ({"hidden_act": "gelu"}, "hidden_act: 'gelu'"),
        ({"attention_bias": True}, "attention_bias: True"),
        ({"num_hidden_layers": None}, "num_hidden_layers: missing"),
    ],
)
def test_unsupported_configs_are_one_line_naming_the_field(change, field, tmp_path) -> None:
    config = {**hf_architecture(load_model("tiny")).config, **change}
    if "rope_scaling" in change:
        del config["rope_parameters"]
    if change.get("num_hidden_layers", 0) is None:
        del config["num_hidden_layers"]
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as info:
        read_spec(folder)
    message = str(info.value)
    assert "\n" not in message and field in message and str(folder / "config.json") in message


def test_qwen3_moe_without_renormalised_top_k_is_refused() -> None:
    config = hf_config("qwen3_moe", norm_topk_prob=False).to_dict()
    config["architectures"] = ["Qwen3MoeForCausalLM"]
    with pytest.raises(ConfigError, match="norm_topk_prob"):
        spec_from_hf_config(config, "x")


def test_missing_and_misshaped_weights_name_the_first_key(tmp_path: Path) -> None:
    _, folder = save_hf_folder("llama", tmp_path / "m", max_shard_size="5GB")
    model = build_model(read_spec(folder).with_(ffn_hidden_size=80), seed=0)
    with pytest.raises(CheckpointError, match=r"mismatched key\(s\), first 'model.layers.0.mlp"):
        load_weights(model, folder)
    (folder / "model.safetensors").rename(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=r"has neither model\.safetensors"):
        load_weights(build_model(read_spec(folder)), folder)


class _Counting:
    """A safetensors slice that counts the elements read through it."""

    read = 0

    def __init__(self, inner) -> None:
        self.inner = inner

    def get_shape(self):
        return self.inner.get_shape()

    def __getitem__(self, index):
        out = self.inner[index]
        _Counting.read += out.numel()
        return out


def _sharded_load(rank: int, folder: Path) -> tuple[int, int, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from legato.models import hf_folder

    mesh = init_device_mesh("cpu", (2,))
    model = build_model(read_spec(folder), seed=rank)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    plain = build_model(read_spec(folder), seed=5)
    load_weights(plain, folder)
    files_slice = hf_folder._Files.slice
    hf_folder._Files.slice = lambda self, key: _Counting(files_slice(self, key))
    load_weights(model, folder)
    full = plain.state_dict()
    local = 0
    for name, param in model.state_dict().items():
        shard = param.to_local()
        rows = shard.shape[0]
        start = rank * -(-full[name].shape[0] // 2)
        assert torch.equal(shard, full[name][start : start + rows]), name
        local += shard.numel()
    return _Counting.read, local, sum(t.numel() for t in full.values())


@pytest.mark.distributed
def test_each_rank_reads_only_its_slices(tmp_path: Path) -> None:
    from gloo_harness import run_ranks

    save_hf_folder("mixtral", tmp_path / "mx")
    results = run_ranks(_sharded_load, tmp_path / "mx")
    for read, local, _ in results:
        assert read == local  # FSDP2 Shard(0): this rank's rows, experts included
    assert sum(local for _, local, _ in results) == results[0][2]
