"""Serving a Hugging Face folder: ``legato serve --model DIR``'s engine against transformers'
``generate`` one request at a time, on the same folder and CPU.

The folder is what a user brings: a random ``LlamaForCausalLM`` (or ``--family``) saved by
transformers with ``save_pretrained``, and a byte-level BPE ``tokenizer.json`` trained on the
built-in corpus. legato loads it as ``--model DIR`` does (``load_served_model``) and answers
``--requests`` prompts submitted together (continuous batching); transformers answers the
same prompts one after another, greedily, with its KV cache. Both generate exactly
``--new-tokens`` tokens per request (EOS ignored), so output tokens/s compare like for like.
Median of ``--repeats`` runs each; ratio = legato / transformers (> 1: legato faster).

    python benchmarks/hf_folder_serving.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from legato.data.builtin_corpus import generate_documents
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import load_served_model
from legato.serve.sampling import SamplingParams
from report import emit, note

BENCHMARK = "hf_folder_serving"
SHAPE = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512,
         "max_position_embeddings": 512}  # fmt: skip
CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mixtral": "MixtralConfig"}


def make_folder(family: str, folder: Path) -> None:
    """A random model of ``family`` and a BPE tokenizer of its vocabulary, as HF saves them."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, CONFIGS[family])(**SHAPE)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=SHAPE["vocab_size"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])  # fmt: skip
    tokenizer.train_from_iterator(generate_documents(seed=0), trainer)
    tokenizer.save(str(folder / "tokenizer.json"))


def prompts(count: int) -> list[str]:
    lines = [line for doc in generate_documents(seed=1) for line in doc.splitlines()]
    lines = [line for line in lines if len(line) > 40]
    return [lines[i % len(lines)][:120] for i in range(count)]


def legato_tokens_per_s(folder: Path, texts: list[str], new_tokens: int) -> float:
    model, tokenizer, _ = load_served_model(str(folder))
    engine = Engine(model, tokenizer, {}, EngineConfig(block_size=16, num_blocks=1024,
                                                       max_num_seqs=len(texts)))  # fmt: skip
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    ids = [tokenizer.encode(t) for t in texts]
    start = time.perf_counter()
    requests = engine.generate(ids, params, [None] * len(ids))
    elapsed = time.perf_counter() - start
    return sum(len(r.output) for r in requests) / elapsed


def transformers_tokens_per_s(folder: Path, texts: list[str], new_tokens: int) -> float:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    total, start = 0, time.perf_counter()
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            out = model.generate(input_ids=ids, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=0)  # fmt: skip
            total += out.shape[1] - ids.shape[1]
    return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="llama, 8 requests, 1 repeat")
    args = parser.parse_args()
    families = args.family or (["llama"] if args.quick else ["llama", "qwen2", "mixtral"])
    requests, repeats = (8, 1) if args.quick else (args.requests, args.repeats)
    texts = prompts(requests)
    note(BENCHMARK, threads=torch.get_num_threads(), requests=requests,
         new_tokens=args.new_tokens, repeats=repeats, shape=SHAPE)  # fmt: skip
    for family in families:
        with tempfile.TemporaryDirectory(prefix="legato-hf-folder-") as tmp:
            folder = Path(tmp) / family
            make_folder(family, folder)
            ours = [legato_tokens_per_s(folder, texts, args.new_tokens) for _ in range(repeats)]
            theirs = [
                transformers_tokens_per_s(folder, texts, args.new_tokens) for _ in range(repeats)
            ]
        emit(BENCHMARK, {"family": family, "requests": requests}, "output_tokens_per_s",
             statistics.median(ours), "transformers_generate_one_at_a_time",
             statistics.median(theirs), digits=1, ratio_digits=2)  # fmt: skip


if __name__ == "__main__":
    main()
