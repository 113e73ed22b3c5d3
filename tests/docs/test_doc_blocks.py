"""Docs as tests: every fenced ```python block in README.md, docs/*.md and
integrations/*/README.md runs as written.

Each block runs in its own Python subprocess, in a fresh temporary working directory (and its own
`TITO_CACHE_DIR`), against one fake vLLM server (`tito_agents.testing.fake_vllm`) started by this
module. Tracebacks name the Markdown file and line (the block is compiled under the file's
name, at its own line numbers), and a failing test says where its block starts: `README.md:16`.

A block runs as a reader sees it: it is a complete program, or its first line says, in text the
reader sees, what else it is:

* `# continues the block above`: the block goes on from the previous python block of the same
  file (an example split by prose); both run in one process, in order, and the earlier block
  must run too.
* `# fragment: <of what>`: a piece of a program (a signature, a configuration excerpt); it is
  compiled, not run. Saying of what is required.

Every other block must run on its own. Conventions for writers, on the line directly before the
opening fence (invisible to a reader, so they never change what the block means):

* `<!-- docs-test: skip (reason) -->`: the block cannot run here (a GPU server, a cluster, a
  trainer...). The reason is required; the test is reported as skipped with it.
* `<!-- docs-test: needs gateway redis ray -->` (one name or more): the block talks to
  servers this module starts for it, once per module and only if some block needs them. A
  block that continues one with needs gets them too.
  - `gateway`: `tito-agents serve` in front of the fake vLLM (own sink and state folder), as
    docs/gateway.md starts it; the gateway placeholder `http://127.0.0.1:8100` (or
    `localhost:8100`) becomes its URL, and `TITO_GATEWAY_TOKEN` holds its control token. Such a
    block runs twice against the same gateway, as a reader who runs the example again: its
    episode ids are taken by then.
  - `redis`: a `redis-server` on a free port (no persistence, no password); `redis://` URLs on
    port 6379 (any host; credentials in them are dropped) point at it. Skipped, saying so,
    where `redis-server` is not installed (Debian: `apt-get install redis-server`).
  - `ray`: no server here: the block starts a local Ray itself (a `ray://` sink does, in a
    process not yet connected to Ray). Skipped where `ray` is not installed.

Any other `docs-test:` marker is an error (a continuation says so in the block, not in a comment).

Base URLs: placeholders for a vLLM server are pointed at the fake: `http://my-vllm:8000/v1`,
`http://gpu-host:8000/v1`, `http://localhost:8000/v1` and `http://127.0.0.1:8000/v1` (any port,
and hosts `my-vllm`, `gpu-host`, `vllm`, `localhost`, `127.0.0.1`) are replaced by the fake's
base URL before the block runs, and `OPENAI_BASE_URL` / `OPENAI_API_KEY` are set for blocks that
rely on the openai defaults. Other URLs are left alone.

A block must also leave no sink unclosed: stderr may not hold "was not closed before exit".
Shell blocks are not run here: the install lines are checked by tests/install.
"""

from __future__ import annotations

import ast
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
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(\S*)\s*(.*?)\s*-->\s*$")
_CONTINUES = re.compile(r"^#\s*continues the block above\b")
_FRAGMENT = re.compile(r"^#\s*fragment\b:?\s*(.*)$")
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
    previous: Block | None  # the block this one continues (its first line says so)
    needs: tuple[str, ...] = ()  # servers the harness starts for it (SERVICES)
    fragment: str | None = None  # what it is a fragment of (its first line says so): not run

    @property
    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}"

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
        where = f"{path}:{index + 1}"
        skip, needs = _hidden_marker(lines[index - 1].strip() if index else "", where)
        code = textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n"
        first = code.lstrip("\n").split("\n", 1)[0].strip()
        previous = fragment = None
        if _CONTINUES.match(first):
            if not blocks:
                raise ValueError(f"{where}: '# continues the block above', but no block before it")
            previous = blocks[-1]
            if previous.fragment is not None:
                raise ValueError(f"{where}: continues a fragment, which is never run")
        elif found := _FRAGMENT.match(first):
            fragment = found[1].strip()
            if not fragment:
                raise ValueError(f"{where}: '# fragment:' must say of what")
        blocks.append(Block(path, index + 1, code, skip, previous, needs, fragment))
        index = end + 1
    return blocks


