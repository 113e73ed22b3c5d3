"""The capture core shared by the sync and async transports: decide, snapshot, parse, record.

Transports do only I/O; everything else happens here once: whether a request is captured, the
request rewrite, the attribution snapshot taken at request time, response parsing (JSON body or a
teed SSE stream) and turning parsed choices into `Call` records handed to the episode.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tito_agents import episodes
from tito_agents._capture.episode import CapturedEpisode
from tito_agents._capture.messages.relay import messages_outputs
from tito_agents._capture.pending import PendingCall, note_routing
from tito_agents._capture.responses.chat_view import chat_view
from tito_agents._capture.session_store import SESSIONS, SessionStore
from tito_agents._capture.sessions import FallbackReason, Plan, Session, SessionDecision, Turn, plan
from tito_agents._capture.sessions import tools_key as session_tools_key
from tito_agents._capture.tee import Decompressor, StreamTee, failed_choice, undecodable
from tito_agents._capture.wire import (
    ParsedChoice,
    ResponseParser,
    endpoint_for_path,
    prepare_request,
)
from tito_agents._capture.wire.request import UnreadableRequest
from tito_agents._capture.wire.splice import with_token_prompt
from tito_agents.calls import EMPTY_IDS, Call, CallStatus, Endpoint, SessionNote
from tito_agents.config import CollectorSettings, CollectorStats, ErrorMode, OutsideEpisodeMode
from tito_agents.errors import CaptureError, MalformedResponseError, OutsideEpisodeError

logger = logging.getLogger("tito_agents")

if TYPE_CHECKING:
    from tito_agents.episodes import Episode

_SESSION_ENDPOINTS = frozenset({Endpoint.CHAT, Endpoint.RESPONSES})
_WIDE_INT = re.compile(rb"\d{19}")
"""A digit run an integer beyond 64 bits needs (the JSON parser reads those as floats)."""


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


def token_in_blocker(payload: dict[str, Any], body: bytes) -> FallbackReason | None:
    """Why a request's prompt cannot be sent as tokens: its `kv_transfer_params` is not an
    object (the server refuses it: it must stay refused) or carries the caller's own token
    prompt; or it holds integers beyond 64 bits, which the `/tokenize` renders would not carry
    exactly. None when it can."""
    kv = payload.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        return FallbackReason.KV_TRANSFER_NOT_AN_OBJECT
    if isinstance(kv, dict) and "prompt_token_ids" in kv:
        return FallbackReason.OWN_TOKEN_PROMPT
    if _WIDE_INT.search(body) and _has_wide_number(payload):
        return FallbackReason.WIDE_INTEGERS
    return None


def _has_wide_number(value: Any) -> bool:
    if type(value) is float:
        return abs(value) >= 2.0**63
    if isinstance(value, dict):
        return any(_has_wide_number(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_wide_number(v) for v in value)
    return False


class CaptureCore:
    """Request/response logic of the transports for a set of vLLM hosts: reads `settings`, counts
    in `stats`, records calls on their episode (which reports them to the next stage).
    Calls outside any episode go to `default_episode`. An episode is used only through
    `CapturedEpisode`; token-in sessions are kept in `session_store` (one per process unless
    given), never on the episode."""

    def __init__(
        self,
        settings: CollectorSettings,
        default_episode: Episode,
        stats: CollectorStats,
        vllm_hosts: frozenset[str],
        *,
        sessions: bool = False,
        session_store: SessionStore | None = None,
    ) -> None:
        self.settings = settings
        self.default_episode = default_episode
        self.stats = stats
        self.vllm_hosts = vllm_hosts
        self.sessions = sessions
        self.session_store = session_store if session_store is not None else SESSIONS
        self._logged: set[str] = set()
        """Causes of uncaptured requests already logged."""
        self.messages_options: dict[tuple[str, str], dict[str, Any]] = {}
        """The probed Messages conversion choices per (server, model); a failed probe is kept
        as None (requests that need it go uncaptured)."""

    def is_vllm_host(self, host: str, port: int | None) -> bool:
        """Hosts are matched as "host:port" first, then as bare "host"."""
        if port is not None and f"{host}:{port}" in self.vllm_hosts:
            return True
        return host in self.vllm_hosts

    def begin(
        self,
        method: str,
        host: str,
        port: int | None,
        path: str,
        body: bytes | None,
        *,
        messages_options: dict[str, Any] | None = None,
    ) -> tuple[bytes | None, PendingCall] | None:
        """Decide whether to capture a request. Returns `(new_body_or_None, pending)` or None.
        `messages_options`: the server's probed Messages conversion choices (`flow`)."""
        if method != "POST" or body is None or not self.is_vllm_host(host, port):
            return None
        endpoint = endpoint_for_path(path)
        if endpoint is None:
            return None
        settings = self.settings
        resolved, agent, labels = episodes.resolve_attribution()
        episode: CapturedEpisode
        if resolved is None:
            policy = settings.outside_episode
            if policy is OutsideEpisodeMode.IGNORE:
                return None
            if policy is OutsideEpisodeMode.ERROR:
                raise OutsideEpisodeError(
                    "a call to a vLLM host was made outside any episode; wrap the rollout in "
                    "`with collector.episode(...)` or set outside_episode='default'"
                )
            episode = self.default_episode
        else:
            episode = resolved
        agent = agent or episode.agent
        try:
            policy_name = settings.policy_for(agent, labels)
            prepared = prepare_request(
                endpoint,
                body,
                capture_logprobs=settings.capture_logprobs,
                messages_options=messages_options,
                model=policy_name,
            )
        except Exception as exc:  # never break the agent's call: send it as it was written
            self.uncaptured(exc)
            return None
        if prepared is None:
            self.stats.skipped_requests += 1
            return None
        new_body, info = prepared
        if not settings.keep_messages:
            info.messages = None
            info.tools = None
        note_routing(self._logged, agent, info.routed_from, policy_name)
        pending = PendingCall(
            info=info,
            episode=episode,
            agent=agent,
            labels=labels,
            seq=0,
            policy_version=settings.version_for(policy_name),
            started_at=time.time(),
            policy=policy_name,
        )
        wants_session = episode.sessions if episode.sessions is not None else self.sessions
        if (
            wants_session
            and info.endpoint in _SESSION_ENDPOINTS
            and episode is not self.default_episode
            and info.payload is not None
        ):
            try:
                self._plan_session(pending, body, f"{host}:{port}")
            except Exception as exc:  # planning that cannot read the request falls back
                pending.session = pending.plan = None
                info.want_message = False
                cause = FallbackReason.UNPLANNABLE_REQUEST
                pending.session_fallback = cause.explain(f" ({_cause(exc)})")
        # counted in flight last: nothing above leaves a call counted that is never sent
        pending.seq = episode.call_started()
        self.stats.requests += 1
        return new_body, pending

    def _plan_session(self, pending: PendingCall, body: bytes, server: str) -> None:
        """Set up the token-in session plan of a request (or note why it falls back)."""
        info = pending.info
        assert info.payload is not None
        blocker = token_in_blocker(info.payload, body)
        # a Responses request is planned as the chat conversation the server renders it as
        chat = info.payload if info.endpoint is Endpoint.CHAT else chat_view(info.payload)
        if blocker is not None:
            pending.session_fallback = blocker.explain()
            return
        if isinstance(chat, str):
            pending.session_fallback = FallbackReason.NOT_A_CHAT_CONVERSATION.explain(f": {chat}")
            return
        info.want_message = True
        pending.session_payload = chat
        session = self.session_store.session_for(pending.episode, pending.agent)
        pending.session = session
        pending.plan = self._session_plan(session, chat, server)

    def uncaptured(self, exc: BaseException) -> None:
        """Count a request sent as the caller wrote it because capture could not read it (or
        failed preparing it); logged once per cause."""
        self.stats.uncaptured_requests += 1
        cause = exc.field if isinstance(exc, UnreadableRequest) else type(exc).__name__
        if cause in self._logged:
            return
        self._logged.add(cause)
        if isinstance(exc, UnreadableRequest):
            logger.warning(
                "a request to a vLLM host was sent uncaptured, as written: %s (the server "
                "answers it as without capture; logged once per field)",
                exc,
            )
        else:
            logger.warning(
                "capture failed preparing a request; it was sent uncaptured (logged once per "
                "cause)",
                exc_info=exc,
            )

    def abandon(self, pending: PendingCall, exc: BaseException) -> None:
        """A captured request whose preparation failed after `begin`: it is sent as the caller
        wrote it instead, and is no longer in flight."""
        if pending.finished:
            return
        pending.finished = True
        pending.episode.call_ended()
        self.stats.requests -= 1
        self.uncaptured(exc)

    def _session_plan(self, session: Session, payload: dict[str, Any], server: str) -> Plan:
        """`sessions.plan`, with what each (server, model, template)'s template ends a turn with
        shared between sessions: derived by the first session that appends, then known to all."""
        key = (server, str(payload.get("model")), str(payload.get("chat_template")))
        known = self.settings.learned_end_of_turn.get(key)
        if known is not None and not session.end_of_turn_checked:
            session.known_end_of_turn(known)
        decision = yield from plan(session, payload, server, self.settings.session_history)
        derived = session.end_of_turn()
        if known is None and derived is not None:
            self.settings.learned_end_of_turn.setdefault(key, derived)
        return decision

    def apply_decision(
        self, pending: PendingCall, decision: SessionDecision | None, body: bytes | None
    ) -> bytes | None:
        """The body to send after a session plan ran (None: keep `body`)."""
        if decision is None:
            decision = SessionDecision.falls_back(FallbackReason.PLANNING_FAILED)
        pending.decision = decision
        if decision.prompt_ids is None or pending.info.payload is None or body is None:
            return body
        try:
            return with_token_prompt(body, pending.info.payload, decision.prompt_ids)
        except Exception as exc:  # never break the agent's call: the server renders it
            cause = FallbackReason.TOKEN_PROMPT_NOT_ADDED
            pending.decision = SessionDecision.falls_back(cause, f" ({_cause(exc)})")
            return body

    def discard(self, pending: PendingCall, status: int | None) -> None:
        """A failed attempt (non-2xx or transport error): not a call. The SDK may retry it."""
        if pending.finished:
            return
        pending.finished = True
        pending.episode.call_ended()
        self.stats.failed_attempts += 1

    def finish_body(self, pending: PendingCall, status: int, body: bytes) -> bytes | None:
        """Record the calls of a complete non-streaming response. Returns the body to hand to the
        caller instead (without the fields capture added), or None to pass `body` on."""
        parser = self._record_body(pending, status, body)
        try:
            return parser.caller_body()
        except Exception:  # never break the agent's call: hand the body on as it came
            logger.warning("could not rebuild the response body; passing it on", exc_info=True)
            return None

    def finish_body_parsed(
        self, pending: PendingCall, status: int, body: bytes
    ) -> Mapping[str, Any] | None:
        """`finish_body` for a Messages call answered by the chat endpoint: the parsed body (its
        ids may be placeholders), converted without a second parse; None when unparsable."""
        return self._record_body(pending, status, body).payload

    def _record_body(self, pending: PendingCall, status: int, body: bytes) -> ResponseParser:
        parser = ResponseParser(pending.info)
        try:
            choices = parser.parse_body(body)
        except CaptureError as exc:
            choices = [failed_choice(exc)]
        except Exception as exc:  # a parser bug: the call is unusable, the caller's answer kept
            logger.warning("could not parse a captured response", exc_info=True)
            choices = [failed_choice(MalformedResponseError(f"unreadable response ({exc!r})"))]
        self.record(pending, parser, choices, status, stream=False)
        return parser

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
        request) and report them to the next stage; raises only under `ErrorMode.RAISE`."""
        if pending.finished:
            return
        pending.finished = True
        episode = pending.episode
        episode.call_ended()
        ended = time.time()
        response_id = parser.response_id or f"tito-{uuid.uuid4().hex}"
        info = pending.info
        calls: list[Call] = []
        first_error: CaptureError | None = None
        for choice in choices:
            if info.translated_from is not None:  # its tool_use and thinking blocks
                messages_outputs(choice)
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
                    server_sampling=self.settings.server_sampling,
                    routed_experts=choice.routed_experts,
                    error=error,
                    episode_id=episode.episode_id,
                    agent=pending.agent,
                    labels=dict(pending.labels),
                    seq=pending.seq,
                    policy_version=pending.policy_version,
                    policy=pending.policy,
                    messages=info.messages,
                    tools=info.tools,
                    constrained=info.constrained,
                    tool_calls=choice.tool_calls,
                    reasoning=choice.reasoning,
                    translated_from=info.translated_from,
                    scoring=pending.scoring,
                )
            )
        if pending.session is not None:
            try:
                self._update_session(pending, calls, choices)
            except Exception as exc:  # the calls are kept; the session just lacks this turn
                logger.warning("could not add a turn to its token-in session", exc_info=True)
                reason = FallbackReason.TURN_NOT_RECORDED.explain(f" ({_cause(exc)})")
                for call in calls:
                    call.session, call.session_reason = SessionNote.FALLBACK, reason
        elif pending.session_fallback is not None:
            for call in calls:
                call.session, call.session_reason = SessionNote.FALLBACK, pending.session_fallback
        episode.add_calls(calls)  # the episode reports them to the next stage
        raise_now = self.settings.errors is ErrorMode.RAISE and incomplete is None
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
                call.session_reason = FallbackReason.TOKEN_PROMPT_IGNORED.explain()
                session.server_ignores_token_in = True
            session.add_turn(
                Turn(
                    messages=list(messages or []),
                    tools_key=session_tools_key(payload),
                    prompt_ids=call.prompt_ids,
                    sampled_ids=call.sampled_ids,
                    finish_reason=call.finish_reason,
                    assistant=choice.message,
                    stop_reason=call.stop_reason,
                )
            )
