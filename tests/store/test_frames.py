"""``Run.append_frames`` with the frames an env server sends (``keep_frames=True``)."""

from __future__ import annotations

from pathlib import Path

from tests.codec.equality import assert_episode_equal
from tests.serve.conftest import client_of, serving
from tracewire.codec import frames_to_record
from tracewire.store import Run, open_run


async def test_append_frames_of_env_server_episodes(tmp_path: Path) -> None:
    async with serving() as srv, client_of(srv) as client:
        results = [await client.run({"key": f"t{i}", "turns": 3 + i, "tokens": 40},
                                    keep_frames=True) for i in range(2)]
        group = await client.run_group({"key": "g", "turns": 2, "tokens": 30}, r=2,
                                       keep_frames=True)
    results += group
    run = await Run.create(tmp_path / "r")
    refs = []
    for res in results:
        assert res.frames is not None
        refs.append(await run.append_frames(res.frames))
    await run.close()
    with open_run(tmp_path / "r") as r:
        seg = (tmp_path / "r" / "segments" / "00000000.twr").read_bytes()
        rows = r.rows()
        assert [row.episode_id for row in rows] == [res.episode.id for res in results]
        for res, ref, row in zip(results, refs, rows, strict=True):
            assert res.frames is not None
            # Persisted as they arrived: the record is exactly the frames' record.
            want = b"".join(bytes(memoryview(p)) for p in frames_to_record(res.frames))
            assert seg[ref.offset : ref.offset + ref.length] == want
            assert_episode_equal(r.get(res.episode.id), res.episode)
            t = res.episode.traces[0]
            assert (row.task_key, row.env, row.turns) == (res.episode.task_key, "standin",
                                                          len(t.calls))
            assert row.n_tokens == len(t.columns) and row.group_index == res.episode.group_index
        assert rows[2].group_id == rows[3].group_id is not None
