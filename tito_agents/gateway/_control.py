"""The control API: opening and closing episodes, rewards, agent names and labels, reports.

Everything here sits under `/control/` and needs the control token (`Authorization: Bearer
<token>`), which only the rollout driver holds. The agent is given an episode's base URL
(`/episodes/{id}/v1`), which forwards model calls and nothing else: agent code can neither close
its episode nor set its own reward. The token is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tito_agents._values import as_text, json_bytes
from tito_agents.config import parse_policy_versions
from tito_agents.gateway._forward import api_error
from tito_agents.gateway._registry import Registry, RegistryError, call_summaries

Handler = Callable[[Request], Awaitable[Response]]

OPEN_FIELDS = ("episode_id", "task_id", "group_id", "agent", "labels", "metadata", "sessions")
MAX_DEPTH = 64
"""How deep labels and metadata may nest. They are written inside every sample (as JSON, whose
writer stops at 254 levels) and in reports: deeper ones made the sink refuse the episode's
samples and every report of it fail, so they are refused where they come in."""


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(
        json_bytes(payload),
        status_code=status,
        media_type="application/json",
    )


def control_error(status: int, message: str) -> Response:
    return api_error(status, message)


class ControlAPI:
    """The `/control/...` routes of one gateway."""

    def __init__(self, registry: Registry, token: str) -> None:
        if not token:
            raise ValueError("the control API needs a token")
        self.registry = registry
        self._token = token.encode()

    def routes(self) -> list[Route]:
        guard = self._guarded
        return [
            # one Route per path, so a 405 names every method the path takes in its `Allow`
            _route(
                "/control/episodes", POST=guard(self.open_episode), GET=guard(self.list_episodes)
            ),
            _route(
                "/control/episodes/{episode_id}", GET=guard(self.report), PATCH=guard(self.update)
            ),
            Route("/control/episodes/{episode_id}/calls", guard(self.calls), methods=["GET"]),
            Route("/control/episodes/{episode_id}/reward", guard(self.reward), methods=["POST"]),
            Route("/control/episodes/{episode_id}/close", guard(self.close), methods=["POST"]),
            Route("/control/policy-version", guard(self.policy_version), methods=["PUT"]),
            Route("/control/policies", guard(self.policies), methods=["GET", "PUT"]),
            Route("/control/stats", guard(self.stats), methods=["GET"]),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            given = request.headers.get("authorization", "")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self._token
            ):
                return control_error(401, "the control API needs the gateway's control token")
            try:
                return await handler(request)
            except RegistryError as exc:
                return control_error(exc.status, str(exc))
            except _BadInput as exc:
                return control_error(400, str(exc))

        return guarded

    # ---- handlers ----

    async def open_episode(self, request: Request) -> Response:
        body = await _json_object(request, OPEN_FIELDS)
        held = self.registry.open_episode(
            _text(body, "episode_id"),
            task_id=_text(body, "task_id"),
            group_id=_text(body, "group_id"),
            agent=_text(body, "agent"),
            labels=_opt_dict(body, "labels"),
            metadata=_opt_dict(body, "metadata"),
            sessions=_opt_bool(body, "sessions"),
        )
        episode_id = held.episode.episode_id
        answer: dict[str, Any] = {
            "episode_id": episode_id,
            "base_url": f"/episodes/{episode_id}/v1",
        }
        policies = self.registry.collector.settings.policies
        if isinstance(policies, dict) and policies:  # one base URL per routed agent
            answer["agents"] = {
                agent: {
                    "base_url": f"/episodes/{episode_id}/agents/{quote(agent, safe='')}/v1",
                    "policy": policy,
                }
                for agent, policy in policies.items()
            }
        return json_response(answer, 201)

    async def list_episodes(self, request: Request) -> Response:
        registry = self.registry
        return json_response(
            {
                "open": [
                    {
                        "episode_id": i,
                        "calls": len(h.episode.calls),
                        "in_flight": h.episode.inflight,
                    }
                    for i, h in registry.open.items()
                ],
                "lost": list(registry.lost),
            }
        )

    async def report(self, request: Request) -> Response:
        return json_response(self.registry.report(request.path_params["episode_id"]))

    async def update(self, request: Request) -> Response:
        """Agent name, labels (merged) and metadata (merged) of an open episode; they apply to
        the calls forwarded from now on (labels, agent) and to its samples (metadata)."""
        held = self.registry.get_open(request.path_params["episode_id"])
        body = await _json_object(request, ("agent", "labels", "metadata"))
        agent = _text(body, "agent")  # all checked before anything changes: a 400 changes nothing
        labels, metadata = _opt_dict(body, "labels"), _opt_dict(body, "metadata")
        if "agent" in body:
            held.episode.agent = agent
        held.labels.update(labels or {})
        held.episode.metadata.update(metadata or {})
        return json_response(self.registry.report(held.episode.episode_id))

    async def calls(self, request: Request) -> Response:
        held = self.registry.get_open(request.path_params["episode_id"])
        return json_response({"calls": call_summaries(held)})

    async def reward(self, request: Request) -> Response:
        """`{"reward": x}` sets the episode's reward; with `"call": id` (a call id, or a response
        id for all of its choices) it sets that call's reward."""
        held = self.registry.get_open(request.path_params["episode_id"])
        body = await _json_object(request, ("reward", "call"), required="reward")
        reward = _reward(body)
        call = _opt_str(body, "call")
        if call is None:
            held.episode.set_reward(reward)
        else:
            try:
                held.episode.set_call_reward(call, reward)
            except KeyError:
                raise RegistryError(404, f"no captured call {call!r} in this episode") from None
        return json_response(
            {"episode_id": held.episode.episode_id, "call": call, "reward": reward}
        )

    async def close(self, request: Request) -> Response:
        body = await _json_object(request, ("reward", "failed"))
        report = await self.registry.close_episode(
            request.path_params["episode_id"],
            reward=_reward(body) if body.get("reward") is not None else None,
            failed=bool(_opt_bool(body, "failed")),
        )
        return json_response(report)

    async def policy_version(self, request: Request) -> Response:
        """The weights' label from now on: of every call, or, with `policy`, of that policy's
        calls (`CollectorSettings.policy_versions`)."""
        body = await _json_object(request, ("policy_version", "policy"), required="policy_version")
        settings = self.registry.collector.settings
        version = _text(body, "policy_version")
        policy = _opt_str(body, "policy")
        if policy is None:
            settings.policy_version = version
            return json_response({"policy_version": settings.policy_version})
        settings.policy_versions = {**settings.policy_versions, policy: version}
        return json_response({"policy": policy, "policy_version": version})

    async def policies(self, request: Request) -> Response:
        """The agent -> policy mapping (`Collector(policies=...)`): read, or replaced with the
        body's `policies` (an object; `{}` or null routes nothing; a body without the key is
        refused, so a misspelt key cannot clear the mapping), and the versions per policy with
        `policy_versions` when given. Applies from the next request."""
        settings = self.registry.collector.settings
        if request.method == "PUT":
            body = await _json_object(request, ("policies", "policy_versions"), required="policies")
            mapping = _opt_dict(body, "policies") or {}
            versions = _opt_dict(body, "policy_versions")
            try:
                parsed = parse_policy_versions(versions)  # checked before anything changes
                settings.policies = mapping
            except ValueError as exc:
                raise _BadInput(str(exc)) from None
            if versions is not None:
                settings.policy_versions = parsed
        current = settings.policies
        if callable(current):
            return json_response({"policies": None, "hook": True})
        return json_response({"policies": current, "policy_versions": settings.policy_versions})

    async def stats(self, request: Request) -> Response:
        return json_response(self.registry.collector.stats.as_dict())


