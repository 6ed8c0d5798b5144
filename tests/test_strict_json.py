"""plugin.strict_json: every way a text can fail is one StrictJsonError with a short reason."""

from __future__ import annotations

import pytest

from plugin.strict_json import StrictJsonError, decode


@pytest.mark.parametrize(("text", "reason"), [
    (b"\xff{}", "not UTF-8"),
    ("{not json", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": 1, "a": 2}', "duplicate key"),
    ("[NaN]", "not a JSON number"),
    ('{"big": ' + "9" * 5_000 + "}", "a number too long"),
])
def test_every_failure_is_one_typed_error_with_its_reason(text: str | bytes, reason: str) -> None:
    with pytest.raises(StrictJsonError, match=reason) as raised:
        decode(text)
    assert isinstance(raised.value, ValueError) and reason in raised.value.reason


def test_strict_json_reads_what_json_reads() -> None:
    assert decode('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    assert decode(b'{"n": 12345678901234567890}') == {"n": 12345678901234567890}
