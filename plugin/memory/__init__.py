"""The memory composition layer: query planning, the search pipeline, the reference store.

Importing it does not import an embedding model (WordLlama is the optional ``semantic`` extra).
"""

from .compose import compose_baseline as compose_baseline
from .compose import compose_search_call as compose_search_call
from .compose import compose_task_context as compose_task_context
from .embedding import EmbeddingAdapter as EmbeddingAdapter
from .pipeline import MemoryRetriever as MemoryRetriever
from .planning import QueryPlanner as QueryPlanner
from .preparation import PreparationBound as PreparationBound
from .preparation import PreparedRecall as PreparedRecall
from .preparation import QueryPreparation as QueryPreparation
from .preparation import RecallPreparer as RecallPreparer
from .preparation import SemanticPreparation as SemanticPreparation
from .preparation import WithheldReason as WithheldReason
from .process import ProcessRetriever as ProcessRetriever
from .protocol import AttemptHandle as AttemptHandle
from .protocol import Bounded as Bounded
from .protocol import ContextCaps as ContextCaps
from .protocol import Found as Found
from .protocol import NestedRead as NestedRead
from .protocol import Retriever as Retriever
from .query import BaselineReason as BaselineReason
from .query import QueryStrategy as QueryStrategy
from .query import RecallQuery as RecallQuery
from .simple import SearchRequest as SearchRequest
from .simple import SimpleRetriever as SimpleRetriever
from .state import Fact as Fact
from .state import Task as Task
from .state import WorkingState as WorkingState
from .store import Evidence as Evidence
from .store import MemoryRecord as MemoryRecord
from .store import MemoryStore as MemoryStore
from .store import MemoryWrite as MemoryWrite
from .store import Person as Person

__all__ = [
    "ProcessRetriever",
    "AttemptHandle", "BaselineReason", "Bounded", "ContextCaps", "EmbeddingAdapter", "Evidence",
    "Fact", "Found", "MemoryRecord", "NestedRead", "PreparationBound", "SearchRequest",
    "SimpleRetriever",
    "MemoryRetriever", "MemoryStore", "MemoryWrite", "Person", "PreparedRecall", "QueryPlanner",
    "QueryPreparation", "QueryStrategy", "RecallPreparer", "RecallQuery", "Retriever",
    "SemanticPreparation", "Task", "WithheldReason", "WorkingState",
    "compose_baseline", "compose_search_call", "compose_task_context",
]
