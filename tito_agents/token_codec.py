"""Token-level machinery of vLLM's frontend: chat rendering, encoding, byte-exact decoding.

`render_chat_template` is the one chat-template renderer of the package: with a tokenizer it is
`apply_chat_template(..., tokenize=False)` (the tokenizer's special tokens are template variables,
exactly as in vLLM's chat endpoint, also for a template given apart from it, as vLLM renders
`--chat-template FILE`); without one, transformers' own sandboxed Jinja environment renders a bare
template with placeholder special tokens. `TemplateRenderer` is a template with where it came from
and what tokenizes it (what `tito-agents audit-template` and `drift` check); `TokenCodec` renders a
tokenizer's own template through the same function.

Everything here mirrors what vLLM itself does with a Hugging Face fast tokenizer, so the texts and
ids it gives are those a real vLLM would produce for the same ids. The trainer check rebuilds a
text pipeline's samples with it; the fake vLLM (`tito_agents.testing.fake_vllm`) serves with it:

* prompts are rendered with `apply_chat_template(..., tokenize=False)` and encoded without special
  tokens (chat) or with them (completions);
* generated text is decoded incrementally from token *bytes*, with the rule of tokenizers'
  `DecodeStream` (vLLM's detokenizer): a token ending inside a character releases nothing until
  a later token completes it, and what is still held at the end is dropped;
* logprob token strings are decoded the same way, in the context of the tokens before them.

The codec keeps its own copy of the Rust tokenizer for encoding, so a test using the shared
transformers tokenizer on another thread can never collide with the server thread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import orjson

from tito_agents.calls import IdArray

__all__ = [
    "PLACEHOLDER_SPECIAL_TOKENS",
    "RenderRefused",
    "TemplateRenderer",
    "TextDecoder",
    "TokenCodec",
    "TokenizerLike",
    "render_chat_template",
]

PLACEHOLDER_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}
"""Template variables given to a bare template (no tokenizer): templates read `bos_token` etc."""


def render_chat_template(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    tokenizer: Any | None = None,
    add_generation_prompt: bool,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text of `messages`, as vLLM's chat endpoint renders it.

    With a `tokenizer`: its `apply_chat_template(..., tokenize=False)`, with `template` (None: the
    tokenizer's own). Without: the bare `template` through transformers' sandboxed Jinja, with
    `PLACEHOLDER_SPECIAL_TOKENS`. Whatever the template raises propagates.
    """
    kwargs = dict(template_kwargs or {})
    tool_list = None if tools is None else [dict(t) for t in tools]
    if tokenizer is not None:
        if continue_final_message:
            kwargs["continue_final_message"] = True
        rendered = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=tool_list,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kwargs,
        )
        if not isinstance(rendered, str):
            raise TypeError(f"rendering returned {type(rendered).__name__}, not text")
        return rendered
    if template is None:
        raise ValueError("a bare render needs a template")
    return _render_bare(template, messages, tool_list, add_generation_prompt, kwargs)