class _BadInput(Exception):
    pass


def _route(path: str, **handlers: Handler) -> Route:
    """One route for several methods (`GET=..., PATCH=...`): Starlette's 405 then lists them all
    in `Allow`, where two routes on one path would name only the first one's."""

    async def by_method(request: Request) -> Response:
        return await handlers[request.method if request.method != "HEAD" else "GET"](request)

    return Route(path, by_method, methods=list(handlers))


async def _json_object(
    request: Request, fields: tuple[str, ...], *, required: str | None = None
) -> dict[str, Any]:
    """The request's JSON object body (none: `{}`). A key outside `fields` is refused rather than
    ignored: a misspelt `rewrad` would otherwise close an episode without its reward; so is a
    body without `required`, where a missing key would clear a value (a reward, the version)."""
    raw = await request.body()
    body: Any = {}
    if raw.strip():
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _BadInput(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadInput("the body must be a JSON object")
    unknown = [key for key in body if key not in fields]
    if unknown:
        raise _BadInput(
            f"unknown field {unknown[0]!r}: this request takes {', '.join(map(repr, fields))}"
        )
    if required is not None and required not in body:
        raise _BadInput(f"the body must name {required!r} (null to clear it)")
    return body


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise _BadInput(f"{key} must be a string")
    return value


def _opt_bool(body: dict[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _BadInput(f"{key} must be true or false")
    return value


def _opt_dict(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise _BadInput(f"{key} must be a JSON object")
    if value is not None and _depth(value) > MAX_DEPTH:
        raise _BadInput(f"{key} is nested more than {MAX_DEPTH} levels deep")
    return value


def _depth(value: Any) -> int:
    """How many objects and arrays deep `value` nests (iterative: any depth the parser took)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _text(body: dict[str, Any], key: str) -> str | None:
    """An id or label: a string, an int (stored as its decimal string, as in the library) or null."""
    try:
        return as_text(body.get(key), key)
    except ValueError as exc:
        raise _BadInput(str(exc)) from None


def _reward(body: dict[str, Any]) -> float | None:
    value = body.get("reward")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _BadInput("reward must be a finite number or null")
    return float(value)
