"""`tito-agents serve`: an OpenAI-compatible capture gateway for agents that cannot be wrapped.

CLI harnesses run as subprocesses, agents in other languages and fleets of rollout workers are
given a base URL (`http://gateway/episodes/{id}/v1`) instead of a wrapped client. The gateway
forwards their calls to vLLM through the same capture core as the in-process transport, so
samples, sessions, sinks and assembly are the library's own; a control API (its own token)
opens and closes episodes and sets rewards. Needs the `gateway` extra (Starlette, uvicorn).
See docs/gateway.md.
"""

from tito_agents.gateway._app import CLIENT_KEEPALIVE_S, Gateway, GatewayConfig, upstream_root

__all__ = ["CLIENT_KEEPALIVE_S", "Gateway", "GatewayConfig", "upstream_root"]
