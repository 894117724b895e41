"""Token text for the token view: the run's tokenizer as a vocabulary table.

The page fetches the table once (``/api/vocab``) and looks every id up locally, so a
1 M-token branch costs the server nothing per id. The table is built in a worker thread on
first request and kept (one run, one tokenizer). Which tokenizer a run used: the directory
or GGUF file named by ``tokenizer`` in the run's config (``Run.create(meta=...)``, kept
under ``meta["config"]``; token-in/token-out runs), else the built-in model's when the config's
``model`` names it; otherwise the page shows ids only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from .._errors import TracewireError
from ._heat import Boundary

__all__ = ["MAX_VOCAB", "TokenizerKind", "TokenizerRef", "VocabTable", "resolve_tokenizer"]

#: Largest vocabulary served as a table (real models have up to ~260k ids).
MAX_VOCAB = 1_048_576
#: Ids decoded / encoded per slice; between slices the worker thread yields the GIL so the
#: event loop never waits on a whole 150k-id table.
SLICE = 4096


class TokenizerKind(StrEnum):
    """Where a run's token text comes from (``/api/run``'s ``tokenizer.kind``)."""

    #: The built-in model's own tokenizer.
    BUILTIN = "builtin"
    #: A tokenizer directory or GGUF file the run names.
    DIR = "dir"


@dataclass(frozen=True)
class TokenizerRef:
    """Which tokenizer a run used: ``kind`` builtin or dir (a directory or GGUF file, with
    ``path``), or None with the ``reason`` no tokenizer is known."""

    kind: TokenizerKind | None
    name: str
    path: Path | None = None
    reason: str = ""

    def describe(self) -> dict[str, Any]:
        """JSON form for ``/api/run``."""
        return {"known": self.kind is not None, "kind": self.kind, "name": self.name,
                "reason": self.reason or None}  # fmt: skip


def resolve_tokenizer(meta: dict[str, Any], run_dir: Path) -> TokenizerRef:
    """The tokenizer of a run, from its metadata (see the module docstring)."""
    from ..model import MODEL_NAME

    # What a run was created with lives under "config"; accept it at the top level too.
    raw = meta.get("config")
    config: dict[str, Any] = raw if isinstance(raw, dict) else {}
    named = config.get("tokenizer", meta.get("tokenizer"))
    if isinstance(named, str) and named:
        path = Path(named)
        # A relative directory is taken from where the run was made, else next to the run.
        for cand in (path, run_dir / path) if not path.is_absolute() else (path,):
            if (cand / "tokenizer.json").is_file() or (cand.is_file() and _is_gguf(cand)):
                return TokenizerRef(TokenizerKind.DIR, str(named), cand.resolve())
        return TokenizerRef(None, str(named),
                            reason=f"tokenizer directory {named!r} not found (ids only)")
    if config.get("model", meta.get("model")) == MODEL_NAME:
        return TokenizerRef(TokenizerKind.BUILTIN, MODEL_NAME)
    return TokenizerRef(None, "", reason="the run records no tokenizer (ids only)")


def _is_gguf(path: Path) -> bool:
    from ..tokens import is_gguf

    return is_gguf(path)


def _builtin_table() -> tuple[list[str], list[int]]:
    from ..model import load_tokenizer

    tok = load_tokenizer()
    pieces = [tok.token_text(i) for i in range(tok.vocab_size)]
    return pieces, [i for i in range(tok.vocab_size) if tok.is_special(i)]


def _load(path: Path) -> Any:
    from ..tokens import ChatTokenizer

    return ChatTokenizer(path)


def _file_table(tok: Any) -> tuple[list[str], list[int]]:
    n = min(int(tok.vocab_size), MAX_VOCAB)
    # The Rust tokenizer behind a directory batch-decodes; any other loader goes id by id.
    fast = getattr(getattr(tok, "hf", None), "backend_tokenizer", None)
    pieces: list[str] = []
    for lo in range(0, n, SLICE):
        hi = min(lo + SLICE, n)
        if fast is not None:
            batch = [[i] for i in range(lo, hi)]
            pieces += [str(p) for p in fast.decode_batch(batch, skip_special_tokens=False)]
        else:
            pieces += [str(tok.id_text(i)) for i in range(lo, hi)]
        time.sleep(0)
    return pieces, sorted(int(i) for i in tok.special.values() if int(i) < n)


def _boundary(tok: Any) -> Boundary | None:
    from ..tokens import TemplateError, probe_family

    try:
        fam = probe_family(tok)
    except (TemplateError, ValueError, KeyError, AttributeError):
        return None
    close = tok.token_id(fam.close) if fam.close else None
    return Boundary(None if close is None else int(close),
                    tuple(int(i) for i in tok.encode(fam.junction)) if fam.junction else ())


def _dumps(table: dict[str, Any]) -> bytes:
    # The pieces list is most of the bytes: encode it in slices, yielding between them.
    pieces = table.pop("pieces")
    parts = []
    for lo in range(0, len(pieces), SLICE):
        parts.append(orjson.dumps(pieces[lo : lo + SLICE])[1:-1])
        time.sleep(0)
    head = orjson.dumps(table)
    return head[:-1] + b',"pieces":[' + b",".join(parts) + b"]}"


class VocabTable:
    """The vocabulary of one run's tokenizer as JSON bytes, built once (thread-safe)."""

    def __init__(self, ref: TokenizerRef) -> None:
        self.ref = ref
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._tok: Any = None
        self._tok_error: str | None = None
        self._boundary: Boundary | None = None
        self._boundary_done = False

    def _tokenizer(self) -> Any:
        # Loaded once (under the lock) for both the table and the turn boundary.
        if self._tok is None and self._tok_error is None and self.ref.path is not None:
            try:
                self._tok = _load(self.ref.path)
            except (TracewireError, OSError, ValueError) as exc:
                self._tok_error = str(exc)
        if self._tok is None:
            raise ValueError(self._tok_error or "no tokenizer file")
        return self._tok

    def boundary(self) -> Boundary | None:
        """The run's template turn boundary as ids (None for the built-in model, an unknown
        tokenizer, or a template with none); blocks on first use."""
        with self._lock:
            if not self._boundary_done:
                self._boundary_done = True
                if self.ref.kind == TokenizerKind.DIR:
                    try:
                        self._boundary = _boundary(self._tokenizer())
                    except ValueError:
                        self._boundary = None
            return self._boundary

    def body(self) -> bytes:
        """``{"known", "kind", "name", "size", "pieces", "special"}`` as JSON (blocks: call
        from a worker thread); an unknown or unloadable tokenizer gives ``known: false``."""
        with self._lock:
            if self._body is None:
                self._body = _dumps(self._build())
            return self._body

    def _build(self) -> dict[str, Any]:
        ref = self.ref
        head = ref.describe()
        if ref.kind is None:
            return {**head, "size": 0, "pieces": [], "special": []}
        try:
            if ref.kind == TokenizerKind.BUILTIN:
                pieces, special = _builtin_table()
            else:
                pieces, special = _file_table(self._tokenizer())
        except (TracewireError, OSError, ValueError) as exc:
            # A broken or unreadable tokenizer must not break the page: ids only, with why.
            return {**head, "known": False, "reason": f"cannot load the tokenizer: {exc}",
                    "size": 0, "pieces": [], "special": []}  # fmt: skip
        return {**head, "size": len(pieces), "pieces": pieces, "special": special}
