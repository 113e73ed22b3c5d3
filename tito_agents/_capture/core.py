"""The capture core shared by the sync and async transports: decide, snapshot, parse, record.

Transports do only I/O; everything else happens here once: whether a request is captured, the
request rewrite, the attribution snapshot taken at request time, response parsing (JSON body or a
teed SSE stream) and turning parsed choices into `Call` records handed to the episode.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from tito_agents import episodes, sessions
from tito_agents._capture.pending import PendingCall
from tito_agents._capture.tee import Decompressor, StreamTee, failed_choice, undecodable
from tito_agents._wire import (
    ParsedChoice,
    ResponseParser,
    endpoint_for_path,
    prepare_request,
)
from tito_agents._wire.responses_chat import chat_view
from tito_agents.calls import EMPTY_IDS, Call, CallStatus, Endpoint, SessionNote
from tito_agents.config import CaptureSettings, CaptureStats, ErrorPolicy, OutsideEpisode
from tito_agents.errors import (
    CaptureError,
    OutsideEpisodeError,
)
from tito_agents.sessions import SessionDecision, Turn

logger = logging.getLogger("tito_agents")

if TYPE_CHECKING:
    from tito_agents.episodes import Episode, EpisodeProcessor

_SESSION_ENDPOINTS = frozenset({Endpoint.CHAT, Endpoint.RESPONSES})


class CaptureCore:
    """Request/response logic of the transports for a set of vLLM hosts: reads `settings`, counts
    in `stats`, records calls on their episode and reports them to `processor` (the next stage).
    Calls outside any episode go to `default_episode`."""

    def __init__(
        self,
        settings: CaptureSettings,
        processor: EpisodeProcessor,
        default_episode: Episode,
        stats: CaptureStats,
        vllm_hosts: frozenset[str],
        *,
        sessions: bool = False,
    ) -> None:
        self.settings = settings
        self.processor = processor
        self.default_episode = default_episode
        self.stats = stats
        self.vllm_hosts = vllm_hosts
        self.sessions = sessions

    def is_vllm_host(self, host: str, port: int | None) -> bool:
        """Hosts are matched as "host:port" first, then as bare "host"."""
        if port is not None and f"{host}:{port}" in self.vllm_hosts:
            return True
        return host in self.vllm_hosts

    def begin(
        self, method: str, host: str, port: int | None, path: str, body: bytes | None
    ) -> tuple[bytes | None, PendingCall] | None:
        """Decide whether to capture a request. Returns `(new_body_or_None, pending)` or None."""
        if method != "POST" or body is None or not self.is_vllm_host(host, port):
            return None
        endpoint = endpoint_for_path(path)
        if endpoint is None:
            return None
        settings = self.settings
        episode, agent, labels = episodes.resolve_attribution()
        if episode is None:
            policy = settings.outside_episode
            if policy is OutsideEpisode.IGNORE:
                return None
            if policy is OutsideEpisode.ERROR:
                raise OutsideEpisodeError(
                    "a call to a vLLM host was made outside any episode; wrap the rollout in "
                    "`with collector.episode(...)` or set outside_episode='default'"
                )
            episode = self.default_episode
        prepared = prepare_request(endpoint, body, capture_logprobs=settings.capture_logprobs)
        if prepared is None:
            self.stats.skipped_requests += 1
            return None
        new_body, info = prepared
        if not settings.keep_messages:
            info.messages = None
            info.tools = None
        pending = PendingCall(
            info=info,
            episode=episode,
            agent=agent or episode.agent,
            labels=labels,
            seq=episode._next_seq(),
            policy_version=settings.policy_version,
            started_at=time.time(),
        )
        wants_session = episode.sessions if episode.sessions is not None else self.sessions
        if (
            wants_session
            and info.endpoint in _SESSION_ENDPOINTS
            and episode is not self.default_episode
            and info.payload is not None
        ):
            # a Responses request is planned as the chat conversation the server renders it as
            chat = info.payload if info.endpoint is Endpoint.CHAT else chat_view(info.payload)
            if isinstance(chat, str):
                pending.session_fallback = chat
            else:
                info.want_message = True
                pending.session_payload = chat
                session = pending.session = episode._session_for(pending.agent)
                pending.plan = self._session_plan(session, chat, f"{host}:{port}")
        self.stats.requests += 1
        return new_body, pending

    def _session_plan(
        self, session: sessions.Session, payload: dict[str, Any], server: str
    ) -> sessions.Plan:
        """`sessions.plan`, with what each (server, model, template)'s template ends a turn with
        shared between sessions: derived by the first session that appends, then known to all."""
        key = (server, str(payload.get("model")), str(payload.get("chat_template")))
        known = self.settings.learned_end_of_turn.get(key)
        if known is not None and not session.end_of_turn_checked:
            session.known_end_of_turn(known)
        decision = yield from sessions.plan(session, payload, server, self.settings.session_history)
        derived = session.end_of_turn()
        if known is None and derived is not None:
            self.settings.learned_end_of_turn.setdefault(key, derived)
        return decision

    def apply_decision(
        self, pending: PendingCall, decision: SessionDecision | None, body: bytes | None
    ) -> bytes | None:
        """The body to send after a session plan ran (None: keep `body`)."""
        if decision is None:
            decision = SessionDecision(None, SessionNote.FALLBACK, "session planning failed")
        pending.decision = decision
        if decision.prompt_ids is None or pending.info.payload is None:
            return body
        return sessions.with_token_prompt(pending.info.payload, decision.prompt_ids)

    def discard(self, pending: PendingCall, status: int | None) -> None:
        """A failed attempt (non-2xx or transport error): not a call. The SDK may retry it."""
        if pending.finished:
            return
        pending.finished = True
        pending.episode._call_ended()
        self.stats.failed_attempts += 1

    def finish_body(self, pending: PendingCall, status: int, body: bytes) -> bytes | None:
        """Record the calls of a complete non-streaming response. Returns the body to hand to the
        caller instead (without the fields capture added), or None to pass `body` on."""
        parser = ResponseParser(pending.info)
        try:
            choices = parser.parse_body(body)
        except CaptureError as exc:
            choices = [failed_choice(exc)]
        self.record(pending, parser, choices, status, stream=False)
        try:
            return parser.caller_body()
        except Exception:  # never break the agent's call: hand the body on as it came
            logger.warning("could not rebuild the response body; passing it on", exc_info=True)
            return None

    def open_stream(
        self,
        pending: PendingCall,
        status: int,
        *,
        decompressor: Decompressor | None = None,
        unreadable: str | None = None,
    ) -> StreamTee:
        """A tee for an SSE response: fed with each raw byte chunk as it passes to the caller.

        A server (or proxy) may compress the stream although capture asked for `identity`: the
        tee then reads it through `decompressor` (the caller's client decodes its own copy), or,
        when the encoding `unreadable` names cannot be decoded, records the call unusable with
        that reason, through the error policy."""
        refused = None if unreadable is None else undecodable(unreadable)
        return StreamTee(self, pending, status, decompressor, refused)

    def refuse_body(self, pending: PendingCall, status: int, unreadable: str) -> None:
        """A non-streaming body in an encoding capture cannot decode: recorded unusable with that
        reason (the caller gets the response as it came)."""
        parser = ResponseParser(pending.info)
        failed = [failed_choice(undecodable(unreadable))]
        self.record(pending, parser, failed, status, stream=False)

    def record(
        self,
        pending: PendingCall,
        parser: ResponseParser,
        choices: list[ParsedChoice],
        status: int,
        *,
        stream: bool,
        incomplete: CaptureError | None = None,
    ) -> None:
        """Turn a response's parsed choices into `Call` records on the episode (once per
        request) and report them to the next stage; raises only under `ErrorPolicy.RAISE`."""
        if pending.finished:
            return
        pending.finished = True
        episode = pending.episode
        episode._call_ended()
        ended = time.time()
        response_id = parser.response_id or f"tito-{uuid.uuid4().hex}"
        info = pending.info
        calls: list[Call] = []
        first_error: CaptureError | None = None
        for choice in choices:
            error = incomplete or choice.error
            if incomplete is not None:
                call_status = CallStatus.INCOMPLETE
            elif choice.error is not None:
                call_status = CallStatus.UNUSABLE
            else:
                call_status = CallStatus.COMPLETE
            call_id = f"{response_id}/{choice.index}"
            if error is not None:
                error.call_id = call_id
                first_error = first_error or error
            sampled = choice.sampled_ids
            calls.append(
                Call(
                    call_id=call_id,
                    request_id=response_id,
                    endpoint=info.endpoint,
                    choice_index=choice.index,
                    status=call_status,
                    prompt_ids=choice.prompt_ids if choice.prompt_ids is not None else EMPTY_IDS,
                    sampled_ids=sampled if sampled is not None else EMPTY_IDS,
                    logprobs=choice.logprobs,
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                    model=parser.model,
                    http_status=status,
                    stream=stream,
                    started_at=pending.started_at,
                    ended_at=ended,
                    sampling=info.sampling,
                    routed_experts=choice.routed_experts,
                    error=error,
                    episode_id=episode.episode_id,
                    agent=pending.agent,
                    labels=dict(pending.labels),
                    seq=pending.seq,
                    policy_version=pending.policy_version,
                    messages=info.messages,
                    tools=info.tools,
                    constrained=info.constrained,
                    tool_calls=choice.tool_calls,
                    reasoning=choice.reasoning,
                    scoring=pending.scoring,
                )
            )
        if pending.session is not None:
            self._update_session(pending, calls, choices)
        elif pending.session_fallback is not None:
            for call in calls:
                call.session, call.session_reason = SessionNote.FALLBACK, pending.session_fallback
        added = episode._add_calls(calls)
        self.processor.on_calls(episode, calls, added)
        raise_now = self.settings.error_policy is ErrorPolicy.RAISE and incomplete is None
        if first_error is not None and raise_now:
            raise first_error

    def _update_session(
        self, pending: PendingCall, calls: list[Call], choices: list[ParsedChoice]
    ) -> None:
        """Note how each call's prompt was made; complete calls become turns of the session."""
        session = pending.session
        decision = pending.decision or SessionDecision(None, SessionNote.FIRST)
        payload = pending.session_payload or {}
        messages = payload.get("messages") if isinstance(payload.get("messages"), list) else []
        assert session is not None
        for call, choice in zip(calls, choices, strict=True):
            call.session, call.session_reason = decision.note, decision.reason
            call.session_ms = pending.session_ms
            if call.status is not CallStatus.COMPLETE:
                continue
            sent = decision.prompt_ids
            if sent is not None and not np.array_equal(sent, call.prompt_ids):
                call.session = SessionNote.FALLBACK
                call.session_reason = (
                    "the server ignored the token prompt in kv_transfer_params "
                    "(needs vLLM >= 0.27); it rendered the messages instead"
                )
                session.server_ignores_token_in = True
            session.add_turn(
                Turn(
                    messages=list(messages or []),
                    tools_key=sessions.tools_key(payload),
                    prompt_ids=call.prompt_ids,
                    sampled_ids=call.sampled_ids,
                    finish_reason=call.finish_reason,
                    assistant=choice.message,
                    stop_reason=call.stop_reason,
                )
            )
