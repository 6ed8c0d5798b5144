"""The isolated evaluator: each query planning strategy on each candidate arm, one allowance.

``python -m plugin.evaluation --scenarios examples/scenarios.jsonl --out DIR`` (the same
command as ``recallbound evaluate``) prints the report tables and writes the report into
``DIR``. This package builds on :mod:`plugin.memory` and :mod:`plugin.control` only, never on
``runtime_hooks``.
"""

from .evaluator import DEFAULT_CELLS as DEFAULT_CELLS
from .evaluator import HOOKS_CELLS as HOOKS_CELLS
from .evaluator import Arm as Arm
from .evaluator import Cell as Cell
from .evaluator import CellMetrics as CellMetrics
from .evaluator import Evaluator as Evaluator
from .evaluator import Report as Report
from .evaluator import ScenarioResult as ScenarioResult
from .evaluator import default_embedding as default_embedding
from .evaluator import evaluate_file as evaluate_file
from .evaluator import hashing_embedding as hashing_embedding
from .evaluator import seed_store as seed_store
from .scenarios import InvalidScenarioError as InvalidScenarioError
from .scenarios import Scenario as Scenario
from .scenarios import ScenarioBelief as ScenarioBelief
from .scenarios import ScenarioCorpus as ScenarioCorpus
from .scenarios import ScenarioCorrection as ScenarioCorrection
from .scenarios import ScenarioMemory as ScenarioMemory
from .scenarios import ScenarioPerson as ScenarioPerson
from .scenarios import iter_scenarios as iter_scenarios
from .scenarios import load_scenarios as load_scenarios
from .scenarios import parse_scenarios as parse_scenarios
from .scenarios import stream_scenarios as stream_scenarios

__all__ = [
    "DEFAULT_CELLS", "Arm", "Cell", "CellMetrics", "Evaluator", "InvalidScenarioError", "Report",
    "Scenario", "ScenarioBelief", "ScenarioCorpus", "ScenarioCorrection", "ScenarioMemory",
    "ScenarioPerson", "ScenarioResult", "HOOKS_CELLS",
    "default_embedding", "evaluate_file", "seed_store", "hashing_embedding", "iter_scenarios",
    "load_scenarios", "parse_scenarios", "stream_scenarios",
]