def _hidden_marker(line: str, where: str) -> tuple[str | None, tuple[str, ...]]:
    """The skip reason and the servers a `<!-- docs-test: ... -->` line asks for. Only skip and
    needs exist: anything else (a continuation, above all) would change what the block means
    without the reader seeing it."""
    marker = _MARKER.match(line)
    if marker is None:
        return None, ()
    kind, rest = marker[1], marker[2]
    if kind == "needs":
        needs = tuple(rest.split())
        if not needs or set(needs) - set(SERVICES):
            raise ValueError(f"{where}: docs-test: needs takes names from {SERVICES}")
        return None, needs
    if kind == "skip":
        reason = rest.strip("() ")
        if not reason:
            raise ValueError(f"{where}: docs-test: skip needs a (reason)")
        return reason, ()
    raise ValueError(
        f"{where}: 'docs-test: {kind}' is not a marker (skip or needs); a block that goes on from "
        "the one before says so in its first line, where the reader sees it: "
        "'# continues the block above'"
    )


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
    if block.fragment is not None:
        # a fragment is never run; it must still be Python a reader can paste into a program
        # (`await` at its top level: many are the body of an async function)
        compile(
            "\n" * block.line + block.code,
            str(block.path),
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        )
        return
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
    runs = 2 if servers.gateway is not None else 1  # a reader runs a gateway example again
    for run in range(1, runs + 1):
        output = _run_script(block, script, work, env)
        if run > 1 and output:
            output = f"(run {run}, against the same gateway)\n{output}"
        if output:
            pytest.fail(output, pytrace=False)


def _run_script(block: Block, script: Path, work: Path, env: dict[str, str]) -> str:
    """Runs the block's script once; what went wrong, or "" when it ran cleanly."""
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
        return f"the python block at {block.where} did not finish within {TIMEOUT_S}s"
    output = (done.stdout + done.stderr)[-4000:]
    if done.returncode != 0:
        return f"the python block at {block.where} failed:\n{output}"
    if "was not closed before exit" in done.stderr:
        return f"the python block at {block.where} leaves a sink open:\n{output}"
    return ""


def test_markers_are_parsed(tmp_path: Path) -> None:
    """The conventions above, on a small file: skip with a reason, a visible continuation, a
    visible fragment, plain."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: skip (needs a GPU) -->\n```python\nimport gpu\n```\n"
        "```python\nx = 1\n```\ntext\n```python\n# continues the block above\nprint(x)\n```\n"
        "```python\n# fragment: the signature of run()\ndef run(x): ...\n```\n",
        encoding="utf-8",
    )
    skipped, first, second, fragment = find_blocks(page)
    assert (skipped.skip, skipped.line, skipped.code) == ("needs a GPU", 2, "import gpu\n")
    assert first.skip is None and first.previous is None and first.line == 5
    assert second.previous is first and second.chain() == [first, second]
    assert fragment.fragment == "the signature of run()" and fragment.previous is None
    page.write_text("<!-- docs-test: skip -->\n```python\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs a"):
        find_blocks(page)
    page.write_text("<!-- docs-test: needs redis ray -->\n```python\nx\n```\n", encoding="utf-8")
    (needing,) = find_blocks(page)
    assert needing.needs == ("redis", "ray") and needing.skip is None
    page.write_text("<!-- docs-test: needs a-gpu -->\n```python\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs takes names"):
        find_blocks(page)
    page.write_text("```python\n# fragment:\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must say of what"):
        find_blocks(page)
    page.write_text("```python\n# continues the block above\nx\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no block before it"):
        find_blocks(page)


def test_an_invisible_continuation_is_refused(tmp_path: Path) -> None:
    """A block may not lean on the one before through a comment the reader never sees."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n<!-- docs-test: continues -->\n```python\nprint(x)\n```\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="continues the block above"):
        find_blocks(page)


def test_a_block_that_is_not_complete_fails(tmp_path: Path) -> None:
    """A block that uses what an earlier block defined, without saying so, runs alone and fails;
    the same block saying `# continues the block above` runs after it."""
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```python\nprint(x + 1)\n```\n", encoding="utf-8")
    _, alone = find_blocks(page)
    work = tmp_path / "work"
    work.mkdir()
    servers = Servers("http://127.0.0.1:9/v1")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    failure = _run_script(alone, program(alone, servers, tmp_path), work, env)
    assert "failed" in failure and "NameError" in failure
    page.write_text(
        "```python\nx = 1\n```\n\n```python\n# continues the block above\nprint(x + 1)\n```\n",
        encoding="utf-8",
    )
    _, continued = find_blocks(page)
    assert _run_script(continued, program(continued, servers, tmp_path), work, env) == ""


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


def test_the_readme_starts_the_fake_before_its_first_block() -> None:
    """A newcomer's first command block starts the server their first Python block talks to, on
    the port that block uses: the quick start has no step that is not written down."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_python = text.index("```python")
    first_shell = text.index("```bash")
    assert first_shell < first_python
    shell = text[first_shell : text.index("```", first_shell + 7)]
    started = re.search(r"python -m tito_agents\.testing\.fake_vllm --port (\d+)", shell)
    assert started is not None, "the README's first shell block does not start the fake vLLM"
    block = next(block for block in BLOCKS if block.path.name == "README.md")
    assert f"http://127.0.0.1:{started[1]}/v1" in block.code
