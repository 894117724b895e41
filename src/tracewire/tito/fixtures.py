"""Tiny tokenizer directories that reproduce real chat-template families, built on the spot.

Each is a byte-level BPE trained with ``tokenizers`` on a few lines of text, the family's
special tokens added, and a hand-written Jinja chat template with the family's quirks:

- ``qwen25``: ChatML, ``<|im_end|>\\n``, a default system prompt when none is given,
  consecutive tool results in one ``user`` block, tool-call arguments re-serialized.
- ``qwen3``: ChatML without a default system prompt; assistant turns before the last user
  query lose their ``<think>`` block, the last one gets an (empty) ``<think>`` block.
- ``llama3``: ``<|begin_of_text|>``, ``<|eot_id|>`` with no newline after it, a date line in
  the system block, content trimmed, JSON tool calls.

The directories load like a real model's (``AutoTokenizer.from_pretrained(dir)``, offline),
so tests, benches and smoke checks exercise the code path users run.
:func:`build_gguf_file` writes the same tokenizer as a vocabulary-only GGUF file (metadata,
no tensors), the form llama.cpp's tools read.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["FAMILIES", "build_gguf_file", "build_tokenizer_dir"]

_QWEN_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- elif default_system %}{{- default_system }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for t in tools %}{{- '\\n' }}{{- t | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call return <tool_call>{\"name\": <name>, "
    "\"arguments\": <args>}</tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- elif default_system %}"
    "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif %}"
)

_QWEN_CALLS = (
    "{%- for tc in m.tool_calls or [] %}"
    "{%- if (loop.first and m.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}"
    "{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
)

_QWEN_TOOL_MSG = (
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
)

QWEN25_TEMPLATE = (
    "{%- set default_system = 'You are Qwen, a helpful assistant.' %}"
    + _QWEN_TOOLS
    + "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'user' or m.role == 'system' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if m.content %}{{- m.content }}{%- endif %}"
    + _QWEN_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _QWEN_TOOL_MSG
    + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN3_TEMPLATE = (
    "{%- set default_system = '' %}"
    + _QWEN_TOOLS
    + "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' and not (m.content is string and "
    "m.content.startswith('<tool_response>')) %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'user' or m.role == 'system' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content or '' %}"
    "{%- set reasoning = m.reasoning_content or '' %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    + _QWEN_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _QWEN_TOOL_MSG
    + "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + strftime_now('%d %b %Y') + '\\n\\n' }}"
    "{%- if tools %}{{- 'You may call these functions; answer with JSON "
    "{\"name\": name, \"parameters\": args}.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content | trim }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for tc in m.tool_calls %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- '{\"name\": \"' + f.name + '\", \"parameters\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}"
    "{%- endif %}{{- '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + (m.content | trim) + "
    "'<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + ((m.content or '') | trim)"
    " + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]

#: family name -> (template, special tokens, bos, eos, extra tokens that are not special).
FAMILIES: dict[str, tuple[str, list[str], str | None, str]] = {
    "qwen25": (QWEN25_TEMPLATE, _CHATML_SPECIAL, None, "<|im_end|>"),
    "qwen3": (QWEN3_TEMPLATE, _CHATML_SPECIAL, None, "<|im_end|>"),
    "llama3": (LLAMA3_TEMPLATE, _LLAMA_SPECIAL, "<|begin_of_text|>", "<|eot_id|>"),
}

_CORPUS = [
    "You are a helpful assistant. Call tools when you need them.",
    "The weather in Paris is sunny, 21 degrees; in Berlin it rains.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "<tool_call> </tool_call> <tool_response> </tool_response> <think> </think>",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))  # 3",
    "Cutting Knowledge Date: December 2023. Today Date: 01 Jan 2026.",
    "user assistant system tool ipython parameters arguments result error ok done",
    "0123456789 The quick brown fox jumps over the lazy dog. ¿Qué tal? 你好 🙂",
]


def build_tokenizer_dir(directory: str | Path, family: str, vocab_size: int = 600) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with ``chat_template``) for
    ``family`` (a key of :data:`FAMILIES`) into ``directory``; returns the directory."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    template, special, bos, eos = FAMILIES[family]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: the template's text must encode to the same ids wherever it is
    # cut, as a real byte-level vocabulary does.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "eos_token": eos,
        "bos_token": bos,
        "pad_token": special[0] if bos is None else "<|end_of_text|>",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


def build_gguf_file(path: str | Path, family: str, vocab_size: int = 600, *,
                    pre: str = "gpt-2", template: str | None = None) -> Path:
    """Write ``family``'s fixture tokenizer (see :func:`build_tokenizer_dir`) as a
    vocabulary-only GGUF file at ``path``: byte-level BPE (``gpt2``), pre-tokenizer
    ``pre``, special tokens as control tokens, bos/eos and the chat template (``template``
    overrides it; ``""`` leaves it out). Needs the ``gguf`` package; returns ``path``."""
    import tempfile

    import gguf

    out = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        data = json.loads((build_tokenizer_dir(tmp, family, vocab_size)
                           / "tokenizer.json").read_text())
    model = data["model"]
    by_id = {int(i): str(t) for t, i in model["vocab"].items()}
    for added in data["added_tokens"]:
        by_id[int(added["id"])] = str(added["content"])
    tokens = [by_id[i] for i in range(len(by_id))]
    special = {str(a["content"]) for a in data["added_tokens"] if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tpl, _, bos, eos = FAMILIES[family]
    w = gguf.GGUFWriter(str(out), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.CONTROL) if t in special
                       else int(gguf.TokenType.NORMAL) for t in tokens])
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    w.add_add_bos_token(False)
    chat = tpl if template is None else template
    if chat:
        w.add_chat_template(chat)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return out
