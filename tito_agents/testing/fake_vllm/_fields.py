"""Field readers and errors of the fake vLLM's request validation: values coerced as pydantic's
lax mode does (vLLM's request models use it), errors worded as vLLM 0.32 words them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "FakeHTTPError",
    "bad_request",
    "bool_field",
    "int_field",
    "int_list_field",
    "number_field",
    "optional_bool_field",
    "schema_error",
]

_MISSING: Any = object()


class FakeHTTPError(Exception):
    """An error the fake answers with vLLM's body `{"error": {"message","type","param","code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        err_type: str = "BadRequestError",
        param: str | None = None,
        value: Any = _MISSING,
        suffix: bool = True,
    ) -> None:
        if suffix and param is not None:
            detail = (
                f"parameter={param}" if value is _MISSING else f"parameter={param}, value={value}"
            )
            message = f"{message} ({detail})"
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def bad_request(message: str, param: str | None = None, value: Any = _MISSING) -> FakeHTTPError:
    return FakeHTTPError(400, message, param=param, value=value)


def schema_error(
    kind: str, loc: str, msg: str, value: Any, ctx: Mapping[str, Any] | None = None
) -> FakeHTTPError:
    """A request-schema violation, worded like the pydantic error vLLM forwards."""
    shown = str(value)
    if isinstance(value, (dict, list)):
        shown = f"<{type(value).__name__} of {len(value)} items>"
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": shown}
    if ctx:
        detail["ctx"] = dict(ctx)
    message = f"1 validation error:\n  {detail!r}"
    return FakeHTTPError(400, message, err_type="Bad Request", param=loc, suffix=False)


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def bool_field(body: Mapping[str, Any], key: str, default: bool, *, loc: str = "body") -> bool:
    """A boolean field, coerced like pydantic's lax mode ("true", 1, "off", ...)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    if isinstance(value, str):
        msg = "Input should be a valid boolean, unable to interpret input"
        raise schema_error("bool_parsing", f"{loc}.{key}", msg, value)
    raise schema_error("bool_type", f"{loc}.{key}", "Input should be a valid boolean", value)


def optional_bool_field(body: Mapping[str, Any], key: str) -> bool | None:
    return None if body.get(key) is None else bool_field(body, key, False)


def int_field(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """An integer field, coerced like pydantic's lax mode ("2" and 2.0 are 2)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, int):  # bool included: pydantic's lax mode accepts it
        return int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        whole, dot, zeros = text.partition(".")  # pydantic reads "2.0" as 2, not "2.5"
        try:
            if dot and (not zeros or zeros.strip("0")):
                raise ValueError(text)
            return int(whole if dot else text)
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            raise schema_error("int_parsing", f"body.{key}", msg, value) from None
    if isinstance(value, float):
        msg = "Input should be a valid integer, got a number with a fractional part"
        raise schema_error("int_from_float", f"body.{key}", msg, value)
    raise schema_error("int_type", f"body.{key}", "Input should be a valid integer", value)


def number_field(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            msg = "Input should be a valid number, unable to parse string as a number"
            raise schema_error("float_parsing", f"body.{key}", msg, value) from None
    raise schema_error("float_type", f"body.{key}", "Input should be a valid number", value)


def int_list_field(body: Mapping[str, Any], key: str) -> list[int]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise schema_error("list_type", f"body.{key}", "Input should be a valid list", value)
    return [int_field({key: item}, key, 0) or 0 for item in value]
