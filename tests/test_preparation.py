"""The preparation protocol: one former, one fingerprint, and the adapter's token limit."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

import anyio
import attrs
import numpy as np
import numpy.typing as npt
import pytest

from plugin.control.clock import ManualClock
from plugin.memory.embedding import EmbeddingAdapter
from plugin.memory.planning import (
    BaselineReason,
    QueryPlanner,
    QueryStrategy,
    compose_baseline,
    compose_task_context,
)
from plugin.memory.preparation import (
    PreparationBound,
    PreparedRecall,
    QueryPreparation,
    RecallPreparer,
    SemanticPreparation,
    WithheldReason,
)
from plugin.memory.state import Fact, Task, WorkingState

from ._fakes import Forwarding
from ._loops import VIRTUAL_TIME_LOOPS

pytestmark = pytest.mark.anyio


@pytest.fixture(params=VIRTUAL_TIME_LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """Both loops; trio on an autojumping MockClock (no worker threads here)."""
    return request.param


class HashingAdapter:
    """Deterministic toy embedder: words hashed into 64 dimensions, one token per word."""

    def __init__(self, token_limit: int = 16) -> None:
        self._token_limit = token_limit
        self.embedded: list[str] = []
        self.counted: list[str] = []

    @property
    def name(self) -> str:
        return "hashing-64"

    @property
    def token_limit(self) -> int:
        return self._token_limit

    @property
    def dimensions(self) -> int:
        return 64

    def count_tokens(self, text: str) -> int:
        self.counted.append(text)
        return len(text.split())

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.embedded.extend(texts)
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.casefold().split():
                digest = hashlib.sha256(word.encode()).digest()
                out[row, digest[0] % 64] += 1.0
            norm = np.linalg.norm(out[row])
            if norm:
                out[row] /= norm
        return out


class BrokenAdapter(HashingAdapter):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        raise KeyError(texts[0])  # as a vocabulary lookup does: the query in its message


class WrongShapeAdapter(HashingAdapter):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.zeros((len(texts), 3), dtype=np.float32)


class ObjectArrayAdapter(HashingAdapter):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.full((len(texts), 64), "x", dtype=object)  # type: ignore[return-value]


class BadLimitAdapter(HashingAdapter):
    @property
    def token_limit(self) -> int:
        return "16"  # type: ignore[return-value]


class RaisingDimensionsAdapter(HashingAdapter):
    """Its dimensions read once (when the preparation checks it), then raise."""

    reads = 0

    @property
    def dimensions(self) -> int:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("no dimensions")
        return 64


class Admission:
    """Answers from a repeating script; counts calls."""

    def __init__(self, *answers: bool) -> None:
        self.answers = answers
        self.calls = 0

    async def __call__(self, experiment: str) -> bool:
        self.calls += 1
        return self.answers[(self.calls - 1) % len(self.answers)]


STATE = WorkingState(
    "Continue",
    objective="Finish the quarterly report",
    next_action="Draft the revenue section",
    tasks=(Task("Collect figures", done=True), Task("Ask Priya for Q3 numbers")),
    open_questions=("Which currency?",),
    constraints=("Two pages max",),
    facts=(Fact("Priya runs finance", ("Priya",)),),
)


def test_adapter_satisfies_the_protocol() -> None:
    assert isinstance(HashingAdapter(), EmbeddingAdapter)
    preparer = QueryPreparation(QueryPlanner(), HashingAdapter())
    assert isinstance(preparer, RecallPreparer)


async def test_a_forwarding_proxy_of_an_adapter_embeds_and_anything_else_is_refused() -> None:
    # Since Python 3.12 isinstance() against a runtime protocol reads attributes statically,
    # so it would refuse a proxy whose members all exist.
    proxy = Forwarding(HashingAdapter(token_limit=64))
    preparer = QueryPreparation(QueryPlanner(), proxy)  # type: ignore[arg-type]
    prepared = await preparer.prepare(STATE, scope="proj", principal="u1")
    assert prepared.semantic.vector is not None and prepared.semantic.model == proxy.name
    with pytest.raises(TypeError, match="must be an EmbeddingAdapter or None, got Forwarding"):
        QueryPreparation(QueryPlanner(), Forwarding(object()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        QueryPreparation(QueryPlanner(), "wordllama")  # type: ignore[arg-type]


async def test_prepare_plans_once_and_embeds_that_query() -> None:
    admission = Admission(True)
    adapter = HashingAdapter(token_limit=64)
    preparer = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, admission), adapter)
    prepared = await preparer.prepare(STATE, scope="proj", principal="u1")

    assert admission.calls == 1
    assert prepared.query == compose_task_context(STATE, scope="proj", principal="u1")
    assert prepared.fingerprint == prepared.query.fingerprint == prepared.semantic.fingerprint
    # The query and its fragments, in one call (the fragments are parts of the counted text).
    assert adapter.embedded == [prepared.query.text, *prepared.query.fragments]
    semantic = prepared.semantic
    assert len(semantic.fragment_vectors) == len(prepared.query.fragments)
    assert all(not v.flags.writeable for v in semantic.fragment_vectors)
    assert semantic.withheld_reason is None
    assert semantic.tokens == len(prepared.query.text.split())
    assert semantic.model == "hashing-64"
    assert semantic.vector is not None
    assert semantic.vector.dtype == np.float32
    assert semantic.vector.shape == (64,)
    assert not semantic.vector.flags.writeable
    np.testing.assert_allclose(semantic.vector, adapter.embed([prepared.query.text])[0])


async def test_recent_query_is_the_frozen_control() -> None:
    preparer = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, Admission(True)))
    prepared = await preparer.prepare(STATE, scope="proj", principal="u1")
    assert prepared.query.strategy is QueryStrategy.TASK_CONTEXT
    recent = prepared.recent_query
    assert recent.baseline_reason is BaselineReason.FROZEN_CONTROL
    assert recent.fingerprint == compose_baseline(STATE, scope="proj", principal="u1").fingerprint


async def test_fingerprints_match_between_preparation_and_retrieval_under_flipping() -> None:
    admission = Admission(True, False)
    adapter = HashingAdapter(token_limit=64)
    preparer = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, admission), adapter)
    rounds = [await preparer.prepare(STATE, scope="proj", principal="u1") for _ in range(6)]

    assert admission.calls == 6  # once per round, never cached
    strategies = [prepared.query.strategy for prepared in rounds]
    assert strategies == [QueryStrategy.TASK_CONTEXT, QueryStrategy.BASELINE] * 3
    for prepared in rounds:
        # Retrieval reads the query from the same PreparedRecall: admission flipping in
        # between cannot make it search something other than what was embedded.
        retrieval_query = prepared.query
        assert prepared.semantic.fingerprint == retrieval_query.fingerprint
        assert adapter.embedded.count(retrieval_query.text) >= 1
    assert rounds[0].fingerprint != rounds[1].fingerprint


async def test_over_the_token_limit_withholds_semantic_but_keeps_the_query() -> None:
    adapter = HashingAdapter(token_limit=5)
    preparer = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, Admission(True)), adapter)
    prepared = await preparer.prepare(STATE, scope=None, principal=None)
    semantic = prepared.semantic
    assert semantic.vector is None
    assert semantic.withheld_reason is WithheldReason.TOKEN_LIMIT
    assert semantic.tokens == len(prepared.query.text.split()) > 5
    assert semantic.fingerprint == prepared.query.fingerprint
    assert adapter.embedded == []  # withheld, not truncated
    assert prepared.query.text  # the sparse arm still has its text


async def test_exactly_the_token_limit_is_embedded() -> None:
    state = WorkingState("one two three")
    prepared = await QueryPreparation(QueryPlanner(), HashingAdapter(token_limit=3)).prepare(
        state, scope=None, principal=None
    )
    assert prepared.semantic.tokens == 3
    assert prepared.semantic.vector is not None


async def test_no_adapter_and_empty_query_are_withheld() -> None:
    prepared = await QueryPreparation(QueryPlanner()).prepare(STATE, scope="s", principal="p")
    assert prepared.semantic.withheld_reason is WithheldReason.NO_ADAPTER
    assert prepared.semantic.vector is None
    assert prepared.semantic.tokens is None

    adapter = HashingAdapter()
    prepared = await QueryPreparation(QueryPlanner(), adapter).prepare(
        WorkingState("   "), scope="s", principal="p"
    )
    assert prepared.query.text == ""
    assert prepared.semantic.withheld_reason is WithheldReason.EMPTY_QUERY
    assert adapter.counted == []


@pytest.mark.parametrize("adapter_type", [BrokenAdapter, WrongShapeAdapter, ObjectArrayAdapter,
                                          BadLimitAdapter, RaisingDimensionsAdapter])
async def test_failing_adapter_withholds_semantic(
    adapter_type: type[HashingAdapter], caplog: pytest.LogCaptureFixture
) -> None:
    prepared = await QueryPreparation(QueryPlanner(), adapter_type(token_limit=64)).prepare(
        STATE, scope=None, principal=None
    )
    assert prepared.semantic.withheld_reason is WithheldReason.ADAPTER_FAILED
    assert prepared.semantic.vector is None
    (record,) = [r for r in caplog.records if "embedding.adapter_failed" in r.getMessage()]
    assert record.recallbound["adapter"] == "hashing-64"  # type: ignore[attr-defined]
    # an adapter's exception may quote the query: no word of it is logged, nor a traceback
    assert record.exc_info is None and "revenue" not in caplog.text.casefold()


async def test_state_is_not_mutated_and_scope_comes_from_arguments() -> None:
    state = attrs.evolve(STATE, current_request="Continue in scope: other as principal: admin")
    before = attrs.asdict(state, recurse=True)
    prepared = await QueryPreparation(
        QueryPlanner(QueryStrategy.TASK_CONTEXT, Admission(True)), HashingAdapter(64)
    ).prepare(state, scope="proj", principal="u1")
    assert attrs.asdict(state, recurse=True) == before
    for query in (prepared.query, prepared.recent_query):
        assert (query.scope, query.principal) == ("proj", "u1")


def test_prepared_recall_refuses_mismatched_fingerprints() -> None:
    query = compose_task_context(STATE, scope="s")
    recent = QueryPlanner().plan_recent(STATE, scope="s")
    other = compose_baseline(STATE, scope="s")
    ok = SemanticPreparation(
        fingerprint=query.fingerprint, withheld_reason=WithheldReason.NO_ADAPTER
    )
    assert PreparedRecall(query=query, recent_query=recent, semantic=ok).fingerprint == (
        query.fingerprint
    )
    wrong = SemanticPreparation(
        fingerprint=other.fingerprint, withheld_reason=WithheldReason.NO_ADAPTER
    )
    with pytest.raises(ValueError, match="semantic was prepared for query"):
        PreparedRecall(query=query, recent_query=recent, semantic=wrong)
    with pytest.raises(ValueError, match="recent_query must be a baseline"):
        PreparedRecall(query=query, recent_query=query, semantic=ok)
    with pytest.raises(ValueError, match="scope and principal"):
        PreparedRecall(
            query=query, recent_query=QueryPlanner().plan_recent(STATE, scope="t"), semantic=ok
        )


def test_semantic_preparation_needs_a_vector_or_a_reason() -> None:
    with pytest.raises(ValueError, match="either a vector or a withheld_reason"):
        SemanticPreparation(fingerprint="f")
    vector = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="either a vector or a withheld_reason"):
        SemanticPreparation(
            fingerprint="f", vector=vector, withheld_reason=WithheldReason.NO_ADAPTER
        )


def test_query_preparation_validates_its_parts() -> None:
    with pytest.raises(TypeError, match="planner"):
        QueryPreparation("planner")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"QueryPreparation\.embedding"):
        QueryPreparation(QueryPlanner(), object())  # type: ignore[arg-type]


async def test_huge_query_is_withheld_without_tokenizing() -> None:
    from plugin import QueryPlanner, QueryPreparation, WorkingState
    from plugin.memory import WithheldReason
    from plugin.memory.hashing import HashingEmbedding

    class Counting(HashingEmbedding):
        counted = 0

        def count_tokens(self, text: str) -> int:
            Counting.counted += 1
            return super().count_tokens(text)

    adapter = Counting(token_limit=64)
    preparation = QueryPreparation(QueryPlanner(), adapter)
    prepared = await preparation.prepare(WorkingState("x" * 1_000_000), scope="s", principal="p")
    assert prepared.semantic.withheld_reason is WithheldReason.TOKEN_LIMIT
    assert Counting.counted == 0


class HeldAdapter(HashingAdapter):
    """An embedder that blocks its worker thread until released (a model that hangs)."""

    def __init__(self) -> None:
        super().__init__(token_limit=256)
        self.release = threading.Event()

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.release.wait(30)
        return super().embed(texts)


async def test_a_cut_embedding_keeps_its_plan_and_asks_admission_once() -> None:
    admission = Admission(True, False)  # were it asked again, it would withdraw
    held = HeldAdapter()
    preparation = QueryPreparation(QueryPlanner(QueryStrategy.TASK_CONTEXT, admission), held)
    bound = PreparationBound(0.05, ManualClock(wall=0.0, monotonic=0.0))
    try:
        prepared = await bound.prepare(lambda withhold: preparation.prepare(
            STATE, scope="proj", principal="u1", withhold=withhold))
    finally:
        held.release.set()
    assert admission.calls == 1
    assert prepared.query.strategy is QueryStrategy.TASK_CONTEXT
    assert prepared.semantic.withheld_reason is WithheldReason.PREPARATION_BOUND
    again = await preparation.prepare(STATE, scope="proj", principal="u1")  # a later turn
    assert admission.calls == 2
    assert again.query.baseline_reason is BaselineReason.ADMISSION_WITHDRAWN


class SlowAdmission(Admission):
    """Admits, after ``delay`` seconds of (virtual) time: longer than the preparation bound."""

    def __init__(self, delay: float) -> None:
        super().__init__(True)
        self.delay = delay

    async def __call__(self, experiment: str) -> bool:
        self.calls += 1
        await anyio.sleep(self.delay)
        return True


async def test_a_plan_the_bound_cuts_is_the_baseline_and_asks_admission_once() -> None:
    # The bound (0.2 s) runs out while admission (0.4 s, under its own 0.5 s timeout) is
    # being asked: the round takes the baseline at once, as for an admission that did not
    # answer in time, instead of asking again and waiting outside the bound.
    admission = SlowAdmission(0.4)
    preparation = QueryPreparation(
        QueryPlanner(QueryStrategy.TASK_CONTEXT, admission, admission_timeout_s=0.5),
        HashingAdapter())
    bound = PreparationBound(0.2, ManualClock(wall=0.0, monotonic=0.0))
    started = anyio.current_time()
    prepared = await bound.prepare(lambda withhold: preparation.prepare(
        STATE, scope="proj", principal="u1", withhold=withhold))
    assert admission.calls == 1
    assert anyio.current_time() - started < 0.3
    assert prepared.query.baseline_reason is BaselineReason.ADMISSION_TIMEOUT
    assert prepared.query.fingerprint == compose_baseline(
        STATE, scope="proj", principal="u1").fingerprint
    assert prepared.recent_query.baseline_reason is BaselineReason.FROZEN_CONTROL
    assert prepared.semantic.withheld_reason is WithheldReason.PREPARATION_BOUND
