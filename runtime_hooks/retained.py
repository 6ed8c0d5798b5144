"""The re-check of evidence a run retained from its deliberate searches.

Not a search: it takes no slot, so it stays available when the allowance is spent. It has its
own bound, kept with the run in the ledger (a resume or another hooks object cannot reset it),
and a round's length in time: a re-read that never returns is cancelled at the policy's
``deadline_s`` and its ids are ``failed``.
The retriever's re-read runs contained (:func:`plugin.memory.enforce.contained`) and is admitted
like a search's evidence: another principal's or scope's item is not ``valid``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from plugin.control import Ledger, Validity, validate
from plugin.control.logs import log_event
from plugin.errors import RetrieverFailedError
from plugin.memory.enforce import admit, contained_within
from plugin.memory.protocol import ContextCaps, Retriever
from plugin.memory.store import Evidence

from .results import Validation

_log = logging.getLogger("recallbound.hooks")


async def revalidate_retained(
    ledger: Ledger,
    retriever: Retriever,
    evidence_ids: Sequence[str],
    *,
    run_id: str,
    scope: str,
    principal: str,
    limit: int,
    within_s: float,
    caps: ContextCaps,
) -> list[Validation]:
    """One :class:`Validation` per distinct id, in order (see the module docstring). An id that
    is not a valid id was never retained (only valid ids are): ``not_retained``, without asking
    the ledger. A re-read still running after ``within_s`` seconds is cancelled: its ids are
    ``failed``, as when the retriever fails. As with a search's, only the first
    ``caps.examined`` items read are looked at, each text cut to what ``caps`` could render."""
    ids = list(dict.fromkeys(evidence_ids))
    storable = [i for i in ids if validate.is_identifier(i)]
    verdicts = await ledger.take_validations(run_id, storable, limit=limit) if storable else {}
    to_read = [i for i in ids if verdicts.get(i) is Validity.GRANTED]
    found: dict[str, Evidence] | None = {}
    if to_read:
        try:
            read = await contained_within(
                lambda: retriever.revalidate(to_read, principal=principal, scope=scope), within_s)
            admitted, _ = admit(read, principal=principal, scope=scope, run_id=run_id,
                                what="revalidate", caps=caps)
            found = {item.id: item for item in admitted}
        except RetrieverFailedError as exc:
            log_event(_log, logging.WARNING, "revalidate.retriever_failed", run_id=run_id,
                      reason=exc.reason)
            found = None
    answers: list[Validation] = []
    for evidence_id in ids:
        verdict = verdicts.get(evidence_id, Validity.NOT_RETAINED)
        if verdict is Validity.GRANTED:
            if found is None:
                answers.append(Validation(evidence_id=evidence_id, status="failed"))
                continue
            item = found.get(evidence_id)
            answers.append(Validation(evidence_id=evidence_id,
                                      status="valid" if item else "gone", evidence=item))
        elif verdict is Validity.BOUNDED:
            answers.append(Validation(evidence_id=evidence_id, status="bounded"))
        else:
            answers.append(Validation(evidence_id=evidence_id, status="not_retained"))
    return answers
