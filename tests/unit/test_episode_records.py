"""An episode and its processor exchange values: the episode hands over frozen records
(`RecordedCalls`, `EndedEpisode`) and keeps the `ExportResult` it gets back; the processor never
holds the live episode."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.call_factory import make_call
from tito_agents.config import CollectorSettings
from tito_agents.episodes import Episode
from tito_agents.errors import EpisodeCaptureError
from tito_agents.export import EndedEpisode, ExportResult, RecordedCalls
from tito_agents.samples import Sample


class RecordingProcessor:
    """Keeps what an episode hands it and answers with `result`."""

    def __init__(self, result: ExportResult | None = None) -> None:
        self.recorded: list[RecordedCalls] = []
        self.ended: list[EndedEpisode] = []
        self.result = result or ExportResult()

    def on_calls(self, recorded: RecordedCalls) -> None:
        self.recorded.append(recorded)

    def on_end(self, episode: EndedEpisode) -> ExportResult:
        self.ended.append(episode)
        return self.result

    async def aon_end(self, episode: EndedEpisode) -> ExportResult:
        return self.on_end(episode)


def test_the_processor_gets_a_frozen_record_that_later_changes_do_not_reach() -> None:
    processor = RecordingProcessor()
    episode = Episode(processor, CollectorSettings(), "e1", task_id="t", metadata={"k": 1})
    call = make_call("r1/0", [1, 2], [3])
    with episode:
        episode.set_reward(1.0)
        assert episode.add_calls([call]) == 1
    (ended,) = processor.ended
    assert ended.calls == (call,) and ended.episode_id == "e1" and not ended.failed
    assert ended.context.episode_reward == 1.0 and ended.context.task_id == "t"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ended.calls = ()  # type: ignore[misc]
    episode.metadata["k"] = 2  # the record took a copy
    assert ended.context.metadata == {"k": 1}
    assert episode.add_calls([make_call("r2/0", [1], [2])]) == 0  # a late call
    assert ended.calls == (call,) and processor.recorded[-1].late


def test_the_episode_keeps_the_result_and_raises_its_error_after_keeping_it() -> None:
    sample = Sample.__new__(Sample)
    error = EpisodeCaptureError("e1", [])
    processor = RecordingProcessor(
        ExportResult(samples=(sample,), tokens=7, trained_tokens=3, error=error)
    )
    episode = Episode(processor, CollectorSettings(), "e1")
    with pytest.raises(EpisodeCaptureError) as raised:
        episode.end()
    assert raised.value is error
    assert episode.samples == [sample]
    assert (episode.report.samples, episode.report.tokens, episode.report.trained_tokens) == (
        1,
        7,
        3,
    )


def test_recorded_calls_say_what_was_new_and_outside_calls_carry_their_context() -> None:
    processor = RecordingProcessor()
    episode = Episode(processor, CollectorSettings(), "e1")
    call = make_call("r1/0", [1], [2])
    episode.add_calls([call])
    episode.add_calls([call])  # a re-delivered response
    assert [(r.added, r.late, r.outside) for r in processor.recorded] == [
        (1, False, None),
        (0, False, None),
    ]
    outside_processor = RecordingProcessor()
    outside = Episode(outside_processor, CollectorSettings(), "default", outside=True)
    outside.add_calls([call])
    (recorded,) = outside_processor.recorded
    assert recorded.added == 1 and recorded.outside is not None
    assert recorded.outside.episode_id == "default" and outside.calls == []
