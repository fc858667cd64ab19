"""``legato generate`` answers on the built-in default (and says so when the answer is empty);
``legato serve`` fails on a busy port before it says it serves, lists random adapters only
for the bare demo and builds its guard from its flags; bad serving flags are one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from legato.cli.main import build_parser, main


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
        (["serve", "--replicas", "0", "--port", "0"], "--replicas: must be >= 1, got 0"),
        (["serve", "--max-queue", "0", "--port", "0"], "--max-queue: must be >= 1, got 0"),
        (["generate", "--max-tokens", "0", "x"], "max_tokens: must be an integer >= 1"),
        (["generate", "--adapter", "/no/such/dir", "x"], "--adapter: /no/such/dir is not a PEFT"),
        (["bench", "serve", "--goodput", "ttft"], "--goodput: items are ttft:MS or tpot:MS"),
        (["bench", "serve", "--base-url", "http://127.0.0.1:9"], "--base-url: no OpenAI server"),
        (["serve", "--enable-lora-updating"], "--lora-root: --enable-lora-updating needs"),
        (["serve", "--lora-root", "."], "--lora-root: only used with --enable-lora-updating"),
        (["serve", "--max-request-bytes", "big"], "--max-request-bytes: expected bytes"),
        (["serve", "--api-key", ""], "--api-key: must not be empty"),
        (["serve", "--port", "70000"], "--port: must be in [0, 65535]"),
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
    from legato.cli.serve import _engine, _engine_config
    from legato.serve.paged_model import PagedKVCache

    args = build_parser().parse_args(["generate", "--device-memory", "3MiB", "--block-size", "8",
                                      "x"])  # fmt: skip
    engine = _engine(args, _engine_config(args), lambda model: {})
    per_block = PagedKVCache.block_bytes(engine.model, 8)
    assert engine.config.num_blocks == 3 * 2**20 // per_block == engine.blocks.num_blocks
    assert engine.cache.bytes_per_block == per_block


def test_generate_says_when_the_answer_is_empty(capsys):
    args = ["generate", "--model", "tiny", "--max-tokens", "6", "--num-blocks", "16", "Hello"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main([*args, "--stop", first[:1]]) == 0  # the answer stops before its first token
    out, err = capsys.readouterr()
    assert out == ""  # not a bare empty line
    assert err.strip() == "legato: empty answer: no text from 1 token(s) (finish_reason: stop)"


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_serve_on_a_busy_port_fails_before_it_says_it_serves(replicas):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = [sys.executable, "-m", "legato.cli.main", "serve", "--port", port,
                "--replicas", replicas, "--num-blocks", "16"]  # fmt: skip
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)  # fmt: skip
        try:
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:  # still up: end its whole group (Ray's children too)
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate(timeout=30)
    assert child.returncode == 2, err
    assert err.strip() == (
        f"legato: error: --port: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "pick another --port"
    )
    assert "serving" not in out + err


def test_random_adapters_only_for_the_bare_demo(tmp_path):
    from legato.cli.serve import _engine_config, _served_engine
    from legato.models.hf_checkpoint import save_safetensors
    from legato.serve.loading import load_served_model

    save_safetensors(load_served_model("tiny")[0], tmp_path / "weights")
    cases = {(): ["lora-0", "lora-1", "lora-2", "lora-3"], ("--adapters",): [],
             ("--weights", str(tmp_path / "weights")): []}  # fmt: skip
    for flags, adapters in cases.items():
        args = build_parser().parse_args(["serve", "--num-blocks", "64", *flags])
        engine, listed = _served_engine(args, _engine_config(args))
        assert list(engine.adapters) == adapters == list(listed), flags


def test_serve_flags_build_its_guard(tmp_path, monkeypatch):
    from legato.cli.serve import API_KEY_ENV, _access

    def access(*flags):
        return _access(build_parser().parse_args(["serve", *flags]))

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    default = access()
    assert default.api_key is None and not default.lora_updating
    assert default.max_request_bytes == 4 * 2**20
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert access().api_key == "from-env" and access("--api-key", "flag").api_key == "flag"
    guarded = access("--max-request-bytes", "1KiB", "--enable-lora-updating",
                     "--lora-root", str(tmp_path), "--lora-root", str(tmp_path / "."))  # fmt: skip
    assert guarded.max_request_bytes == 1024 and guarded.lora_updating
    assert guarded.lora_roots == (tmp_path.resolve(), tmp_path.resolve())