def _render_bare(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    template_kwargs: Mapping[str, Any],
) -> str:
    from transformers.utils import chat_template_utils

    variables = {**PLACEHOLDER_SPECIAL_TOKENS, **template_kwargs}
    render = getattr(chat_template_utils, "render_jinja_template", None)
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    if render is not None:
        rendered, _ = render(
            conversations=[chat],
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        text: str = rendered[0]
        return text
    compiled = chat_template_utils._compile_jinja_template(template)  # transformers < 4.50
    text = compiled.render(
        messages=chat, tools=tools, add_generation_prompt=add_generation_prompt, **variables
    )
    return text


class RenderRefused(Exception):
    """The template raised while rendering one conversation (a `raise_exception` refusal or a bug)."""


@dataclass(slots=True)
class TemplateRenderer:
    """A chat template and what renders and tokenizes it.

    `tokenizer` renders (when `renders_with_tokenizer`: it came with the template, or the template
    is rendered as vLLM renders `--chat-template FILE` with it) and tokenizes (when given at all);
    `origin` names where the template came from, for reports.
    """

    origin: str
    template: str
    tokenizer: Any | None = None
    tokenizer_origin: str | None = None
    renders_with_tokenizer: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def template_sha256(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()

    @property
    def token_level(self) -> bool:
        return self.tokenizer is not None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The prompt text of `messages`; `RenderRefused` when the template raises."""
        try:
            text = render_chat_template(
                self.template,
                messages,
                tools,
                tokenizer=self.tokenizer if self.renders_with_tokenizer else None,
                add_generation_prompt=add_generation_prompt,
                template_kwargs=self.template_kwargs,
            )
        except Exception as exc:  # jinja2 errors, template bugs (TypeError, ...): all refusals
            raise RenderRefused(_short(exc)) from exc
        return text

    def encode(self, text: str) -> IdArray:
        """Text to ids as vLLM's chat endpoint does it: the rendered prompt, no special tokens added."""
        if self.tokenizer is None:
            raise ValueError("no tokenizer: text level only")
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int32)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class TokenizerLike(Protocol):
    """The slice of a transformers fast tokenizer the codec needs."""

    chat_template: Any
    added_tokens_decoder: Mapping[int, Any]
    backend_tokenizer: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def __len__(self) -> int: ...


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted (the ByteLevel pre-tokenizer)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


class TokenCodec:
    """Rendering, encoding and decoding with one tokenizer, as vLLM's frontend does them."""

    def __init__(self, tokenizer: TokenizerLike, *, cache_size: int = 1024) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = tokenizer
        self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.vocab_size = len(tokenizer)
        self._added: dict[int, tuple[str, bool]] = {
            int(i): (str(tok.content), bool(tok.special))
            for i, tok in tokenizer.added_tokens_decoder.items()
        }
        self.special_ids = frozenset(i for i, (_, special) in self._added.items() if special)
        self._bytes = self._token_bytes(
            tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        )
        self._texts: dict[int, str] = {}
        self._render_cached = lru_cache(maxsize=cache_size)(self._render_uncached)
        self._encode_cached = lru_cache(maxsize=cache_size)(self._encode_uncached)

    def _token_bytes(self, pieces: Sequence[str]) -> list[bytes]:
        decoder = _byte_decoder()
        table: list[bytes] = []
        for token_id, piece in enumerate(pieces):
            if token_id in self._added:
                table.append(self._added[token_id][0].encode())
            elif piece and all(char in decoder for char in piece):
                table.append(bytes(decoder[char] for char in piece))
            else:
                table.append((piece or "").encode())
        return table

    # -- prompts -------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat prompt text, exactly as `apply_chat_template(..., tokenize=False)` renders it."""
        key = orjson.dumps(
            [messages, tools, add_generation_prompt, continue_final_message, template_kwargs or {}]
        )
        return self._render_cached(key)

    def _render_uncached(self, key: bytes) -> str:
        messages, tools, add_generation_prompt, continue_final_message, kwargs = orjson.loads(key)
        return render_chat_template(
            None,
            messages,
            tools,
            tokenizer=self.tokenizer,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_kwargs=kwargs,
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Canonical ids of `text` (what `/tokenize` and prompt rendering give); a fresh list."""
        return list(self._encode_cached(text, add_special_tokens))

    def _encode_uncached(self, text: str, add_special_tokens: bool) -> tuple[int, ...]:
        return tuple(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    # -- decoding ------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token contributes to the text (an added token's content as UTF-8)."""
        return self._bytes[token_id]

    def is_added(self, token_id: int) -> bool:
        return token_id in self._added

    def token_text(self, token_id: int) -> str:
        """`decode([id])` with special tokens kept: the `token` string of a logprob entry."""
        text = self._texts.get(token_id)
        if text is None:
            added = self._added.get(token_id)
            text = added[0] if added else self._bytes[token_id].decode("utf-8", "replace")
            self._texts[token_id] = text
        return text

    def logprob_texts(
        self, context_ids: Sequence[int], rows: Iterable[tuple[int, Iterable[int]]]
    ) -> list[dict[int, str]]:
        """The `decoded_token` of each candidate at each position, decoded in context.

        vLLM decodes a logprob entry's token after the tokens before it, like its detokenizer:
        a token ending inside a character shows "" and the token completing it shows the held
        text too. Each row is `(actual id, candidate ids)`; the actual id advances the context.
        """
        pending = self._pending_bytes(context_ids)
        texts: list[dict[int, str]] = []
        for actual, candidates in rows:
            texts.append({token_id: self.piece(pending, token_id)[0] for token_id in candidates})
            pending = self.piece(pending, actual)[1]
        return texts

    def _pending_bytes(self, token_ids: Sequence[int]) -> bytes:
        """The bytes held back at the end of `token_ids` because they end inside a character."""
        pending = b""
        for token_id in token_ids[-8:]:  # a character spans at most 4 bytes
            pending = self.piece(pending, token_id)[1]
        return pending

    def piece(
        self, pending: bytes, token_id: int, *, skip_special_tokens: bool = False
    ) -> tuple[str, bytes]:
        """(text released by `token_id` after the held `pending` bytes, bytes held afterwards).

        This is the rule of tokenizers' `DecodeStream`, which vLLM's detokenizer uses: decode the
        held bytes plus the token; if the result ends in U+FFFD (an unfinished or broken
        character), release nothing and keep holding everything.
        """
        added = self._added.get(token_id)
        if added is not None:
            content, special = added
            if skip_special_tokens and special:
                return "", pending
            return pending.decode("utf-8", "replace") + content, b""
        data = pending + self._bytes[token_id]
        text = data.decode("utf-8", "replace")
        if text.endswith("\ufffd"):
            return "", data
        return text, b""

    def token_piece(self, token_id: int) -> str:
        """The raw vocabulary string (`"Ġare"`, `"Ċ"`), as `/tokenize` returns in `token_strs`."""
        return str(self._backend.id_to_token(token_id))

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Full decode, as `/detokenize` and `tokenizer.decode` give it."""
        return str(self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def text_decoder(self, *, skip_special_tokens: bool) -> TextDecoder:
        return TextDecoder(self, skip_special_tokens=skip_special_tokens)

    def is_valid_id(self, value: object) -> bool:
        return (
            isinstance(value, int) and not isinstance(value, bool) and 0 <= value < self.vocab_size
        )


class TextDecoder:
    """Incremental detokenizer: feed one sampled id at a time, get the text it releases.

    A token that ends inside a character (or in a broken one) releases nothing; its bytes are
    held and come out with the next token that completes the text, as U+FFFD if they turn out
    invalid. Whatever is still held at the end is never released: vLLM drops a trailing partial
    character. Special tokens contribute nothing when skipped, their content otherwise.
    """

    def __init__(self, codec: TokenCodec, *, skip_special_tokens: bool) -> None:
        self._codec = codec
        self._skip_special = skip_special_tokens
        self._pending = b""

    def push(self, token_id: int) -> str:
        text, self._pending = self._codec.piece(
            self._pending, token_id, skip_special_tokens=self._skip_special
        )
        return text
