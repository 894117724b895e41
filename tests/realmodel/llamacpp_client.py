"""A tiny blocking client for the real-engine tests: llama-server's ``/tokenize`` and the
llamacpp codec's ``/completion`` bodies, sent as they are and read back raw (so a test can
compare what tracewire parses with what the server put on the wire)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    """POST ``body`` as JSON to ``url + path``; the decoded JSON answer."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def post_stream(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    """POST a streamed request; the parsed ``data:`` objects in order."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                out.append(json.loads(line[5:]))
    return out


def tokenize(url: str, text: str) -> list[int]:
    """llama-server's own ids for ``text`` (special tokens parsed)."""
    ids = post(url, "/tokenize", {"content": text, "parse_special": True})["tokens"]
    assert isinstance(ids, list)
    return ids


def chatml(user: str) -> str:
    """SmolLM2's ChatML prompt for one user message (its template's default system line
    left out: the tests want a short, fixed prompt)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
