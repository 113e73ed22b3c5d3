"""Edge inputs of `tito_agents.rl` without a real vLLM: version logs without an initial label, out
of order or with a clock stepped back, labels that are not step numbers, weight routes that answer
garbage or time out mid-update, agents that are not async or return no number, and `lag=1` with a
batch of another shape (TRL's evaluation) or a timeout."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.rl_versions import call, sample, update
from tests.support.sessions_fake import responder
from tito_agents.rl import TrlRollout, VersionLog, VllmWeights, WeightSyncError, filter_stale
from tito_agents.rl import relabel as relabel_sample
from tito_agents.rl.versions import oldest_version
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

# ---- versions ----


def test_a_log_without_initial_keeps_the_collector_label() -> None:
    """Before the first update a log without `initial` does not know the version: the collector's
    label is not "wrong" and is not erased."""
    log = VersionLog()
    versions = log.of_calls([call("c0", 1.0, 2.0, label="0")])
    assert versions["c0"].dispatch is None and not versions["c0"].mislabelled
    relabelled = relabel_sample(sample(["0"]), versions)
    assert [span.policy_version for span in relabelled.spans] == ["0"]


def test_updates_recorded_out_of_order_are_refused() -> None:
    log = VersionLog(initial="0")
    log.record(update("2", "wait", 20.0, 21.0, 22.0))
    with pytest.raises(ValueError, match="in the order they were made"):
        log.record(update("1", "wait", 10.0, 11.0, 12.0))
    assert log.of_call(call("a", 24.0, 25.0)).dispatch == "2"
    log.record(update("2", "wait", 21.0, 21.0, 22.0))  # the same time again: kept


def test_a_call_ending_before_it_started_is_not_split() -> None:
    """A wall clock stepped back mid-call: the call counts as instantaneous, one version."""
    log = VersionLog(initial="0")
    log.record(update("1", "keep", 10.0, 10.1, 11.0))
    versions = log.of_call(call("a", 12.0, 9.0))
    assert (versions.dispatch, versions.completion, versions.straddles) == ("1", "1", False)


def test_filter_stale_refuses_a_mode_it_does_not_know_and_says_how_to_version() -> None:
    with pytest.raises(ValueError, match=r"\"mask\" or \"drop\""):
        filter_stale([sample(["1"])], 3, 0, mode="Drop")  # type: ignore[arg-type]
    for current in ("v7", "", None):
        with pytest.raises(ValueError, match="integer versions"):
            filter_stale([sample(["1"])], current, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("labels", "oldest"),
    [(["-1", "2"], "-1"), ([" 1", "2"], " 1"), (["²"], "²")],
)
def test_oldest_version_reads_labels_as_filter_stale_does(
    labels: list[str | None], oldest: str
) -> None:
    assert oldest_version(sample(labels)) == oldest


# ---- weight routes ----


class Routes:
    """A server answering each path with a fixed (status, body); "hang" holds until released."""

    def __init__(self, **answers: tuple[Any, bytes]) -> None:
        self.answers: dict[str, tuple[Any, bytes]] = {
            "/weight_info": (200, b'{"weight_version": "0"}'),
            "/pause": (200, b"{}"),
            "/resume": (200, b"{}"),
            "/collective_rpc": (200, b'{"results": [null]}'),
            "/update_weight_version": (200, b"{}"),
            **answers,
        }
        self.requests: list[str] = []
        self.release = threading.Event()
        routes = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                path = self.path.split("?")[0]
                routes.requests.append(path)
                status, body = routes.answers.get(path, (404, b"{}"))
                if status == "hang":
                    routes.release.wait()
                    status = 200
                try:
                    self.send_response(status)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (a timeout)
                    pass

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def routes() -> Iterator[Any]:
    made: list[Routes] = []

    def make(**answers: tuple[Any, bytes]) -> Routes:
        made.append(Routes(**answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize(
    "body", [b"<html>proxy</html>", b"", b"{}", b"[1]", b'{"weight_version": null}']
)
def test_a_weight_info_answer_without_a_version_is_a_sync_error(routes: Any, body: bytes) -> None:
    server = routes(**{"/weight_info": (200, body)})
    with pytest.raises(WeightSyncError, match="vLLM server"):
        VllmWeights(server.url).version()


def test_a_reload_that_is_not_json_or_reaches_no_worker_is_a_sync_error(routes: Any) -> None:
    for body in (b"<html>", b'{"results": []}'):
        server = routes(**{"/collective_rpc": (200, body)})
        with pytest.raises(WeightSyncError):
            VllmWeights(server.url).update(Path("w"), "1")
        assert server.requests[-1] == "/resume"  # the engine is not left paused
        assert "/update_weight_version" not in server.requests


def test_a_pause_that_times_out_still_resumes_the_server(routes: Any) -> None:
    """vLLM keeps pausing after the client gave up: without a resume every rollout would hang."""
    server = routes(**{"/pause": ("hang", b"{}")})
    with pytest.raises(WeightSyncError, match="timed out"):
        VllmWeights(server.url, timeout=0.3).update(Path("w"), "1")
    assert server.requests == ["/weight_info", "/pause", "/resume"]


def test_a_failed_reload_is_reported_even_when_resuming_fails_too(routes: Any) -> None:
    server = routes(**{"/collective_rpc": (500, b"rpc broke"), "/resume": (500, b"resume broke")})
    with pytest.raises(WeightSyncError, match="rpc broke") as caught:
        VllmWeights(server.url).update(Path("w"), "1")
    notes = getattr(caught.value, "__notes__", [])
    assert any("resume broke" in note and "/resume" in note for note in notes)


# ---- TrlRollout ----


def rollout_with(agent: Any, **kwargs: Any) -> TrlRollout:
    collector = tito.Collector(capture_logprobs=True, assembly="merged", policy_version="0")
    transport = mock_transport(FakeVLLM(FakeConfig(responder=responder)))
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=transport),
        )
    )
    return TrlRollout(agent, collector, client, **kwargs)


async def ask(prompt: Any, client: Any) -> None:
    await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": str(prompt)}], max_tokens=4
    )


async def scored(prompt: Any, client: Any) -> float:
    """Reward: the digit in the prompt, so the rows say which prompt they came from."""
    await ask(prompt, client)
    return float(str(prompt)[-1])


def sync_agent(prompt: Any, client: Any) -> float:
    return 1.0


async def text_agent(prompt: Any, client: Any) -> Any:
    await ask(prompt, client)
    return "good"


@pytest.mark.parametrize(
    ("agent", "fix"),
    [(sync_agent, "async def agent"), (text_agent, "reward as a number")],
)
def test_an_agent_of_the_wrong_kind_is_a_type_error_with_the_fix(agent: Any, fix: str) -> None:
    rollout = rollout_with(agent)
    with rollout, pytest.raises(TypeError, match=fix) as caught:
        rollout.run(["p1"], 1)
    assert any("prompt entry 0" in note for note in caught.value.__notes__)
    rollout.collector.close()


def test_staleness_before_the_first_update_takes_any_initial_label() -> None:
    """vLLM's own initial label is "default": nothing is stale before an update, no error."""
    rollout = rollout_with(scored, versions=VersionLog(initial="default"), max_staleness=0)
    with rollout:
        out = rollout.run(["p1"], 1)
    assert out["reward"] == [1.0] and rollout.last_timings.stale_tokens_masked == 0
    rollout.collector.close()


