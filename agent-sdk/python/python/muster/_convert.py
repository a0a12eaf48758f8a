"""Conversions of Python arguments into what the native layer takes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Optional, Tuple, Union

from . import _native

Duration = Union[float, int, timedelta]
"""A duration: seconds as a number, or a :class:`datetime.timedelta`."""

JSON_SEPARATORS = (",", ":")


def ms(value: Optional[Duration], what: str) -> Optional[int]:
    """Milliseconds of a duration (``None`` stays ``None``); negative is refused."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds >= 0:
        raise _native.InvalidInput(f"{what} must be a duration of 0 s or more, not {value!r}")
    return round(seconds * 1000)


def ms_required(value: Duration, what: str) -> int:
    """Milliseconds of a duration that must be given."""
    millis = ms(value, what)
    if millis is None:
        raise _native.InvalidInput(f"{what} is required")
    return millis


def instant_ms(at: Union[datetime, float, int]) -> int:
    """Milliseconds since the Unix epoch of a datetime (naive means local time) or of
    seconds since the epoch."""
    seconds = at.timestamp() if isinstance(at, datetime) else float(at)
    if not seconds >= 0:
        raise _native.InvalidInput(f"not an instant after 1970: {at!r}")
    return round(seconds * 1000)


def json_text(value: Any, what: str) -> str:
    """JSON text of a value: ``bytes`` are taken as JSON text already encoded (UTF-8,
    checked here to be exactly one JSON value, as it is spliced into the request as it
    is); anything else goes through :func:`json.dumps`."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _native.InvalidInput(f"{what} bytes are not UTF-8 JSON text: {e}") from None
        try:
            json.loads(text)
        except ValueError as e:
            raise _native.InvalidInput(f"{what} bytes are not one JSON value: {e}") from None
        return text
    try:
        return json.dumps(value, separators=JSON_SEPARATORS, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _native.InvalidInput(f"{what} is not JSON-serialisable: {e}") from None


def json_value(value: Any, what: str) -> Union[bytes, _native.Json]:
    """A JSON value of a request, as the extension's call takes it: ``bytes`` are JSON
    text already encoded (UTF-8, checked here to be exactly one JSON value, as it is
    spliced into the request as it is); anything else is written as :func:`json_text`
    writes it (by the extension, which raises the same :class:`~muster.InvalidInput`)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        json_text(value, what)
        return bytes(value)
    return _native.Json(value, what)


def claim_of(value: Any) -> Tuple[str, int]:
    """``(task id, epoch)`` of a :class:`~muster.Claim`, anything with ``id`` and
    ``epoch`` attributes, or a claim string ``ID.EPOCH``."""
    if isinstance(value, str):
        task, dot, epoch = value.rpartition(".")
        if not dot or not epoch.isdigit():
            raise _native.InvalidInput(f"{value!r} is not a claim string ID.EPOCH")
        return task, int(epoch)
    try:
        return str(value.id), int(value.epoch)
    except AttributeError:
        raise _native.InvalidInput(
            f"not a claim (a Claim or an ID.EPOCH string): {value!r}"
        ) from None
