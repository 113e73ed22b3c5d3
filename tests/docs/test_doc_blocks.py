"""Docs as tests: every fenced ```python block in README.md, docs/*.md and
integrations/*/README.md runs as written.

Each block runs in its own Python subprocess, in a fresh temporary working directory (and its own
`TITO_CACHE_DIR`), against one fake vLLM server (`tito_agents.testing.fake_vllm`) started by this
module. Tracebacks name the Markdown file and line (the block is compiled under the file's
name, at its own line numbers), and a failing test says where its block starts: `README.md:16`.

Conventions for writers, on the line directly before the opening fence:

* `<!-- docs-test: skip (reason) -->`: the block cannot run here (a GPU server, a cluster, a
  trainer...). The reason is required; the test is reported as skipped with it.
* `<!-- docs-test: continues -->`: the block goes on from the previous python block of the same
  file (an example split by prose); both run in one process, in order, and the earlier block
  must run too.
* `<!-- docs-test: needs gateway redis ray -->` (one name or more): the block talks to
  servers this module starts for it, once per module and only if some block needs them. A
  block that continues one with needs gets them too.
  - `gateway`: `tito-agents serve` in front of the fake vLLM (own sink and state folder), as
    docs/gateway.md starts it; the gateway placeholder `http://127.0.0.1:8100` (or
    `localhost:8100`) becomes its URL, and `TITO_GATEWAY_TOKEN` holds its control token.
  - `redis`: a `redis-server` on a free port (no persistence, no password); `redis://` URLs on
    port 6379 (any host; credentials in them are dropped) point at it. Skipped, saying so,
    where `redis-server` is not installed (Debian: `apt-get install redis-server`).
  - `ray`: no server here: the block starts a local Ray itself (a `ray://` sink does, in a
    process not yet connected to Ray). Skipped where `ray` is not installed.

Base URLs: placeholders for a vLLM server are pointed at the fake: `http://my-vllm:8000/v1`,
`http://gpu-host:8000/v1`, `http://localhost:8000/v1` and `http://127.0.0.1:8000/v1` (any port,
and hosts `my-vllm`, `gpu-host`, `vllm`, `localhost`, `127.0.0.1`) are replaced by the fake's
base URL before the block runs, and `OPENAI_BASE_URL` / `OPENAI_API_KEY` are set for blocks that
rely on the openai defaults. Other URLs are left alone.

A block must also leave no sink unclosed: stderr may not hold "was not closed before exit".
Shell blocks are not run here: the install lines are checked by tests/install.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway_harness import TOKEN as GATEWAY_TOKEN
from tests.support.gateway_harness import serve_cli
from tito_agents.sinks.harness import free_port
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "integrations").glob("*/README.md")),
]
TIMEOUT_S = 90  # per block; the test's own limit (pytest-timeout) also covers the fake's start

_FENCE = re.compile(r"^\s*```python\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(skip|continues|needs)\b\s*(.*?)\s*-->\s*$")
_PLACEHOLDER_URL = re.compile(r"https?://(?:my-vllm|gpu-host|vllm|localhost|127\.0\.0\.1):\d+/v1")
_GATEWAY_URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):8100\b")
_REDIS_URL = re.compile(r"redis://(?:[^@/\s\"']*@)?[A-Za-z0-9.-]+:6379\b")
SERVICES = ("gateway", "redis", "ray")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the line of the opening fence, 1-based
    code: str
    skip: str | None  # the reason, when marked skip
    previous: Block | None  # the block this one continues
    needs: tuple[str, ...] = ()  # servers the harness starts for it (SERVICES)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def chain(self) -> list[Block]:
        blocks: list[Block] = []
        block: Block | None = self
        while block is not None:
            blocks.insert(0, block)
            block = block.previous
        return blocks


def find_blocks(path: Path) -> list[Block]:
    """The python blocks of one Markdown file, with their markers; a bad marker is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        if not _FENCE.match(lines[index]):
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        marker = _MARKER.match(lines[index - 1].strip()) if index else None
        skip = previous = None
        needs: tuple[str, ...] = ()
        if marker and marker[1] == "needs":
            needs = tuple(marker[2].split())
            if not needs or set(needs) - set(SERVICES):
                raise ValueError(f"{path}:{index}: docs-test: needs takes names from {SERVICES}")
        elif marker and marker[1] == "skip":
            skip = marker[2].strip("() ")
            if not skip:
                raise ValueError(f"{path}:{index}: docs-test: skip needs a (reason)")
        elif marker:
            if not blocks:
                raise ValueError(f"{path}:{index}: docs-test: continues, but no block before it")
            previous = blocks[-1]
        code = textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n"
        blocks.append(Block(path, index + 1, code, skip, previous, needs))
        index = end + 1
    return blocks


BLOCKS = [block for path in DOCS for block in find_blocks(path)]


@dataclass(frozen=True)
class Servers:
    """Where a block's placeholders point: the fake vLLM, and what the block needs."""

    vllm: str  # the fake's base URL, ending in /v1
    gateway: str | None = None  # http://127.0.0.1:PORT
    redis: str | None = None  # redis://127.0.0.1:PORT

    def fill(self, code: str) -> str:
        code = _PLACEHOLDER_URL.sub(self.vllm, code)
        if self.gateway is not None:
            code = _GATEWAY_URL.sub(self.gateway, code)
        if self.redis is not None:
            code = _REDIS_URL.sub(self.redis, code)
        return code


