"""How a span's tokens were sampled: the parameters the engine applied, and its logprobs mode.

A record (the records layer: `calls`, `samples` and every sink use it; `tito_agents.convert`
re-exports `SamplingParams` beside the behaviour-logprob functions that read it).

Why a sample needs it: vLLM samples from `softmax(logits / T)` truncated by min-p, top-k and top-p
and renormalised (`tito_agents.convert.behaviour` is the spec), and returns either the logprobs
*before* all that (`--logprobs-mode raw_logprobs`, vLLM's default) or after it
(`processed_logprobs`). A trainer can only compute an importance ratio against the distribution that
sampled when it knows both. So every `CallSpan` says:

* `sampling`: the parameters as the engine applied them. A request's own value wins; a field it
  left out takes the server's default when the capture knows it (vLLM applies the model's
  `generation_config` to temperature, top_p, top_k, min_p and repetition_penalty unless the server
  runs `--generation-config vllm`), else vLLM's neutral value.
* `sampling_source`: where they came from: "request" (the request's values, neutral values for the
  fields it left out: exact when the server applies no defaults, as with `--generation-config
  vllm`), "request+server_defaults" (some field took a default the capture learned from the
  server), "declared" (the user said how the server samples: `declare_sampling`).
* `logprobs_mode`: "raw_logprobs", "processed_logprobs" (or the `*_logits` modes) when declared or
  probed (`probe_logprobs_mode`), None when unknown. vLLM exposes the mode nowhere a client can read
  in production (`/server_info` only in dev mode), so it is declared or probed, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tito_agents._http import http_module

GREEDY_EPS = 1e-5
"""Below this temperature vLLM samples greedily (vllm/v1/sample/sampler.py:19)."""

MIN_TEMPERATURE = 1e-2
"""vLLM raises a temperature in (0, MIN_TEMPERATURE) to it (vllm/sampling_params.py:30, 557-565)."""

RAW_LOGPROBS = "raw_logprobs"
PROCESSED_LOGPROBS = "processed_logprobs"
LOGPROBS_MODES = (RAW_LOGPROBS, PROCESSED_LOGPROBS, "raw_logits", "processed_logits")
"""vLLM's `--logprobs-mode` values (server-wide; `raw_logprobs` is its default)."""

FROM_REQUEST = "request"
FROM_SERVER_DEFAULTS = "request+server_defaults"
DECLARED = "declared"
SOURCES = (FROM_REQUEST, FROM_SERVER_DEFAULTS, DECLARED)

TRUNCATION_FIELDS = ("temperature", "top_p", "top_k", "min_p")
"""What the behaviour distribution depends on (after the processors that act before temperature)."""
DEFAULTED_FIELDS = (*TRUNCATION_FIELDS, "repetition_penalty")
"""The fields vLLM fills from the model's generation_config when a chat or completions request
leaves them out (vllm/config/model.py `get_diff_sampling_param`)."""

