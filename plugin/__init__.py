"""recallbound: a bounded, durable recall allowance and task-context query planning."""

from .control import *  # noqa: F403  (temporary: explicit re-exports follow)
