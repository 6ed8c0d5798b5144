"""The reference memory store: memories, People and beliefs, corrections and sources on SQLite.

Split by the question each part answers: :mod:`.database` (how it opens and talks to SQLite),
:mod:`.schema` (what the file holds), :mod:`.values` (what goes in and comes out, and how it is
checked), :mod:`.errors` (what can go wrong), :mod:`.writes` (how things get in),
:mod:`.lookups` (reads by key or time), :mod:`.sparse_index` (one term index for every
cell, and bm25 with each cell's own statistics), :mod:`.search` (the sparse and semantic arms) and
:mod:`.memory_store` (the one object callers use). Every read takes the trusted ``principal``
and ``scope`` and filters by both inside its query.
"""

from .errors import InvalidMemoryError as InvalidMemoryError
from .errors import MemoryConflictError as MemoryConflictError
from .errors import MemoryIdTakenError as MemoryIdTakenError
from .errors import MemoryOwnershipError as MemoryOwnershipError
from .errors import MemoryStoreClosedError as MemoryStoreClosedError
from .errors import MemoryStoreCorruptError as MemoryStoreCorruptError
from .errors import MemoryStoreLockedError as MemoryStoreLockedError
from .errors import MemoryStorePathError as MemoryStorePathError
from .memory_store import MemoryStore as MemoryStore
from .schema import SCHEMA_VERSION as SCHEMA_VERSION
from .values import Arm as Arm
from .values import Evidence as Evidence
from .values import EvidenceKind as EvidenceKind
from .values import MemoryRecord as MemoryRecord
from .values import MemoryWrite as MemoryWrite
from .values import Person as Person
from .words import WordQuery as WordQuery

__all__ = [
    "SCHEMA_VERSION",
    "Arm",
    "Evidence",
    "EvidenceKind",
    "InvalidMemoryError",
    "MemoryConflictError",
    "MemoryIdTakenError",
    "MemoryOwnershipError",
    "MemoryRecord",
    "MemoryStore",
    "MemoryStoreClosedError",
    "MemoryStoreCorruptError",
    "MemoryStoreLockedError",
    "MemoryStorePathError",
    "MemoryWrite",
    "Person",
    "WordQuery",
]
