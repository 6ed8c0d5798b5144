"""Structured logging: one logger per layer, each event a name plus typed fields.

Loggers: ``recallbound.control``, ``recallbound.memory``, ``recallbound.hooks``. An event is
logged as ``"<event> key=value ..."`` and carries the same fields as a dict on the record's
``recallbound`` attribute (``{"event": ..., **fields}``) for JSON formatters. Nothing is
printed; with no handler configured, the host's logging policy decides. Fields never include
query text (it may hold user data): fingerprints stand for queries.
"""

from __future__ import annotations

import logging

# A library prints nothing of its own: an application that configured no logging does not get
# recallbound's records on stderr (logging's last resort); one that did gets every record.
logging.getLogger("recallbound").addHandler(logging.NullHandler())

CONTROL = logging.getLogger("recallbound.control")


def log_event(logger: logging.Logger, level: int, event: str, **fields: object) -> None:
    """Log ``event`` with ``fields`` at ``level``; nothing is built when the level is off."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                    for key, value in fields.items())
    logger.log(level, "%s %s", event, text, extra={"recallbound": {"event": event, **fields}})
