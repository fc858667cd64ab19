"""Small Hugging Face model folders for the chat-template tests, built without a network: a
byte-level BPE trained on a few sentences with a model family's special tokens and
post-processor, and that family's chat template written out below (Llama 3.1's, abridged
to plain chats, and Qwen 2.5's ChatML)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SENTENCES = [
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "You are a helpful assistant. Answer the user's question briefly.",
    "Hello, how are you today? I am fine, thank you for asking.",
    "Grüße aus Köln! 東京 🚀 naïve café",
] * 20

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Only user and assistant roles are supported after the system message!') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {{- '\\n<tool_call>\\n' }}
            {{- tool_call | tojson }}
            {{- '\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# ChatML with TRL's markers around each answer, for transformers' assistant mask.
GENERATION_TEMPLATE = """{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}{{- message.content + '<|im_end|>\\n' }}{%- endgeneration %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]  # fmt: skip
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATS = [
    [{"role": "user", "content": "Hello, how are you?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "The capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany? Grüße 東京 🚀"},
    ],
    [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "I am fine, thank you."},
        {"role": "user", "content": "How are you today?"},
        {"role": "assistant", "content": "Fine, thank you for asking."},
    ],
]


def _bpe(specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(SENTENCES, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def _write(folder: Path, tok: Tokenizer, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def llama3_folder(folder: Path) -> Path:
    """Llama 3: BOS added by the post-processor, the template in tokenizer_config.json."""
    tok = _bpe(LLAMA3_SPECIALS)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
              "eos_token": "<|eot_id|>", "add_bos_token": True, "chat_template": LLAMA3_TEMPLATE,
              "model_max_length": 131072, "clean_up_tokenization_spaces": True}  # fmt: skip
    return _write(folder, tok, config)


def qwen_folder(folder: Path, template: str = QWEN_TEMPLATE) -> Path:
    """Qwen 2.5: no BOS, the template in chat_template.jinja (as newer transformers save)."""
    tok = _bpe(QWEN_SPECIALS)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
              "chat_template": "{{ 'the jinja file wins' }}"}  # fmt: skip
    _write(folder, tok, config)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder
