"""The fake vLLM's token codec: the library's (`tito_agents.token_codec`: chat rendering,
encoding, byte-exact decoding as vLLM's frontend does them) plus sampling drift, which only the
fake needs (real sampling often spells a word with non-canonical tokens)."""

from __future__ import annotations

from collections.abc import Sequence

from tito_agents.testing.fake_vllm._hash import mix, unit_interval
from tito_agents.token_codec import TextDecoder, TokenizerLike
from tito_agents.token_codec import TokenCodec as _FrontendCodec

__all__ = ["TextDecoder", "TokenCodec", "TokenizerLike"]


class TokenCodec(_FrontendCodec):
    """The frontend codec, plus `drift`: the fake's non-canonical spellings of sampled ids."""

    # -- sampling drift ------------------------------------------------------------------------

    def drift(self, token_ids: Sequence[int], *, rate: float, key: int) -> list[int]:
        """Re-spell a deterministic fraction of tokens as two or more shorter tokens.

        Real sampling often picks a non-canonical spelling of a word (`" wea" + "ther"` instead of
        `" weather"`): the text is identical, but decode -> encode gives other ids. This reproduces
        that: each eligible token (not added, at least two characters, valid UTF-8) is split with
        probability `rate`, decided by a hash of (`key`, position, id), and the halves are encoded
        separately. The decoded bytes are unchanged, so the text is unchanged.
        """
        drifted: list[int] = []
        for position, token_id in enumerate(token_ids):
            pieces = None
            if rate > 0 and unit_interval(mix(mix(key, position), token_id)) < rate:
                pieces = self._split(token_id)
            drifted.extend(pieces or (token_id,))
        return drifted

    def _split(self, token_id: int) -> list[int] | None:
        if token_id in self._added:
            return None
        text = self.token_text(token_id)
        if len(text) < 2 or "\ufffd" in text:
            return None
        cut = len(text) // 2
        pieces = self.encode(text[:cut], add_special_tokens=False)
        pieces += self.encode(text[cut:], add_special_tokens=False)
        if len(pieces) < 2 or b"".join(self._bytes[p] for p in pieces) != self._bytes[token_id]:
            return None
        return pieces