_NEUTRAL: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a span's tokens were sampled, with vLLM's values for "off".

    `top_k` 0 or -1 is off (so is any k >= the vocabulary), `top_p` 1.0 is off, `min_p` 0 is off;
    `temperature` below 1e-5 is greedy. The other fields act *before* temperature in vLLM
    (penalties, `logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens`): they do not change
    the truncation rules, but a trainer rebuilding the behaviour distribution must apply them to
    its logits first (`reshapes_logits`). `seed` only says which draw it was.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs, sorted by id."""
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an int, 0 or -1 (off) or >= 1, got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")

    @property
    def is_greedy(self) -> bool:
        """Temperature below 1e-5: the engine took the argmax (truncation does not apply)."""
        return self.temperature < GREEDY_EPS

    @property
    def is_truncated(self) -> bool:
        """Whether top-k, top-p or min-p cut the distribution (greedy spans are not: see
        `is_greedy`). A top_k at or above the vocabulary size also reads as truncated here."""
        return not self.is_greedy and (self.top_k > 0 or self.top_p < 1 or self.min_p > 0)

    @property
    def reshapes_logits(self) -> bool:
        """Penalties, logit bias, allowed ids, bad words or min_tokens changed the logits before
        temperature: the raw softmax of the model is not what was sampled, even at T=1."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or bool(self.logit_bias)
            or self.allowed_token_ids is not None
            or bool(self.bad_words)
            or self.min_tokens > 0
        )

    @property
    def is_plain(self) -> bool:
        """Temperature 1, no truncation, nothing reshaping the logits: the raw softmax is what
        sampled (no correction needed)."""
        return self.temperature == 1.0 and not self.is_truncated and not self.reshapes_logits

    def as_dict(self) -> dict[str, float | int]:
        """The four parameters the behaviour distribution is rebuilt from."""
        return {name: getattr(self, name) for name in TRUNCATION_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (`logit_bias` as a list of `{"token_id", "bias"}` objects, a
        shape every columnar reader takes, Hugging Face `datasets` included; null where unset)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "min_tokens": self.min_tokens,
            "logit_bias": (
                [{"token_id": k, "bias": v} for k, v in self.logit_bias]
                if self.logit_bias
                else None
            ),
            "allowed_token_ids": (
                None if self.allowed_token_ids is None else list(self.allowed_token_ids)
            ),
            "bad_words": list(self.bad_words) if self.bad_words else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Inverse of `to_dict`; missing or null fields take their neutral values."""
        values = {k: data.get(k) for k in _NEUTRAL}
        kwargs: dict[str, Any] = {k: (_NEUTRAL[k] if v is None else v) for k, v in values.items()}
        kwargs["top_k"] = int(kwargs["top_k"])
        for name in ("temperature", "top_p", "min_p", *_PENALTIES):
            kwargs[name] = float(kwargs[name])
        return cls(**kwargs, **_extras(data))

    @classmethod
    def from_request(
        cls, request: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> SamplingParams:
        """The parameters vLLM samples a request with, from its JSON body (`resolve` also says
        where they came from)."""
        return resolve(request, defaults)[0]


_PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty")


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return value


def _extras(source: Mapping[str, Any]) -> dict[str, Any]:
    """seed, min_tokens, logit_bias, allowed_token_ids and bad_words, read as vLLM reads them."""
    out: dict[str, Any] = {}
    seed = source.get("seed")
    if seed is not None:
        out["seed"] = int(_number("seed", seed))
    min_tokens = source.get("min_tokens")
    if min_tokens is not None:
        out["min_tokens"] = int(_number("min_tokens", min_tokens))
    bias = source.get("logit_bias")
    if isinstance(bias, Mapping):  # a request's {"<id>": bias}
        bias = list(bias.items())
    if isinstance(bias, list | tuple) and bias:  # stored: [{"token_id": id, "bias": b}, ...]
        pairs = [(b["token_id"], b["bias"]) if isinstance(b, Mapping) else b for b in bias]
        out["logit_bias"] = tuple(
            sorted((int(k), float(_number("logit_bias", v))) for k, v in pairs)
        )
    allowed = source.get("allowed_token_ids")
    if isinstance(allowed, list | tuple):
        out["allowed_token_ids"] = tuple(int(_number("allowed_token_ids", i)) for i in allowed)
    bad = source.get("bad_words")
    if isinstance(bad, str):
        bad = [bad]
    if isinstance(bad, list | tuple) and bad:
        out["bad_words"] = tuple(str(w) for w in bad)
    return out


_READ_FIELDS = frozenset(
    {*_NEUTRAL, "seed", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words"}
)
"""The request fields `resolve` reads (besides a nested `sampling_params`, never cached)."""
_RESOLVED: dict[tuple[Any, ...], tuple[SamplingParams, str]] = {}
"""`resolve`'s answers by `_resolve_key`: an agent's requests repeat a handful of sampling dicts,
and reading one costs more than the rest of a call's span. The values are frozen."""
_RESOLVED_MAX = 1024


def _resolve_key(
    request: Mapping[str, Any], defaults: Mapping[str, Any] | None
) -> tuple[Any, ...] | None:
    """What `resolve` reads of `request` and `defaults`, as a key that tells apart every input
    it answers differently for (each value with its type: 1, 1.0 and True differ; a float by
    its `hex`, so -0.0 is not 0.0); None when a value read is not a scalar (a `logit_bias`
    object, a list, a nested `sampling_params`): those are resolved each time."""
    key: list[Any] = []
    for items in (request.items(), () if defaults is None else defaults.items()):
        for name, value in items:
            if name not in _READ_FIELDS:
                if name == "sampling_params":
                    return None
                continue
            kind = type(value)
            if kind is float:
                key.append((name, value.hex()))
            elif kind is int or kind is str or kind is bool or value is None:
                key.append((name, kind, value))
            else:
                return None
        key.append(None)  # where the request ends and the defaults begin
    return tuple(key)


def resolve(
    request: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> tuple[SamplingParams, str]:
    """The parameters vLLM samples a request with, and their source ("request" or
    "request+server_defaults": whether some field took one of `defaults`).

    Chat and completions requests carry them at the top level; a field left out (or null) takes
    `defaults` (the server's `generation_config` defaults, when known), else vLLM's neutral value
    (vllm/entrypoints/openai/chat_completion/protocol.py:677-730). A body with a `sampling_params`
    object (the token-in `/inference/v1/generate` route) is read from that object, and there the
    server applies no generation_config default to these fields (only to max_tokens:
    vllm/entrypoints/scale_out/token_in_token_out/serving.py:320-331), so `defaults` is ignored.
    vLLM's own normalisation follows: 0 < temperature < 0.01 becomes 0.01, greedy switches
    truncation off, and top_k -1 is written 0 (both mean off).
    """
    key = _resolve_key(request, defaults)
    if key is None:
        return _resolve(request, defaults)
    known = _RESOLVED.get(key)
    if known is None:
        known = _resolve(request, defaults)  # what it raises is raised again next time
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[key] = known
    return known


def _resolve(
    request: Mapping[str, Any], defaults: Mapping[str, Any] | None
) -> tuple[SamplingParams, str]:
    nested = request.get("sampling_params")
    source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else request
    fallback: Mapping[str, Any] = {} if source is nested else (defaults or {})
    values: dict[str, Any] = {}
    defaulted = False
    for name, neutral in _NEUTRAL.items():
        value = source.get(name)
        if value is None and name in DEFAULTED_FIELDS:
            value = fallback.get(name)
            defaulted = defaulted or value is not None
        values[name] = _number(name, neutral if value is None else value)
    if values["top_k"] != int(values["top_k"]):
        raise ValueError(f"top_k must be an integer, got {values['top_k']!r}")
    temperature = float(values["temperature"])
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    greedy = temperature < GREEDY_EPS
    params = SamplingParams(
        temperature=temperature,
        top_p=1.0 if greedy else float(values["top_p"]),
        top_k=0 if greedy else max(int(values["top_k"]), 0),
        min_p=0.0 if greedy else float(values["min_p"]),
        presence_penalty=float(values["presence_penalty"]),
        frequency_penalty=float(values["frequency_penalty"]),
        repetition_penalty=float(values["repetition_penalty"]),
        **_extras(source),
    )
    return params, FROM_SERVER_DEFAULTS if defaulted else FROM_REQUEST


@dataclass(frozen=True, slots=True)
class ServerSampling:
    """What a server adds to each request's sampling, as far as the capture knows it.

    `defaults`: the values it applies to fields a request leaves out (its model's
    generation_config, read from the server or its model folder), empty when it applies none or
    they are unknown; `logprobs_mode`: its `--logprobs-mode`, None when unknown; `declared`: the
    user stated these (they win over what a request says). Set on `Call.server_sampling`.
    """

    defaults: Mapping[str, Any] = field(default_factory=dict)
    logprobs_mode: str | None = None
    declared: bool = False

    def __post_init__(self) -> None:
        if self.logprobs_mode is not None and self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")


def span_sampling(
    request: Mapping[str, Any], server: ServerSampling | None
) -> tuple[SamplingParams | None, str | None, str | None]:
    """`(sampling, sampling_source, logprobs_mode)` of a call's span; `(None, None, mode)` when the
    request's sampling fields cannot be read (a value vLLM would have refused)."""
    mode = None if server is None else server.logprobs_mode
    try:
        params, source = resolve(request, None if server is None else server.defaults)
    except (TypeError, ValueError):
        return None, None, mode
    if server is not None and server.declared:
        source = DECLARED
    return params, source, mode


def declare_sampling(
    spans: Iterable[Any],
    *,
    logprobs_mode: str | None = None,
    params: SamplingParams | None = None,
) -> None:
    """Say how spans were sampled where the capture could not learn it: sets `logprobs_mode`
    (checked against `LOGPROBS_MODES`) and, given `params`, replaces each span's sampling and
    marks it "declared". Spans are changed in place (e.g. `for s in samples: declare_sampling(
    s.spans, logprobs_mode="processed_logprobs")` before writing them again)."""
    if logprobs_mode is not None and logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    for span in spans:
        if logprobs_mode is not None:
            span.logprobs_mode = logprobs_mode
        if params is not None:
            span.sampling, span.sampling_source = replace(params), DECLARED


def probe_request(model: str) -> dict[str, Any]:
    """A one-token chat request whose answer tells the server's logprobs mode (`mode_of_probe`):
    top_k 1 at temperature 0.5 leaves the top token (with any exact ties) in the processed
    distribution, so its top logprobs hold -inf (vLLM writes -9999.0) past the kept ones."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0.5,
        "top_k": 1,
        "logprobs": True,
        "top_logprobs": 5,
    }


def mode_of_probe(response: Mapping[str, Any]) -> str | None:
    """The logprobs mode from the answer to `probe_request`: processed logprobs put all the mass
    on the kept token(s) (their probabilities sum to 1) and -9999.0 on the others; raw ones are
    five finite values of the full distribution (summing below 1). None when the answer cannot
    tell (no logprobs, a logits mode, ...). Ties matter: SmolLM2's bf16 logits tie its top two
    tokens on this prompt, so the rule never expects exactly one kept token."""
    try:
        first = response["choices"][0]["logprobs"]["content"][0]
        tops = [float(t["logprob"]) for t in first["top_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    finite = [t for t in tops if t > -9999.0]
    if len(tops) < 2 or not finite or max(tops) > 1e-6:
        return None
    mass = sum(math.exp(t) for t in finite)
    if len(finite) < len(tops) and abs(mass - 1.0) < 1e-3:
        return PROCESSED_LOGPROBS
    if len(finite) == len(tops) and mass < 1.0 - 1e-3:
        return RAW_LOGPROBS
    return None


__all__ = [
    "DECLARED",
    "FROM_REQUEST",
    "FROM_SERVER_DEFAULTS",
    "GREEDY_EPS",
    "LOGPROBS_MODES",
    "MIN_TEMPERATURE",
    "PROCESSED_LOGPROBS",
    "RAW_LOGPROBS",
    "SOURCES",
    "SamplingParams",
    "ServerSampling",
    "declare_sampling",
    "mode_of_probe",
    "probe_request",
    "resolve",
    "span_sampling",
]


def probe_logprobs_mode(
    base_url: str, model: str, *, api_key: str | None = None, timeout: float = 60.0
) -> str | None:
    """The `--logprobs-mode` of the vLLM at `base_url` (".../v1"), from one one-token request
    (`probe_request`, `mode_of_probe`); None when the answer cannot tell or the server refuses.

    Explicit on purpose: capture never sends a request of its own inside an agent's call, so the
    mode is probed once by the caller and declared, e.g.
    `Collector(logprobs_mode=probe_logprobs_mode(url, model))`."""
    http = http_module()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = http.post(
            f"{base_url.rstrip('/')}/chat/completions",
            json=probe_request(model),
            headers=headers,
            timeout=timeout,
        )
    except http.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    try:
        return mode_of_probe(answer.json())
    except ValueError:
        return None