def test_a_log_without_initial_leaves_the_rows_labelled() -> None:
    rollout = rollout_with(scored, versions=VersionLog())
    with rollout:
        rollout.run(["p1"], 1)
    assert rollout.last_timings.policy_versions == ["0"]
    assert rollout.last_timings.mislabelled_calls == 0
    rollout.collector.close()


def test_lag_one_runs_a_batch_of_another_shape_now_and_keeps_the_pending_one() -> None:
    """TRL's evaluation hands in other prompts and `num_generations_eval`: its rows must line up
    with them; the training batch in flight comes back on the next training call."""
    rollout = rollout_with(scored, lag=1)
    with rollout:
        assert rollout.run(["p1", "p1"], 2)["reward"] == [1.0, 1.0]  # fills the pipeline
        evaluation = rollout.run(["e2", "e3", "e4"], 1)
        assert evaluation["reward"] == [2.0, 3.0, 4.0]
        assert rollout.run(["p5", "p5"], 2)["reward"] == [1.0, 1.0]  # p1, from the background
        assert rollout.run(["p6", "p6"], 2)["reward"] == [5.0, 5.0]
    rollout.collector.close()


def test_lag_one_timeout_cancels_the_batch_it_waited_for() -> None:
    cancelled = threading.Event()

    async def stuck(prompt: Any, client: Any) -> float:
        await ask(prompt, client)
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0.0

    rollout = rollout_with(stuck, lag=1, timeout=0.3)
    with pytest.raises(TimeoutError):
        rollout.run(["p1"], 1)
    assert cancelled.wait(10)  # cancelled now, not only when the rollout closes
    rollout.close()
    rollout.collector.close()
