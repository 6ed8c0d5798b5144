"""Adapter options: one name per concept in every adapter, old names kept as deprecated."""

from __future__ import annotations

import warnings
from typing import TypeVar

from plugin.errors import InvalidArgumentError

_T = TypeVar("_T")


def deprecated_alias(
    old: str, new: str, given: _T, current: _T, default: _T, *, stacklevel: int = 3
) -> _T:
    """An option given by its old name: warns (``DeprecationWarning``) and returns its value;
    both names at once raise :class:`~plugin.errors.InvalidArgumentError`."""
    if current is not default:
        raise InvalidArgumentError(f"{old}= is the deprecated name of {new}=: give only {new}=")
    warnings.warn(f"{old}= is deprecated: use {new}= (the same option in every adapter)",
                  DeprecationWarning, stacklevel=stacklevel)
    return given
