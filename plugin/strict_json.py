"""JSON read strictly, for every input recallbound reads from a file or the environment.

:func:`decode` turns every way a text can fail into one :class:`StrictJsonError` (a
``ValueError``) with a short reason: not UTF-8, not JSON, nested too deeply for the parser, a
key repeated in one object, ``NaN`` / ``Infinity`` (not JSON numbers), or an integer too long
to convert. It never raises a ``RecursionError`` or a bare ``ValueError``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["StrictJsonError", "decode"]


class StrictJsonError(ValueError):
    """A text that is not strict JSON; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _reject_constant(name: str) -> object:
    raise StrictJsonError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StrictJsonError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def decode(raw: str | bytes | bytearray) -> object:
    """The value of ``raw`` (UTF-8 when bytes); :class:`StrictJsonError` when it is not
    strict JSON (see the module docstring)."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJsonError(
                f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
            ) from None
    # JSON's own trailing white space off: a line read from a file keeps its line ending, and
    # an error at its end would otherwise be reported at "column 1" of the line after it.
    raw = raw.rstrip(" \t\r\n")
    try:
        return json.loads(
            raw, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as exc:
        raise StrictJsonError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise StrictJsonError("not valid JSON: nested too deeply") from None
    except StrictJsonError:
        raise
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise StrictJsonError("not valid JSON: a number too long to read") from None
