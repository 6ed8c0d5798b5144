"""A Griffe extension for the API reference: Sphinx roles in docstrings become links.

The docstrings name other objects the Sphinx way (``:class:`~plugin.control.permit.Permit```,
``:meth:`legacy```). mkdocstrings renders docstrings as Markdown, where such a role would show
as raw text. This extension rewrites each role, before rendering, into an *optional*
cross-reference: a link when the object is in the reference, plain code when it is not (a
private helper, a relative name), never a build warning.
"""

from __future__ import annotations

import html
import re
from typing import Any

from griffe import Extension, NameResolutionError, Object

_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|attr|mod|data|exc|obj|const|type)"
    r":`(?P<body>[^`]+)`"
)
_EXPLICIT = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
_CALLABLE = {"func", "meth"}


def _absolute(target: str, scope: Object | None) -> str:
    """``target`` as a full path, resolved from ``scope`` when it is relative (``legacy``)."""
    if scope is None:
        return target
    head, dot, rest = target.partition(".")
    try:
        return scope.resolve(head) + dot + rest
    except (NameResolutionError, AttributeError, KeyError):
        return target


def _reference(match: re.Match[str], scope: Object | None) -> str:
    role, body = match["role"], match["body"].strip()
    explicit = _EXPLICIT.match(body)
    if explicit:
        title, target = explicit["title"], explicit["target"].strip()
    else:
        target = body.lstrip("~!.")
        title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
        if role in _CALLABLE and not title.endswith(")"):
            title += "()"
    target = _absolute(target, scope)
    return (f'<autoref identifier="{html.escape(target, quote=True)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>")


def rewrite(text: str, scope: Object | None = None) -> str:
    """``text`` with every Sphinx cross-reference role replaced by an optional autoref.

    A relative name is looked up from ``scope`` (the object whose docstring it is).
    """
    return _ROLE.sub(lambda match: _reference(match, scope), text)


class SphinxRoles(Extension):
    """Rewrite Sphinx roles in every docstring once the object tree is built."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":`" in obj.docstring.value:
            obj.docstring.value = rewrite(obj.docstring.value, obj)
