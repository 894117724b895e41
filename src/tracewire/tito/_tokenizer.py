"""A model's tokenizer and chat template, loaded offline from a local directory or GGUF file.

The directory is what a model repository ships: ``tokenizer.json`` and
``tokenizer_config.json`` holding ``chat_template``; a GGUF model file carries the same in
its metadata (built by :mod:`tracewire.tito._gguf`). ``transformers`` renders the template
(so any family's template works as the model server would render it) and the Rust
``tokenizers`` object behind it encodes; neither needs torch. Both are imported lazily, so
``import tracewire`` never pays for them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from ._errors import TemplateError, TitoUnavailableError
from ._gguf import is_gguf, load_gguf

__all__ = ["ChatTokenizer", "IncrementalDecoder", "chat_messages", "check_tokenizer",
           "decoded_arguments"]

#: Beyond these sizes encode/decode go through the GIL-releasing batch calls.
_NOGIL_CHARS = 8192
_NOGIL_IDS = 2048
_EXTRA_HINT = "token-in/token-out needs the optional extra: pip install 'tracewire[tito]'"


def check_tokenizer(path: str | Path) -> str:
    """Check, without loading it, that ``path`` names a tokenizer directory or a GGUF file
    and that the extra it needs is installed: its kind (``"dir"`` or ``"gguf"``), else
    :class:`TemplateError` / :class:`TitoUnavailableError` with a one-line reason (what the
    command line prints)."""
    p = Path(path)
    if p.is_file():
        if not is_gguf(p):
            raise TemplateError(f"{p}: a file that is not GGUF (expected a tokenizer "
                                "directory or a GGUF file)")
        kind = "gguf"
    elif p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise TemplateError(f"{p}: no tokenizer.json (expected a tokenizer directory or "
                                "a GGUF file)")
        kind = "dir"
    else:
        raise TemplateError(f"{p}: no such tokenizer directory or GGUF file")
    for mod in ("tokenizers", "jinja2", *(("gguf",) if kind == "gguf" else ())):
        try:
            importlib.import_module(mod)  # small: importing is the honest check
        except ImportError as exc:
            raise TitoUnavailableError(f"{_EXTRA_HINT} ({exc})") from exc
    try:
        # transformers costs ~0.4 s to import: only find it here, the loader imports it.
        found = importlib.util.find_spec("transformers") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TitoUnavailableError(f"{_EXTRA_HINT} (No module named 'transformers')")
    return kind


def _import_transformers() -> Any:
    # Never reach for the hub: a directory is all we load, and tests run offline.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found"
    try:
        import transformers
    except ImportError as exc:
        raise TitoUnavailableError(f"{_EXTRA_HINT} ({exc})") from exc
    # transformers logs "PyTorch was not found" on import; we never need torch.
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers


def _load_dir(path: Path) -> Any:
    if not (path / "tokenizer.json").is_file():
        raise TemplateError(f"{path}: no tokenizer.json (expected a tokenizer directory or "
                            "a GGUF file)")
    tf = _import_transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise TemplateError(f"{path}: cannot load the tokenizer: {exc}") from exc


def _load_gguf(path: Path) -> Any:
    g = load_gguf(path)
    if not g.chat_template:
        raise TemplateError(f"{path}: the GGUF file has no tokenizer.chat_template")
    tf = _import_transformers()
    try:
        # The wrapper only renders the template; the Rust tokenizer built from the GGUF
        # metadata does all encoding and decoding.
        return tf.PreTrainedTokenizerFast(
            tokenizer_object=g.tokenizer(), bos_token=g.bos_token, eos_token=g.eos_token,
            chat_template=g.chat_template, clean_up_tokenization_spaces=False)
    except (ValueError, KeyError, TypeError) as exc:
        raise TemplateError(f"{path}: cannot wrap the GGUF tokenizer: {exc}") from exc


def decoded_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value: templates expect a mapping (they re-serialize it
    with tojson) and echoed text is compared as a value ({"a":1} vs {"a": 1}); OpenAI-style
    clients send a JSON string. Text that is not JSON stays text."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def chat_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as chat templates expect them: tool-call arguments decoded,
    ``reasoning`` also offered as ``reasoning_content``, text part lists joined."""
    out = []
    for m in messages:
        d = dict(m)
        content = d.get("content")
        if isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
                for p in content):
            d["content"] = "".join(str(p.get("text", "")) for p in content)
        if d.get("reasoning") is not None and d.get("reasoning_content") is None:
            d["reasoning_content"] = d["reasoning"]
        tcs = d.get("tool_calls")
        if tcs:
            calls = []
            for tc in tcs:
                tc = dict(tc)
                fn = dict(tc.get("function") or {})
                fn["arguments"] = decoded_arguments(fn.get("arguments", {}))
                tc["function"] = fn
                calls.append(tc)
            d["tool_calls"] = calls
        out.append(d)
    return out


