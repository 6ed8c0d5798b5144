"""The metaclass that keeps a class's constructor to the package (a permit is only issued)."""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class NoPublicConstructor(type):
    """A metaclass whose classes cannot be called: the package builds them with ``_create``.

    ``Permit(...)`` raises :class:`TypeError` (as trio's ``NoPublicConstructor`` does), so a
    user gets a permit only from ``allowance.round``.
    """

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor; "
            "a permit comes from RecallAllowance.round()"
        )

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc,no-any-return]
