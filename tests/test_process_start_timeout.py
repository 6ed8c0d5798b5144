"""``ProcessRetriever.start()`` is bounded by ``timeout_s``: a factory whose module hangs when
the worker imports it is a typed failure, not a start that never returns."""

from __future__ import annotations

import os

import anyio
import pytest

from plugin import ProcessRetriever
from plugin.errors import RetrieverFailedError

from . import _process_hang_at_import as hanging_module

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_start_gives_up_on_a_worker_whose_import_hangs() -> None:
    env = {**os.environ, "RB_HANG_AT_IMPORT": "1"}  # only the worker's import hangs
    async with ProcessRetriever(hanging_module.factory, timeout_s=1.0, env=env) as retriever:
        with anyio.fail_after(8), pytest.raises(RetrieverFailedError):
            await retriever.start()
        assert retriever._idle == []