def program(block: Block, servers: Servers, folder: Path) -> Path:
    """A script that runs the block (and what it continues) compiled under the Markdown file's
    path, padded to its line numbers, so tracebacks show the Markdown file, line and text."""
    lines = ["import pathlib\n", "namespace = {'__name__': '__main__'}\n"]
    for number, piece in enumerate(block.chain()):
        source = folder / f"piece{number}.py"
        source.write_text("\n" * piece.line + servers.fill(piece.code), "utf-8")
        lines.append(
            f"exec(compile(pathlib.Path({str(source)!r}).read_text('utf-8'), {str(piece.path)!r}, "
            "'exec'), namespace)\n"
        )
    script = folder / "block.py"
    script.write_text("".join(lines), encoding="utf-8")
    return script


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as server:
        yield server


@pytest.fixture(scope="module")
def gateway_url(
    fake_server: FakeVLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`tito-agents serve` in front of the fake, as docs/gateway.md starts it (own sink)."""
    folder = tmp_path_factory.mktemp("gateway")
    with serve_cli(fake_server.base_url, folder / "samples.jsonl", folder / "state") as (_, url):
        yield url


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A throwaway redis-server on a free port: no snapshots, no append-only file."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs redis-server (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, process)
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until the server accepts connections (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_block_runs_as_written(
    block: Block, fake_server: FakeVLLMServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.where}: {block.skip}")
    if any(piece.skip for piece in block.chain()):
        pytest.skip(f"{block.where}: continues a block marked skip")
    needs = {name for piece in block.chain() for name in piece.needs}
    if "ray" in needs and importlib.util.find_spec("ray") is None:
        pytest.skip(f"{block.where}: needs ray (pip install 'tito-agents[ray]')")
    servers = Servers(
        fake_server.base_url,
        gateway=request.getfixturevalue("gateway_url") if "gateway" in needs else None,
        redis=request.getfixturevalue("redis_url") if "redis" in needs else None,
    )
    work = tmp_path / "work"
    work.mkdir()
    script = program(block, servers, tmp_path)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": fake_server.base_url,
        "OPENAI_API_KEY": "EMPTY",
        "TITO_CACHE_DIR": str(tmp_path / "state"),  # spill folders, journals: not the user's
        "HF_HOME": str(tmp_path / "huggingface"),  # datasets' caches: not the user's either
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    if servers.gateway is not None:
        env["TITO_GATEWAY_TOKEN"] = GATEWAY_TOKEN
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the python block at {block.where} did not finish within {TIMEOUT_S}s")
    output = (done.stdout + done.stderr)[-4000:]
    if done.returncode != 0:
        pytest.fail(f"the python block at {block.where} failed:\n{output}", pytrace=False)
    if "was not closed before exit" in done.stderr:
        pytest.fail(
            f"the python block at {block.where} leaves a sink open:\n{output}", pytrace=False
        )


def test_markers_are_parsed(tmp_path: Path) -> None:
    """The conventions above, on a small file: skip with a reason, continues, plain."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: skip (needs a GPU) -->\n```python\nimport gpu\n```\n"
        "```python\nx = 1\n```\ntext\n<!-- docs-test: continues -->\n```python\nprint(x)\n```\n",
        encoding="utf-8",
    )
    skipped, first, second = find_blocks(page)
    assert (skipped.skip, skipped.line, skipped.code) == ("needs a GPU", 2, "import gpu\n")
    assert first.skip is None and first.previous is None and first.line == 5
    assert second.previous is first and second.chain() == [first, second]
    page.write_text("<!-- docs-test: skip -->\n```python\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs a"):
        find_blocks(page)
    page.write_text("<!-- docs-test: needs redis ray -->\n```python\nx\n```\n", encoding="utf-8")
    (needing,) = find_blocks(page)
    assert needing.needs == ("redis", "ray") and needing.skip is None
    page.write_text("<!-- docs-test: needs a-gpu -->\n```python\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs takes names"):
        find_blocks(page)


def test_placeholders_point_at_the_servers() -> None:
    servers = Servers(
        "http://127.0.0.1:5001/v1", gateway="http://127.0.0.1:5002", redis="redis://127.0.0.1:5003"
    )
    code = (
        'a = "http://my-vllm:8000/v1"; b = "http://127.0.0.1:8100" + "/episodes/x/v1"\n'
        'c = "redis://:secret@10.0.0.5:6379/0?stream=s"; d = "redis://127.0.0.1:6379/0"\n'
    )
    assert servers.fill(code) == (
        'a = "http://127.0.0.1:5001/v1"; b = "http://127.0.0.1:5002" + "/episodes/x/v1"\n'
        'c = "redis://127.0.0.1:5003/0?stream=s"; d = "redis://127.0.0.1:5003/0"\n'
    )
    assert Servers("http://127.0.0.1:5001/v1").fill('"http://127.0.0.1:8100"') == (
        '"http://127.0.0.1:8100"'
    )
