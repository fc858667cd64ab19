"""Hugging Face folders of every family legato reads, served: ``legato generate --model DIR``
answers greedily what transformers' ``generate`` answers, and a LoRA that ``legato
finetune`` trained on the folder answers through ``--adapter`` what transformers + PEFT
answer with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chat_folders import qwen_folder
from hf_folders import FAMILIES, save_hf_folder
from legato.cli.main import main
from legato.data.tokenizer import load_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # peft on transformers 5

PROMPT = "the quick brown fox"
NEW_TOKENS = 8
MIN_GAP = 1e-3  # between the two top logits of every greedy step: no near-tie to flip


def _folder(family: str, folder: Path):
    """A folder with ``family``'s random model and a small BPE tokenizer (Qwen-style)."""
    qwen_folder(folder)
    hf, _ = save_hf_folder(family, folder, vocab_size=512)
    return hf, folder


def _expected_text(hf, folder: Path) -> str:
    """transformers' greedy continuation of PROMPT, decoded by the folder's tokenizer, after
    checking that no step's choice is near-tied. The model's rows past the tokenizer's
    vocabulary are never sampled by legato (no text for them): suppressed here too."""
    tokenizer = load_tokenizer(folder, where="test", trains=False)
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    unused = list(range(tokenizer.vocab_size, hf.config.vocab_size))
    with torch.no_grad():
        out = hf.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id,
                          suppress_tokens=unused, output_scores=True,
                          return_dict_in_generate=True)  # fmt: skip
    for scores in out.scores:
        top = scores[0].topk(2).values
        assert top[0] - top[1] > MIN_GAP, "a near-tied step: choose another seed"
    new = out.sequences[0, ids.shape[1] :].tolist()
    if new and new[-1] == tokenizer.eos_id:
        new = new[:-1]
    assert new, "transformers ended at once: choose another prompt"
    return tokenizer.decode(new)


def _generated(capsys, *args: str) -> str:
    assert main(["generate", *args, "--max-tokens", str(NEW_TOKENS), "--temperature", "0",
                 PROMPT]) == 0  # fmt: skip
    return capsys.readouterr().out.removesuffix("\n")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_answers_what_transformers_answers(family, tmp_path, capsys):
    hf, folder = _folder(family, tmp_path / family)
    assert _generated(capsys, "--model", str(folder)) == _expected_text(hf, folder)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mixtral"])
def test_a_lora_finetuned_on_the_folder_answers_as_peft_does(family, tmp_path, capsys):
    peft = pytest.importorskip("peft")
    hf, folder = _folder(family, tmp_path / family)
    data = tmp_path / "task.jsonl"
    rows = [{"prompt": f"question {i}:", "response": " jumps over the lazy dog"} for i in range(8)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "finetune.toml"
    config.write_text(
        f'[base]\nweights = "{folder}"\n\n[run]\ndevice = "cpu"\noutput_dir = "{tmp_path / "out"}"\n\n'
        f'[[tasks]]\nname = "t"\ndata = "{data}"\nsteps = 3\nlr = 0.05\nbatch_size = 2\n'
        "seq_len = 32\nrank = 4\n"
    )
    assert main(["finetune", str(config)]) == 0
    capsys.readouterr()
    adapter = tmp_path / "out" / "t"
    tuned = peft.PeftModel.from_pretrained(hf, adapter).eval()
    ids = torch.tensor([load_tokenizer(folder, where="test", trains=False).encode(PROMPT)])
    with torch.no_grad(), tuned.disable_adapter():
        plain = tuned(input_ids=ids).logits
    with torch.no_grad():
        assert (tuned(input_ids=ids).logits - plain).abs().max() > 1e-2  # the LoRA matters
    expected = _expected_text(tuned, folder)
    assert _generated(capsys, "--model", str(folder), "--adapter", str(adapter)) == expected
