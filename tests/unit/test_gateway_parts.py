"""The gateway's parts without a server: the control token's sources, upstream URLs, the
restart journal, and the headers that never travel upstream."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tito_agents.cli.serve import TOKEN_ENV, control_token
from tito_agents.gateway import upstream_root
from tito_agents.gateway._forward import request_headers
from tito_agents.gateway._journal import Journal


def test_control_token_from_env_else_file_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    path = tmp_path / "token"
    token = control_token(path, 8100)
    assert len(token) >= 32 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert control_token(path, 8100) == token  # read back, not replaced
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert control_token(path, 8100) == "from-env"


def test_upstream_root_accepts_root_or_base_url() -> None:
    assert upstream_root("http://h:8000/v1/") == "http://h:8000"
    assert upstream_root("http://h:8000") == "http://h:8000"
    assert upstream_root("https://h/prefix/v1") == "https://h/prefix"
    with pytest.raises(ValueError):
        upstream_root("h:8000")


def test_journal_reports_open_episodes_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = Journal(path)
    assert journal.recover() == {}
    journal.opened("a", task_id="t")
    journal.opened("b")
    journal.closed("b")
    journal.close()
    with path.open("ab") as handle:
        handle.write(b'{"op":"open","id":"c"')  # the process died mid-write
    again = Journal(path)
    lost = again.recover()
    assert list(lost) == ["a"] and lost["a"]["task_id"] == "t"
    again.forgotten("a")
    again.close()
    last = Journal(path)
    assert last.recover() == {}
    last.close()


def test_hop_by_hop_and_gateway_headers_stay_behind() -> None:
    sent = request_headers(
        [
            (b"Host", b"gw"),
            (b"Authorization", b"Bearer vllm-key"),
            (b"X-Tito-Episode", b"ep"),
            (b"Connection", b"keep-alive"),
            (b"Content-Length", b"3"),
            (b"Content-Type", b"application/json"),
        ]
    )
    assert sent == [(b"Authorization", b"Bearer vllm-key"), (b"Content-Type", b"application/json")]


def test_watching_the_client_cancels_the_work_when_it_leaves() -> None:
    """`unless_client_leaves`: the client's disconnect cancels the work (None); work that ends
    first wins and stops the watcher; the work's own error and a cancellation from outside (the
    server stopping) propagate as they are."""
    import asyncio

    from tito_agents.gateway._app import unless_client_leaves

    async def scenario() -> None:
        leave = asyncio.Event()

        async def receive() -> dict[str, str]:
            await leave.wait()
            return {"type": "http.disconnect"}

        started, cancelled = asyncio.Event(), []

        async def slow() -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return "never"

        async def quick() -> str:
            return "answer"

        async def broken() -> str:
            raise ValueError("work failed")

        task = asyncio.ensure_future(unless_client_leaves(receive, slow))
        await started.wait()
        leave.set()
        assert await task is None and cancelled == [True]
        leave.clear()
        assert await unless_client_leaves(receive, quick) == "answer"
        with pytest.raises(ValueError, match="work failed"):
            await unless_client_leaves(receive, broken)
        started.clear()
        outer = asyncio.ensure_future(unless_client_leaves(receive, slow))
        await started.wait()
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        for _ in range(3):  # a cancelled watcher ends on the loop's next turn
            await asyncio.sleep(0)
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no watcher left behind

    asyncio.run(scenario())


def test_the_start_up_line_never_shows_a_credential() -> None:
    """`tito-agents serve` prints its upstream and sink: user names and passwords are masked."""
    from tito_agents.cli.serve import without_credentials

    assert without_credentials("redis://user:pw@h:6379/0?x=1") == "redis://***@h:6379/0?x=1"
    assert without_credentials("http://u:p@vllm:8000") == "http://***@vllm:8000"
    assert without_credentials("rediss://:p@w@h") == "rediss://***@h"
    for plain in ("samples.jsonl", "redis://h:6379?x=a@b", "http://h/a@b"):
        assert without_credentials(plain) == plain
