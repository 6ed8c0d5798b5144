"""The MiniLM adapter's reads: batches cut by length, and texts it has already read.

``python -m bench minilm`` (or ``python -m bench.bench_minilm --texts 400``). The texts are
the memories of ``examples/devset.jsonl`` (hand-written notes, 40 to 300 characters), repeated
in file order up to ``--texts``, each copy made distinct by a numbered prefix so no two are
alike. Three ways of reading them, each from a fresh adapter (an empty memo), timed
alternately over ``--rounds`` rounds:

- **file order**: batches of 32 in the order given, each padded to its longest text, as the
  adapter read them before it sorted them (the baseline);
- **by length**: :meth:`~plugin.memory.minilm_adapter.MiniLMAdapter.embed`, which sorts the
  texts by length and cuts them where padding would cost more than another call;
- **read again**: the same call on an adapter that has read them all (its memo answers).

Then what the recall hook embeds each turn: a working state's six fragments and the query that
joins them, in one padded batch (the baseline), through ``embed`` on the first turn, and on a
later turn with one fragment changed (and, for scale, through WordLlama where the ``semantic``
extra is installed). Reported: median milliseconds, per text, and the ratio
of each against its baseline. The vectors of the ways are checked equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt

from plugin.memory import minilm_adapter, wordllama_adapter
from plugin.memory.minilm_adapter import BATCH, MiniLMAdapter

FRAGMENTS = (
    "Continue",
    "Write the retry and alerting settings for the nightly export job",
    "Is the upload safe to retry after a partial transfer",
    "Exports must land before six in the morning",
    "Marta Kowal",
    "Move the invoice exports from cron to the scheduler",
)


def _texts(count: int) -> list[str]:
    path = Path(__file__).parent.parent / "examples" / "devset.jsonl"
    notes = [memory["text"]
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
             for memory in json.loads(line).get("memories", ())]
    return [f"{i}. {notes[i % len(notes)]}" for i in range(count)]


def _file_order(adapter: MiniLMAdapter, texts: list[str]) -> npt.NDArray[np.float32]:
    encoder = adapter._encoder
    out = []
    for start in range(0, len(texts), BATCH):
        encodings = encoder.encode_batch(texts[start : start + BATCH])
        out.append(adapter._run([e.ids for e in encodings]))
    return np.concatenate(out)


def _ms(call: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    call(*args)
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not minilm_adapter.available():
        print("the minilm extra is not installed: nothing to measure")
        return
    loaded = MiniLMAdapter.load()
    texts = _texts(args.texts)
    for checked in (texts, [" ".join(FRAGMENTS), *FRAGMENTS]):
        np.testing.assert_array_equal(_file_order(attrs.evolve(loaded), checked),
                                      attrs.evolve(loaded).embed(checked))
    warm = attrs.evolve(loaded)
    warm.embed(texts)
    times: dict[str, list[float]] = {"file order": [], "by length": [], "read again": []}
    for _ in range(args.rounds):
        times["file order"].append(_ms(_file_order, attrs.evolve(loaded), texts))
        times["by length"].append(_ms(attrs.evolve(loaded).embed, texts))
        times["read again"].append(_ms(warm.embed, texts))
    base = statistics.median(times["file order"])
    print(f"{len(texts)} notes, {args.rounds} rounds (median ms; per text; against file order)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<11} {median:9.1f} ms  {median / len(texts):7.3f} ms/text  "
              f"x{median / base:.3f}")
    query = " ".join(FRAGMENTS)
    turn: dict[str, list[float]] = {"one batch": [], "first turn": [], "later turn": []}
    for round_ in range(max(args.rounds, 5)):
        turn["one batch"].append(_ms(_file_order, attrs.evolve(loaded), [query, *FRAGMENTS]))
        adapter = attrs.evolve(loaded)
        turn["first turn"].append(_ms(adapter.embed, [query, *FRAGMENTS]))
        later = [*FRAGMENTS[:-1], f"Move the invoice exports, step {round_}"]
        turn["later turn"].append(_ms(adapter.embed, [" ".join(later), *later]))
    if wordllama_adapter.available():  # the lighter model, the same turn, for scale
        words = wordllama_adapter.WordLlamaAdapter.load()
        turn["WordLlama"] = [_ms(words.embed, [query, *FRAGMENTS])
                             for _ in range(max(args.rounds, 5))]
    first = statistics.median(turn["one batch"])
    print(f"a turn: the query and its {len(FRAGMENTS)} fragments (median ms; against one batch)")
    for name, values in turn.items():
        median = statistics.median(values)
        print(f"  {name:<11} {median:9.2f} ms  x{median / first:.3f}")


if __name__ == "__main__":
    main()