class ChatTokenizer:
    """A tokenizer directory's (or GGUF file's) chat template and vocabulary: render
    messages to text, encode text to ids (special tokens parsed, none added), decode ids."""

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        if path.is_file():
            if not is_gguf(path):
                raise TemplateError(f"{path}: a file that is not GGUF (expected a tokenizer "
                                    "directory or a GGUF file)")
            self.hf = _load_gguf(path)
        elif path.is_dir():
            self.hf = _load_dir(path)
        else:
            raise TemplateError(f"{path}: no such tokenizer directory or GGUF file")
        if not getattr(self.hf, "chat_template", None):
            raise TemplateError(f"{path}: tokenizer_config.json has no chat_template")
        self.directory = path
        self._fast = self.hf.backend_tokenizer
        self.vocab_size: int = int(self._fast.get_vocab_size(with_added_tokens=True))
        self.special: dict[str, int] = {
            str(t): int(i) for i, t in self.hf.added_tokens_decoder.items()
            if getattr(t, "special", False)}

    @property
    def eos_id(self) -> int | None:
        """The tokenizer's declared end-of-sequence id, if any."""
        eid = self.hf.eos_token_id
        return None if eid is None else int(eid)

    def token_id(self, token: str) -> int | None:
        """The id of a whole token (special or not), or None when the vocabulary lacks it."""
        tid = self._fast.token_to_id(token)
        return None if tid is None else int(tid)

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None,
               *, add_generation_prompt: bool = False) -> str:
        """The chat template's text for ``messages`` (already in template form, see
        :func:`chat_messages`); :class:`TemplateError` when the template raises."""
        try:
            text = self.hf.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja raises anything from a template; report, not crash
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(text, str):
            raise TemplateError("chat template did not render text")
        return text

    def _encode(self, text: str) -> Any:
        if len(text) > _NOGIL_CHARS:
            # The batch call releases the GIL while Rust encodes (the single one holds it):
            # a long render in a worker thread then never stalls the event loop's thread.
            return self._fast.encode_batch([text], add_special_tokens=False)[0]
        return self._fast.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with special-token text parsed as special tokens, none added."""
        return list(self._encode(text).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of ``text`` and each token's (start, end) character offsets."""
        enc = self._encode(text)
        return list(enc.ids), [tuple(o) for o in enc.offsets]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (what the model actually emitted)."""
        if len(ids) > _NOGIL_IDS:
            return str(self._fast.decode_batch([list(ids)], skip_special_tokens=False)[0])
        return str(self._fast.decode(list(ids), skip_special_tokens=False))

    def id_text(self, tid: int) -> str:
        """The text of one id (empty for an id outside the vocabulary)."""
        return str(self._fast.decode([tid], skip_special_tokens=False))


class IncrementalDecoder:
    """Text of ids arriving a few at a time: each call returns only the new text, and holds
    back bytes that do not yet form a whole character (byte-level BPE splits them)."""

    __slots__ = ("_ids", "_prefix", "_read", "_tok")

    def __init__(self, tok: ChatTokenizer) -> None:
        self._tok = tok
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, ids: Sequence[int]) -> str:
        """The text ``ids`` add (empty while a character is incomplete)."""
        self._ids.extend(ids)
        # Decode a short window, not the whole completion: flat cost per delta.
        before = self._tok.decode(self._ids[self._prefix:self._read])
        text = self._tok.decode(self._ids[self._prefix:])
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before):]
