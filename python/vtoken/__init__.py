"""vtoken: Python access to the vToken workbench (docs/PYTHON.md).

Two halves:
  * the result reader, ``vtoken.load(db)``: runs / requests / steps of a result database as
    pandas DataFrames (lists of dicts without pandas), with ``vtoken-cli export``'s columns;
  * the core (bindings of lib/core), for people who run their own model loop:
    ``VirtualKvCache`` (token table + block pool: sync_new_tokens, evict_token, live_slots,
    begin_relocation / apply_moves / complete_relocation, stats), ``ReclaimPlanner`` (plan),
    the registered eviction policies (``policies()``, ``Policy(name, **params).score(signals,
    budget)``), ``Evictor`` (budget, protection and victims over a policy) and ``run_check``
    (the randomized check behind ``vtoken-cli check``).

Errors from the core are exceptions named after their Status code, all subclasses of
``VtokenError``: InvalidArgumentError (also a ValueError), NotFoundError (also a LookupError),
FailedPreconditionError, ResourceExhaustedError, DataLossError, InternalError.
"""

from vtoken._core import (  # noqa: F401
    DataLossError,
    Evictor,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    Policy,
    PolicyInfo,
    ReclaimPlan,
    ReclaimPlanner,
    Relocation,
    ResourceExhaustedError,
    SeqPlan,
    SeqRelocation,
    VirtualKvCache,
    VtokenError,
    policies,
    run_check,
    token_signals,
)
from vtoken.results import ResultDb, load, rouge_l_f1  # noqa: F401


def policy_names():
    """Names of the registered policies, sorted."""
    return [p.name for p in policies()]


def reclaim(cache, planner, copy):
    """One synchronous reclamation: plan, begin, copy, apply, complete.

    `copy(src, dst)` must copy the KV of every slot src[i] to dst[i] (int64 arrays) in every
    layer before it returns. Returns the relocation (empty when the plan was empty).
    """
    plan = planner.plan(cache)
    if not plan:
        return None
    rel = cache.begin_relocation(plan)
    copies = rel.copies()
    copy(copies[:, 0], copies[:, 1])
    for s in rel.seqs:
        cache.apply_moves(s.seq, s.moves, group=s.group)
    cache.complete_relocation(rel.id)
    return rel


__all__ = [name for name in dir() if not name.startswith("_")]
