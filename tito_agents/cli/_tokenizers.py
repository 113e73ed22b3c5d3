"""Loading a local tokenizer (a folder or a GGUF file) offline, with one-line errors.

transformers is imported only here and only when a command needs a tokenizer, so `stats` and `show`
without `--tokenizer` work on the core install. Nothing is fetched from a model hub: loading uses
`local_files_only=True` and the hub is switched off for the process (`HF_HUB_OFFLINE=1`) before
transformers is imported.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tito_agents.calls import IdArray
from tito_agents.cli._errors import CliInputError

__all__ = ["decode_runs", "decode_tokens", "is_gguf", "load_tokenizer"]

_GGUF_MAGIC = b"GGUF"
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
    "vocab.txt",
)
"""Files one of which a tokenizer folder holds; a folder with none is not a tokenizer folder (left
to transformers, it fails with a message about sentencepiece that names no file)."""


def is_gguf(path: Path) -> bool:
    """Whether `path` is a GGUF file (by its magic bytes)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def load_tokenizer(spec: str | os.PathLike[str]) -> Any:
    """A transformers tokenizer from a local folder or GGUF file; `CliInputError` when it can't load."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise CliInputError(
            path, "tokenizer not found (give a local tokenizer folder or a .gguf file)"
        )
    transformers = _import_transformers(path)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if path.is_dir():
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            raise CliInputError(
                None,
                f"no tokenizer.json in {path} (nor another tokenizer file): give the folder that "
                "holds the model's tokenizer files, or a .gguf file",
            )
        location = str(path)
    elif is_gguf(path):
        location, kwargs["gguf_file"] = str(path.parent), path.name
    else:
        raise CliInputError(path, "not a tokenizer folder or GGUF file")
    try:
        stamp = path.stat().st_mtime_ns
        return _cached_load(transformers, location, kwargs.get("gguf_file"), stamp)
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError, ...)
        raise CliInputError(path, f"cannot load tokenizer: {_short(exc)}") from exc


@functools.lru_cache(maxsize=4)
def _cached_load(transformers: Any, location: str, gguf_file: str | None, stamp: int) -> Any:
    """One load per (location, file, modification time) per process: tokenizers are only read."""
    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    with warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(location, **kwargs)


def decode_tokens(tokenizer: Any, ids: Sequence[int] | IdArray) -> list[str]:
    """Each id's own text (special tokens kept), so token boundaries can be shown."""
    id_list = [int(i) for i in ids]
    try:
        texts: list[str] = tokenizer.batch_decode(
            [[i] for i in id_list], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    except Exception:  # an id outside the vocabulary: show it as an id
        texts = [_decode_one(tokenizer, i) for i in id_list]
    return texts


_REPLACEMENT = "\ufffd"
_MAX_RUN = 8
"""A UTF-8 character is at most 4 bytes; byte-level tokenizers may add a few pieces around it."""


def decode_runs(
    tokenizer: Any, ids: Sequence[int] | IdArray, keys: Sequence[int] | None = None
) -> list[tuple[int, int, str]]:
    """`(start, end, text)` runs covering `ids` in order, for drawing tokens as text.

    Each token is its own run, except where a token's own text holds U+FFFD (it carries part of a
    multi-byte character, e.g. one byte of an emoji): it is decoded together with the tokens that
    follow, up to a few, until their joint text is clean, and that text belongs to the run. Runs
    never cross a change of `keys` (e.g. the token's class or call). A token that stays unclean
    (a character cut at the end of the sample) is its own run, shown as decoded.
    """
    id_list = [int(i) for i in ids]
    texts = decode_tokens(tokenizer, id_list)
    runs: list[tuple[int, int, str]] = []
    i, n = 0, len(id_list)
    while i < n:
        if _REPLACEMENT in texts[i]:
            run = _clean_run(tokenizer, id_list, keys, i)
            if run is not None:
                runs.append(run)
                i = run[1]
                continue
        runs.append((i, i + 1, texts[i]))
        i += 1
    return runs


def _clean_run(
    tokenizer: Any, ids: list[int], keys: Sequence[int] | None, start: int
) -> tuple[int, int, str] | None:
    for end in range(start + 2, min(len(ids), start + _MAX_RUN) + 1):
        if keys is not None and keys[end - 1] != keys[start]:
            return None
        try:
            text: str = tokenizer.decode(
                ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        except Exception:  # an id outside the vocabulary
            return None
        if _REPLACEMENT not in text:
            return start, end, text
    return None


def _decode_one(tokenizer: Any, token_id: int) -> str:
    try:
        text: str = tokenizer.decode([token_id], skip_special_tokens=False)
        return text
    except Exception:
        return f"<id {token_id}>"


def _import_transformers(path: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError as exc:
        raise CliInputError(
            path,
            "reading a tokenizer needs transformers: pip install transformers "
            "(or, in a tito-agents checkout: pip install '.[tokenizer]')",
        ) from exc
    return transformers


class _quiet_transformers:
    """Silence transformers' logger while loading (its warnings are not the user's problem here)."""

    def __enter__(self) -> None:
        self._logger = logging.getLogger("transformers")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self._logger.setLevel(self._level)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."
