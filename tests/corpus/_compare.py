"""Compare two corpora byte for byte and say, readably, where they differ.

Any difference is a problem; the description narrows it down: which file (run, case), which
record or message, which header field (by the names stored in the msgpack header) or which
token buffer element (with the float bits). The record and frame layouts are parsed here
from their documented form (``tracewire.codec._binary``'s module doc), not through the codec
under test, so a codec change cannot hide from its own comparer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

__all__ = ["compare", "split_frames", "split_record", "split_segment"]

#: Paths reported per differing record/message/payload before "... and N more".
MAX_PATHS = 8
_RECORD = struct.Struct("<4sHHIIQII")
_ENTRY = struct.Struct("<QQ")
_DTYPES = {"<i1", "<i2", "<i4", "<i8", "|i1", "|u1", "<u1", "<u2", "<u4", "<u8", "<f2",
           "<f4", "<f8", "|b1"}


# -- layouts ----------------------------------------------------------------------------------
def split_segment(data: bytes) -> list[bytes]:
    """The records of a segment file, in order (each one's length from its prefix)."""
    out, off = [], 0
    while off < len(data):
        if len(data) - off < _RECORD.size:
            out.append(data[off:])
            break
        total = _RECORD.unpack_from(data, off)[5]
        if total < _RECORD.size:
            out.append(data[off:])
            break
        out.append(data[off : off + total])
        off += total
    return out


def split_record(rec: bytes) -> tuple[int, bytes, list[bytes]]:
    """(schema, msgpack header, buffers) of one record."""
    _, schema, _, hlen, nbuf, _, _, _ = _RECORD.unpack_from(rec)
    table = [_ENTRY.unpack_from(rec, _RECORD.size + i * _ENTRY.size) for i in range(nbuf)]
    hoff = _RECORD.size + nbuf * _ENTRY.size
    return schema, rec[hoff : hoff + hlen], [rec[o : o + n] for o, n in table]


def split_frames(frames: list[bytes]) -> tuple[int, bytes, list[bytes]]:
    """(schema, msgpack header, buffers) of ``encode_frames`` output."""
    magic, schema = struct.unpack_from("<2sH", frames[0])
    if magic != b"TW":
        raise ValueError(f"not a tracewire frame (magic {magic!r})")
    return schema, frames[0][4:], list(frames[1:])


# -- generic tree diff ------------------------------------------------------------------------
def _scalar_eq(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)  # -0.0, NaN payloads count
    return bool(a == b)


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v!r} (0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016x})"
    s = repr(v)
    return s if len(s) <= 120 else s[:117] + "..."


