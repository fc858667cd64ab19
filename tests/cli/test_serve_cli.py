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
