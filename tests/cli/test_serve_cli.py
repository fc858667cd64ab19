"""``legato generate`` answers on the built-in default; bad serving flags are one line."""

from __future__ import annotations

import pytest

from legato.cli.main import main


def test_generate_on_the_builtin_default(capsys):
    args = ["generate", "--model", "tiny", "--max-tokens", "6", "--num-blocks", "16", "Hello"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first  # greedy: the same answer twice


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--link-gbps", "0", "x"], "--link-gbps: must be > 0"),
        (["generate", "--num-blocks", "0", "x"], "--num-blocks: must be >= 1"),
        (["generate", "--device-memory", "lots", "x"], "--device-memory: expected bytes"),
        (["generate", "--swap-space", "-1", "x"], "--swap-space: must be >= 0 GiB"),
        (["generate", "--device-memory", "1KiB", "x"], "--device-memory: 1024 bytes hold 0"),
        (["serve", "--replicas", "0"], "--replicas and --adapters-per-replica: must be >= 1"),
        (["generate", "--max-tokens", "0", "x"], "max_tokens: must be an integer >= 1"),
        (["generate", "--adapter", "/no/such/dir", "x"], "--adapter: /no/such/dir is not a PEFT"),
        (["bench", "serve", "--goodput", "ttft"], "--goodput: items are ttft:MS or tpot:MS"),
        (["bench", "serve", "--base-url", "http://127.0.0.1:9"], "--base-url: no OpenAI server"),
    ],
)
def test_bad_flags_are_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_every_engine_flag_reaches_its_field():
    """Flags are passed by name: a field added to EngineConfig cannot shift the others."""
    from legato.cli.main import build_parser
    from legato.cli.serve import _engine_config

    flags = {"--block-size": 8, "--num-blocks": 96, "--max-num-seqs": 3, "--max-loras": 2,
             "--max-num-batched-tokens": 64, "--max-queue": 7, "--max-lora-rank": 5,
             "--link-gbps": 2.5, "--max-cpu-loras": 4}  # fmt: skip
    argv = ["serve", "--policy", "slora"] + [str(x) for kv in flags.items() for x in kv]
    config = _engine_config(build_parser().parse_args(argv))
    for flag, value in flags.items():
        assert getattr(config, flag.lstrip("-").replace("-", "_")) == value, flag
    assert config.policy == "slora"
    swapped = _engine_config(build_parser().parse_args(["serve", "--swap-space", "0.5"]))
    assert swapped.swap_space == 2**29


def test_device_memory_sizes_the_pool_in_blocks_of_the_model():
    from legato.cli.main import build_parser
    from legato.cli.serve import _engine
    from legato.serve.paged_model import PagedKVCache

    args = build_parser().parse_args(["generate", "--device-memory", "3MiB", "--block-size", "8",
                                      "x"])  # fmt: skip
    engine = _engine(args, lambda model: {})
    per_block = PagedKVCache.block_bytes(engine.model, 8)
    assert engine.config.num_blocks == 3 * 2**20 // per_block == engine.blocks.num_blocks
    assert engine.cache.bytes_per_block == per_block