def tree_diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """``path: golden != now`` for every leaf that differs (maps by key, lists by index)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            p = f"{path}.{k}" if path else str(k)
            if k not in b:
                yield f"{p}: only in golden ({_show(a[k])})"
            elif k not in a:
                yield f"{p}: only now ({_show(b[k])})"
            else:
                yield from tree_diff(a[k], b[k], p)
        if list(a) != list(b) and set(a) == set(b):
            yield f"{path or '<top>'}: same keys in another order: {list(a)} -> {list(b)}"
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from tree_diff(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            yield f"{path}: {len(a)} items in golden, {len(b)} now"
    elif not _scalar_eq(a, b):
        yield f"{path or '<top>'}: {_show(a)} != {_show(b)}"


def _array_refs(tree: Any, path: str = "") -> Iterator[tuple[int, str, str, list[int]]]:
    # The codec's array references: [buffer index, dtype string, shape].
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _array_refs(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, list):
        if (len(tree) == 3 and isinstance(tree[0], int) and tree[1] in _DTYPES
                and isinstance(tree[2], list) and all(isinstance(d, int) for d in tree[2])):
            yield tree[0], path, tree[1], tree[2]
            return
        for i, v in enumerate(tree):
            yield from _array_refs(v, f"{path}[{i}]")


def _buffer_diff(a: bytes, b: bytes, where: str, dtype: str | None) -> str:
    if len(a) != len(b):
        return f"{where}: {len(a)} bytes in golden, {len(b)} now"
    if dtype is not None:
        dt = np.dtype(dtype)
        if len(a) % dt.itemsize == 0:
            x, y = np.frombuffer(a, dt), np.frombuffer(b, dt)
            bits = np.dtype(f"<u{dt.itemsize}") if dt.itemsize in (1, 2, 4, 8) else None
            diff = (x.view(bits) != y.view(bits)) if bits is not None else (x != y)
            idx = np.flatnonzero(diff)
            if idx.size:
                i = int(idx[0])
                more = f" (and {idx.size - 1} more elements)" if idx.size > 1 else ""
                shown = (f"{x[i].item()!r} (0x{int(x.view(bits)[i]):0{2 * dt.itemsize}x}) != "
                         f"{y[i].item()!r} (0x{int(y.view(bits)[i]):0{2 * dt.itemsize}x})"
                         if bits is not None else f"{x[i]!r} != {y[i]!r}")
                return f"{where}[{i}] {dtype}: {shown}{more}"
    i = next(i for i in range(len(a)) if a[i] != b[i])
    return f"{where}: first differing byte at {i}: 0x{a[i]:02x} != 0x{b[i]:02x}"


def encoded_diff(a: tuple[int, bytes, list[bytes]], b: tuple[int, bytes, list[bytes]]
                 ) -> list[str]:
    """Differences between two (schema, header, buffers) triples, by field and element."""
    out: list[str] = []
    if a[0] != b[0]:
        out.append(f"schema: {a[0]} != {b[0]}")
    try:
        ha, hb = msgspec.msgpack.decode(a[1]), msgspec.msgpack.decode(b[1])
    except msgspec.DecodeError as exc:
        return [*out, f"header does not decode as msgpack: {exc}"]
    out += tree_diff(ha, hb, "header")
    if not out and a[1] != b[1]:
        i = next((i for i, (x, y) in enumerate(zip(a[1], b[1], strict=False)) if x != y),
                 min(len(a[1]), len(b[1])))
        out.append(f"header: same values, other bytes (msgpack encoding) from byte {i}")
    refs = {r[0]: r for r in _array_refs(hb)}
    if len(a[2]) != len(b[2]):
        out.append(f"buffers: {len(a[2])} in golden, {len(b[2])} now")
    for i, (x, y) in enumerate(zip(a[2], b[2], strict=False)):
        if x != y:
            ref = refs.get(i)
            where = f"buffer {i}" + (f" ({ref[1]}, {ref[2]}{tuple(ref[3])})" if ref else "")
            out.append(_buffer_diff(x, y, where, ref[2] if ref else None))
    return out


def _bytes_diff(a: bytes, b: bytes) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
             min(len(a), len(b)))
    return f"{len(a)} bytes in golden, {len(b)} now; first difference at byte {i}"


def _cap(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_PATHS:
        return lines
    return [*lines[:MAX_PATHS], f"... and {len(lines) - MAX_PATHS} more"]


# -- per kind of file -------------------------------------------------------------------------
def _record_label(rec: bytes) -> str:
    try:
        h = msgspec.msgpack.decode(split_record(rec)[1])
    except Exception:
        return ""
    if isinstance(h, dict) and "seq" in h:  # a journal's delta record
        return f" (delta {h.get('seq')} of episode {h.get('episode')})"
    if isinstance(h, dict):
        return f" (episode {h.get('id')}, task {h.get('task_key')!r})"
    return ""


def _diff_segment(a: bytes, b: bytes) -> list[str]:
    ra, rb = split_segment(a), split_segment(b)
    out: list[str] = []
    if len(ra) != len(rb):
        out.append(f"{len(ra)} records in golden, {len(rb)} now")
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        if x == y:
            continue
        try:
            lines = encoded_diff(split_record(x), split_record(y))
        except (struct.error, ValueError) as exc:
            lines = [f"unreadable record: {exc}"]
        lines = lines or [f"framing bytes differ: {_bytes_diff(x, y)}"]
        out += [f"record {i}{_record_label(x)}: {line}" for line in _cap(lines)]
    return out


def _diff_index(a: bytes, b: bytes) -> list[str]:
    ra, rb = json.loads(a), json.loads(b)
    out = [f"{len(ra)} rows in golden, {len(rb)} now"] if len(ra) != len(rb) else []
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        lines = list(tree_diff(x, y))
        out += [f"row {i} (episode {x.get('episode_id')}): {line}" for line in _cap(lines)]
    return out or [f"same rows, other text: {_bytes_diff(a, b)}"]


def _diff_messages(a: bytes, b: bytes) -> list[str]:
    ma, mb = msgspec.msgpack.decode(a), msgspec.msgpack.decode(b)
    out = [f"{len(ma)} messages in golden, {len(mb)} now"] if len(ma) != len(mb) else []
    for i, (x, y) in enumerate(zip(ma, mb, strict=False)):
        if x == y:
            continue
        lines: list[str] = []
        if x[0] != y[0]:
            lines += [f"envelope: {line}" for line in
                      tree_diff(msgspec.msgpack.decode(x[0]), msgspec.msgpack.decode(y[0]))]
            lines = lines or [f"envelope: {_bytes_diff(x[0], y[0])}"]
        if x[1:] != y[1:]:
            try:
                lines += encoded_diff(split_frames(x[1:]), split_frames(y[1:]))
            except (struct.error, ValueError, IndexError) as exc:
                lines.append(f"frames unreadable: {exc}")
            lines = lines or [f"{len(x)} frames in golden, {len(y)} now"]
        out += [f"message {i}: {line}" for line in _cap(lines)]
    return out


def _safetensors(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    tensors = {k: body[v["data_offsets"][0] : v["data_offsets"][1]]
               for k, v in header.items() if k != "__metadata__"}
    return header, tensors


_ST_DTYPES = {"I32": "<i4", "U8": "|u1", "F32": "<f4", "I64": "<i8", "F64": "<f8"}


def _diff_payload(a: bytes, b: bytes) -> list[str]:
    (ha, ta), (hb, tb) = _safetensors(a), _safetensors(b)
    out: list[str] = []
    for k in list(ha) + [k for k in hb if k not in ha]:
        if k not in hb or k not in ha:
            out.append(f"tensor {k}: only {'in golden' if k in ha else 'now'}")
            continue
        if k == "__metadata__":
            out += [f"__metadata__.{line}" for line in tree_diff(ha[k], hb[k])]
            continue
        spec = {f: ha[k][f] for f in ("dtype", "shape")}
        now = {f: hb[k][f] for f in ("dtype", "shape")}
        if spec != now:
            out.append(f"tensor {k}: {spec} != {now}")
        elif k == "meta" and ta[k] != tb[k]:
            try:
                out += [f"meta.{line}" for line in tree_diff(json.loads(ta[k]), json.loads(tb[k]))]
            except ValueError:
                out.append(_buffer_diff(ta[k], tb[k], "tensor meta", None))
        elif ta[k] != tb[k]:
            out.append(_buffer_diff(ta[k], tb[k], f"tensor {k}", _ST_DTYPES.get(ha[k]["dtype"])))
    return _cap(out) or [f"same tensors, other bytes (header layout): {_bytes_diff(a, b)}"]


def _diff_scrubbed(a: bytes, b: bytes) -> list[str]:
    ra, rb = msgspec.msgpack.decode(a), msgspec.msgpack.decode(b)
    out = [f"{len(ra)} records in golden, {len(rb)} now"] if len(ra) != len(rb) else []
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        lines: list[str] = []
        if x[0] != y[0]:
            lines.append(f"schema: {x[0]} != {y[0]}")
        lines += tree_diff(x[1], y[1], "header")
        refs = {r[0]: r for r in _array_refs(y[1])}
        if len(x[2]) != len(y[2]):
            lines.append(f"buffers: {len(x[2])} in golden, {len(y[2])} now")
        for j, (p, q) in enumerate(zip(x[2], y[2], strict=False)):
            if p != q:
                ref = refs.get(j)
                where = f"buffer {j}" + (f" ({ref[1]}, {ref[2]}{tuple(ref[3])})" if ref else "")
                lines.append(_buffer_diff(p, q, where, ref[2] if ref else None))
        label = f" (task {x[1].get('task_key')!r})" if isinstance(x[1], dict) else ""
        out += [f"record {i}{label}: {line}" for line in _cap(lines)]
    return out


def _diff_lines(a: bytes, b: bytes) -> list[str]:
    # An HTTP answer: status and content type, then a JSON body or server-sent events.
    la, lb = a.split(b"\n"), b.split(b"\n")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            try:
                lines = [f"line {i + 1}: {line}" for line in
                         tree_diff(json.loads(x.removeprefix(b"data: ")),
                                   json.loads(y.removeprefix(b"data: ")))]
            except ValueError:
                lines = []
            return _cap(lines or [f"line {i + 1}: {_show(x)} != {_show(y)}"])
    return [f"{len(la)} lines in golden, {len(lb)} now"]


def _diff_requests(a: bytes, b: bytes) -> list[str]:
    ra, rb = msgspec.msgpack.decode(a), msgspec.msgpack.decode(b)
    out = [f"{len(ra)} requests in golden, {len(rb)} now"] if len(ra) != len(rb) else []
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        if x == y:
            continue
        where = f"request {i} ({x[0]} {x[1]})"
        if x[:2] != y[:2]:
            out.append(f"{where}: now {y[0]} {y[1]}")
        try:
            lines = list(tree_diff(json.loads(x[2]), json.loads(y[2]), "body"))
        except ValueError:
            lines = []
        if not lines and x[2] != y[2]:
            lines = [f"body: {_bytes_diff(x[2], y[2])}"]
        out += [f"{where}: {line}" for line in _cap(lines)]
    return out


def describe(name: str, a: bytes, b: bytes) -> list[str]:
    """Readable differences of corpus file ``name`` (golden ``a``, now ``b``)."""
    try:
        if name.endswith((".twr", ".twj")):
            lines = _diff_segment(a, b)
        elif name.endswith("index.json"):
            lines = _diff_index(a, b)
        elif name.endswith(".json"):
            lines = _cap(list(tree_diff(json.loads(a), json.loads(b))))
        elif name.endswith("records.msgpack"):
            lines = _diff_scrubbed(a, b)
        elif name.endswith(".msgs"):
            lines = _diff_messages(a, b)
        elif name.endswith(".reqs"):
            lines = _diff_requests(a, b)
        elif name.endswith(".http"):
            lines = _diff_lines(a, b)
        elif name.endswith(".safetensors"):
            lines = _diff_payload(a, b)
        else:
            lines = []
    except Exception as exc:  # the description must never hide the difference itself
        lines = [f"(could not describe: {type(exc).__name__}: {exc})"]
    return lines or [_bytes_diff(a, b)]


def compare(golden: dict[str, bytes], now: dict[str, bytes]) -> list[str]:
    """Every difference between two corpora, one line each (empty: byte-identical)."""
    out: list[str] = []
    for name in sorted(set(golden) | set(now)):
        if name not in now:
            out.append(f"{name}: missing now (in golden)")
        elif name not in golden:
            out.append(f"{name}: new file (not in golden)")
        elif golden[name] != now[name]:
            out += [f"{name}: {line}" for line in describe(name, golden[name], now[name])]
    return out
