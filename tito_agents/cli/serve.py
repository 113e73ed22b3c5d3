"""`tito-agents serve`: run the capture gateway (`tito_agents.gateway`) in front of one vLLM.

Needs the `gateway` extra (`pip install '.[gateway]'` in a checkout); the rest of the command line
works without it. The control token comes from `$TITO_GATEWAY_TOKEN`, else from
`--control-token-file` (created with a fresh random token, mode 0600, when it does not exist):
never from the command line, which other users of the machine can read.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any

from tito_agents._state_dirs import gateway_journal_path, gateway_token_path
from tito_agents.cli._errors import EXIT_OK, CliInputError

TOKEN_ENV = "TITO_GATEWAY_TOKEN"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible capture gateway in front of vLLM (for agents given a base URL)",
        description=(
            "Forward /v1/... to a vLLM server and capture every call, addressed to an episode by "
            "the base URL /episodes/{id}/v1 or the X-Tito-Episode header; the control API under "
            "/control opens and closes episodes and sets rewards. See docs/gateway.md."
        ),
    )
    parser.add_argument("--upstream", required=True, help="the vLLM server (root or /v1 URL)")
    parser.add_argument(
        "--sink", default="samples.jsonl", help="where samples go: a path or URL (open_sink)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8100, help="port to listen on")
    parser.add_argument(
        "--control-token-file",
        type=Path,
        help=f"file holding the control API token (created if missing; ${TOKEN_ENV} wins)",
    )
    parser.add_argument(
        "--state",
        type=Path,
        help="restart journal (default: $TITO_CACHE_DIR/gateway-PORT.journal, TITO_CACHE_DIR "
        "defaulting to ~/.cache/tito-agents)",
    )
    parser.add_argument("--no-state", action="store_true", help="keep no restart journal")
    parser.add_argument("--assembly", default="per_call", choices=["per_call", "merged", "both"])
    parser.add_argument("--capture-logprobs", action="store_true", help="ask vLLM for logprobs")
    parser.add_argument(
        "--sessions", action="store_true", help="token-in sessions for chat and Responses calls"
    )
    parser.add_argument(
        "--policy-version",
        action="append",
        default=[],
        metavar="[POLICY=]LABEL",
        help="label of the weights sampling now; POLICY=LABEL for one policy (repeatable)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="AGENT=MODEL",
        help="send this agent's calls to this model / LoRA adapter (repeatable; docs/policies.md)",
    )
    parser.add_argument(
        "--errors", default="episode", choices=["episode", "count", "raise"], help="ErrorMode"
    )
    parser.add_argument(
        "--outside-episode",
        default="default",
        choices=["default", "error", "ignore"],
        help="calls to /v1 without an episode: per-call samples, refused, or not captured",
    )
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--read-timeout", type=float, default=600.0)
    parser.add_argument("--max-connections", type=int, default=1024, help="upstream pool size")
    parser.add_argument(
        "--max-concurrency", type=int, help="requests served at once (503 beyond it)"
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--access-log", action="store_true", help="log each request line")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from tito_agents.gateway import CLIENT_KEEPALIVE_S, Gateway, GatewayConfig, upstream_root
    except ImportError as exc:
        raise CliInputError(
            "serve",
            "needs the gateway extra: pip install '.[gateway]' in a tito-agents checkout, or "
            f"pip install --find-links dist 'tito-agents[gateway]' after make wheels ({exc})",
        ) from None
    import tito_agents as tito

    try:
        upstream_root(args.upstream)
    except ValueError as exc:
        raise CliInputError("--upstream", str(exc)) from None
    token = control_token(args.control_token_file, args.port)
    state = None
    if not args.no_state:
        state = args.state or gateway_journal_path(args.port)
    policies = _pairs("--policy", args.policy)
    versions = _pairs("--policy-version", [v for v in args.policy_version if "=" in v])
    plain = [v for v in args.policy_version if "=" not in v]
    if len(plain) > 1:
        raise CliInputError(
            "--policy-version", "one global label at most (POLICY=LABEL per policy)"
        )
    global_version = plain[0] if plain else None
    collector = tito.Collector(
        args.sink,
        capture_logprobs=args.capture_logprobs,
        errors=args.errors,
        outside_episode=args.outside_episode,
        policy_version=global_version,
        policies=policies or None,
        policy_versions=versions or None,
        assembly=args.assembly,
        keep_messages=False,
    )
    config = GatewayConfig(
        upstream=args.upstream,
        control_token=token,
        state_path=state,
        sessions=args.sessions,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        max_connections=args.max_connections,
    )
    gateway = Gateway(collector, config)
    sys.stderr.write(
        f"tito-agents serve: http://{args.host}:{args.port} -> "
        f"{without_credentials(upstream_root(args.upstream))}, "
        f"samples to {without_credentials(str(args.sink))}\n"
    )
    try:
        uvicorn.run(
            gateway.app(),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=args.access_log,
            limit_concurrency=args.max_concurrency,
            timeout_graceful_shutdown=30,
            timeout_keep_alive=CLIENT_KEEPALIVE_S,
        )
    finally:
        collector.close()
    return EXIT_OK


def control_token(path: Path | None, port: int) -> str:
    """The control token: `$TITO_GATEWAY_TOKEN`, else the file's (a new random one written with
    mode 0600 where the file does not exist yet)."""
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    path = path or gateway_token_path(port)
    if path.exists():
        token = path.read_text().strip()
        if not token:
            raise CliInputError(str(path), "the control token file is empty")
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    sys.stderr.write(f"tito-agents serve: new control token written to {path} (mode 0600)\n")
    return token


def without_credentials(url: str) -> str:
    """`url` with any user name and password replaced by `***`: the start-up line goes to logs
    that are kept, and a credential is never written anywhere (`redis://user:secret@host`)."""
    return _USERINFO.sub(r"\1***@", url, count=1)


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def _pairs(option: str, values: list[str]) -> dict[str, str]:
    """`NAME=VALUE` options as a mapping (a repeated NAME is refused: which one would win?)."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, item = value.partition("=")
        if not sep or not name or not item:
            raise CliInputError(option, f"expected NAME=VALUE, got {value!r}")
        if name in out:
            raise CliInputError(option, f"{name!r} given twice")
        out[name] = item
    return out
