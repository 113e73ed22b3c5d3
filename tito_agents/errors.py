"""The error tree of tito-agents: every error the library raises derives from `TitoError`.

Configuration errors raise early, when the user sets things up. Capture problems never break the
agent's own LLM call unless the user chose `ErrorMode.RAISE`: they are recorded on the call and
surface as typed errors when the episode ends (or are only counted, in the lenient policy). Sink
errors say whether a retry can help.
"""

from __future__ import annotations


class TitoError(Exception):
    """Base class of every error raised by tito-agents."""


class ConfigurationError(TitoError):
    """The library was set up in a way that cannot work; raised before any call is made."""


class CaptureError(TitoError):
    """A response from a vLLM-marked host cannot yield exact token ids.

    `fix` says what the user can change; `call_id` names the call when one is known.
    """

    def __init__(self, message: str, *, fix: str = "", call_id: str | None = None) -> None:
        self.reason = message
        self.fix = fix
        self.call_id = call_id
        text = message if not fix else f"{message} Fix: {fix}"
        super().__init__(text)


class MissingTokenIdsError(CaptureError):
    """The response carries no `prompt_token_ids` / `token_ids` although they were requested."""


class TokenCountMismatchError(CaptureError):
    """Ids, logprobs and usage disagree in length (e.g. streamed ids vs `usage.completion_tokens`)."""


class MalformedResponseError(CaptureError):
    """The body is not valid JSON or SSE, or token ids are not non-negative integers."""


class IncompleteCallError(CaptureError):
    """The stream was abandoned, cancelled or cut before it finished."""


class EpisodeCaptureError(TitoError):
    """Raised when an episode ends and some of its calls could not be captured exactly.

    Samples of the good calls were written before this is raised; `errors` lists each problem.
    """

    def __init__(self, episode_id: str, errors: list[CaptureError]) -> None:
        self.episode_id = episode_id
        self.errors = errors
        first = errors[0] if errors else None
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"episode {episode_id!r}: {first}{more}")


class OutsideEpisodeError(TitoError):
    """A captured call was made outside any episode while the policy forbids that."""


class SinkError(TitoError):
    """A sink could not store samples. `retryable` says whether trying again may succeed."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


class SampleFormatError(TitoError):
    """A samples file holds something that is not a valid sample (not a torn last line)."""


class TruncatedSamplesError(SampleFormatError):
    """A samples file or folder ends in something unfinished (a torn last line, an Arrow stream
    without its end marker, only parts still being written), refused because the reader was asked
    to be strict (`read_samples(..., strict=True)`) or because nothing finished is there to read."""


class EpisodeStateError(TitoError, RuntimeError):
    """An `Episode` entered while entered, entered or ended after its end, or rewarded after it:
    one rollout ends once (a second end would write its samples twice; a late reward reaches none)."""


class EpisodeNotEndedError(TitoError, RuntimeError):
    """An episode's samples were asked for before it ended (they are assembled at its end), or
    after an end whose assembly failed (the exit raised that failure)."""
