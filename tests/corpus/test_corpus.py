"""Byte-identical records, wire frames and sample payloads: the current code regenerates the
corpus (``_make``, in a child process, since it fixes the clock and the id source of the
process it runs in) and every byte must equal the golden files made from commit e666288.

The other tests prove the comparer sees what it must and names where: one flipped logprob
bit in a record, one frame byte, one payload bit, one index value, one SSE field, one value
of a scrubbed record, a lost or a new file. After a deliberate format
change: ``PYTHONPATH=src:. python -m tests.corpus._make --write`` (golden/README.md).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ._compare import compare, split_frames, split_record, split_segment
from ._files import GOLDEN, read_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def golden() -> dict[str, bytes]:
    corpus = read_dir(GOLDEN)
    assert len(corpus) > 40, "golden corpus missing (see tests/corpus/golden/README.md)"
    return corpus


def _array_ref(tree: object, want: str, path: str = "") -> tuple[int, str] | None:
    """(buffer index, path) of the first array reference whose path contains ``want``."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            got = _array_ref(v, want, f"{path}.{k}" if path else str(k))
            if got:
                return got
    elif isinstance(tree, list):
        if (len(tree) == 3 and isinstance(tree[0], int) and isinstance(tree[1], str)
                and want in path):
            return tree[0], path
        for i, v in enumerate(tree):
            got = _array_ref(v, want, f"{path}[{i}]")
            if got:
                return got
    return None


def test_current_code_reproduces_the_golden_corpus(tmp_path: Path,
                                                   golden: dict[str, bytes]) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    p = subprocess.run([sys.executable, "-m", "tests.corpus._make", "--out", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    problems = compare(golden, read_dir(tmp_path))
    assert not problems, (
        f"{len(problems)} differences from the golden corpus (commit e666288):\n"
        + "\n".join(problems[:60]))


def test_one_logprob_bit_in_a_record_is_named(golden: dict[str, bytes]) -> None:
    name = "records/sdk/segments/00000000.twr"
    records = split_segment(golden[name])
    rec = bytearray(records[1])
    _, header, _ = split_record(bytes(rec))
    found = _array_ref(msgspec.msgpack.decode(header), "logprobs")
    assert found is not None
    buf, path = found
    (off, n) = struct.unpack_from("<QQ", rec, 32 + 16 * buf)
    k = n // 4 - 1  # the last token's logprob: sampled, so a real value
    rec[off + 4 * k] ^= 1  # the lowest mantissa bit
    changed = dict(golden)
    changed[name] = b"".join([records[0], bytes(rec), *records[2:]])
    problems = compare(golden, changed)
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(f"{name}: record 1 (episode ") and "task 'chat-stream'" in line
    assert f"buffer {buf} ({path}, <f4(" in line and f"[{k}] <f4:" in line, line


def test_one_byte_in_a_wire_frame_is_named(golden: dict[str, bytes]) -> None:
    name = "wire/standin-stream.msgs"
    messages = msgspec.msgpack.decode(golden[name])
    _, header, bufs = split_frames(messages[1][1:])
    assert bufs, "a turn's delta carries token buffers"
    ids = _array_ref(msgspec.msgpack.decode(header), "ids")
    assert ids is not None
    frame = bytearray(messages[1][1 + 1 + ids[0]])  # envelope, header frame, then buffers
    frame[5] ^= 0x80
    messages[1][1 + 1 + ids[0]] = bytes(frame)
    problems = compare(golden, {**golden, name: msgspec.msgpack.encode(messages)})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{name}: message 1: buffer {ids[0]} ({ids[1]}, <i4("), problems
    assert ".columns.ids, <i4(" in problems[0] and "[1] <i4:" in problems[0], problems[0]

    # A header byte (one character of a node's text) is named by its field.
    messages = msgspec.msgpack.decode(golden[name])
    head = messages[2][1]
    at = head.index(b"answer 2")
    messages[2][1] = head[:at] + b"answer 7" + head[at + 8:]
    problems = compare(golden, {**golden, name: msgspec.msgpack.encode(messages)})
    assert len(problems) == 1, problems
    assert "message 2: header." in problems[0] and ".content: 'answer 2' != 'answer 7'" \
        in problems[0], problems[0]


def test_one_payload_bit_and_one_index_value_are_named(golden: dict[str, bytes]) -> None:
    name = "samples/http/chat.safetensors"
    data = bytearray(golden[name])
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + n])
    lo, _ = header["logprobs.0"]["data_offsets"]
    data[8 + n + lo + 4 * 3 + 3] ^= 0x01  # logprob 3's sign/exponent byte
    problems = compare(golden, {**golden, name: bytes(data)})
    assert problems == [problems[0]] and problems[0].startswith(
        f"{name}: tensor logprobs.0[3] <f4:"), problems

    name = "records/tools-s0/index.json"
    rows = json.loads(golden[name])
    rows[1]["reward"] = 0.5
    problems = compare(golden, {**golden, name: json.dumps(rows).encode()})
    assert problems == [f"{name}: row 1 (episode {rows[1]['episode_id']}): reward: "
                        "1.0 (0x3ff0000000000000) != 0.5 (0x3fe0000000000000)"], problems


def test_a_lost_or_new_file_is_a_difference(golden: dict[str, bytes]) -> None:
    lost = dict(golden)
    del lost["wire/standin-episode.msgs"]
    assert compare(golden, lost) == ["wire/standin-episode.msgs: missing now (in golden)"]
    assert compare(golden, {**golden, "x.bin": b""}) == ["x.bin: new file (not in golden)"]
    assert compare(golden, dict(golden)) == []


def test_one_changed_sse_event_and_scrubbed_record_are_named(golden: dict[str, bytes]) -> None:
    name = "http/chat-1.http"
    lines = golden[name].split(b"\n")
    k = next(i for i, line in enumerate(lines) if b'"finish_reason":"length"' in line
             or b'"finish_reason":"stop"' in line)
    changed = lines[k].replace(b'"finish_reason":"', b'"finish_reason":"x', 1)
    body = b"\n".join([*lines[:k], changed, *lines[k + 1:]])
    problems = compare(golden, {**golden, name: body})
    assert len(problems) == 1 and problems[0].startswith(f"{name}: line {k + 1}: "), problems
    assert "finish_reason: " in problems[0] and "!= 'x" in problems[0], problems

    name = "records-scrubbed/command-s0/records.msgpack"
    records = msgspec.msgpack.decode(golden[name])
    records[1][1]["traces"][0]["info"]["command"]["exit_code"] = 1
    problems = compare(golden, {**golden, name: msgspec.msgpack.encode(records)})
    assert problems == [f"{name}: record 1 (task {records[1][1]['task_key']!r}): "
                        "header.traces[0].info.command.exit_code: 0 != 1"], problems
