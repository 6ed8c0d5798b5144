"""The bench's learned fusion (measured and not kept): its pool, its features, its fit and its
table, on the first scenarios of a blind hand-written set with the hashing embedding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench import learned_fusion
from bench.learned_fusion import Candidates
from plugin.evaluation import Evaluator
from plugin.evaluation.command import embedding_for
from plugin.evaluation.results import Cell

HARDER_B = Path(__file__).resolve().parents[1] / "examples" / "harder_b.jsonl"


def _first_lines(tmp_path: Path, name: str, start: int, stop: int) -> Path:
    lines = HARDER_B.read_text(encoding="utf-8").splitlines(keepends=True)[start:stop]
    path = tmp_path / name
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> list[Candidates]:
    path = _first_lines(tmp_path_factory.mktemp("learned"), "b.jsonl", 0, 4)
    cells = tuple(Cell("task_context", arm) for arm in learned_fusion.ARMS)
    evaluator = Evaluator(embedding=embedding_for("hashing"), cells=cells)
    return learned_fusion.collect(path, evaluator, list(learned_fusion.GROUPS))


def test_the_pool_is_the_union_of_the_arms_first_ten(pools: list[Candidates]) -> None:
    assert len(pools) == 4
    for pool in pools:
        expected = dict.fromkeys(
            i for arm in learned_fusion.ARMS for i in pool.ranked[arm][: learned_fusion.POOL])
        assert pool.ids == tuple(expected)
        assert pool.features.shape == (len(pool.ids), sum(learned_fusion.GROUPS.values()))
        ranks = pool.features[:, :3]
        for column, arm in enumerate(learned_fusion.ARMS):
            first = pool.ids.index(pool.ranked[arm][0])
            assert ranks[first, column] == 1.0
        assert 0.0 <= pool.ceiling() <= 1.0
        assert pool.recall(pool.ranked["fused"]) <= pool.ceiling()


def test_word_features_favour_the_rare_link_and_flag_a_next_action_echo() -> None:
    fields = [frozenset(), frozenset({"book", "visit"}), frozenset(), frozenset(),
              frozenset(), frozenset({"priya"})]
    idf = {"book": 0.2, "visit": 0.3, "priya": 0.9}
    echo = learned_fusion.word_features(frozenset({"book", "visit", "boiler"}), fields, idf)
    link = learned_fusion.word_features(frozenset({"priya", "thursday"}), fields, idf)
    assert echo[3] == 1.0 and link[3] == 0.0
    assert link[0] == 0.9 and echo[0] == 0.3
    assert math.isclose(echo[1], 0.5 / 3)
    assert echo[2] == link[2] == 1 / 6


def test_the_fit_weighs_the_feature_that_separates_the_needed_memories() -> None:
    rng = np.random.default_rng(7)
    made = []
    for n in range(12):
        ids = tuple(f"m{n}-{i}" for i in range(8))
        features = np.column_stack([rng.normal(size=8), np.zeros(8)])
        features[:2, 1] = 1.0
        made.append(Candidates("continuation", ids, features, frozenset(ids[:2]), {}))
    weights = learned_fusion.fit(made)
    assert weights[1] > 0 and weights[1] > 3 * abs(weights[0])
    for pool in made:
        assert set(learned_fusion.learned_ranking(pool, weights)[:2]) == pool.needed


def test_the_command_prints_the_weights_and_a_row_per_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _first_lines(tmp_path, "train.jsonl", 0, 3)
    test = _first_lines(tmp_path, "test.jsonl", 3, 5)
    assert learned_fusion.main(["--train", str(train), "--test", str(test),
                                "--features", "ranks,words", "--semantic", "hashing"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("features ranks,words; weights [")
    assert len(lines[0].split("[")[1].split(",")) == 7
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"train.jsonl", "test.jsonl"}
    assert rows["train.jsonl"][1] == "(train)" and rows["test.jsonl"][1] == "continuation"
    learned, ceiling = (float(value) for value in rows["test.jsonl"][-2:])
    assert learned <= ceiling


def test_an_unknown_feature_group_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as raised:
        learned_fusion.main(["--train", str(tmp_path / "x.jsonl"), "--features", "ranks,idf"])
    assert raised.value.code == 2
