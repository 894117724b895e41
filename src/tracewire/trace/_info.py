"""The well-known keys of ``Trace.info`` and ``Episode.info``: written by one part, read by
others (declared once so a misspelling is a name error, not a silently missing figure)."""

from __future__ import annotations

from typing import Final

__all__ = ["InfoKey"]


class InfoKey:
    """Names of ``info`` entries more than one part reads; plain strings (not an enum), so
    the records keep the same bytes."""

    #: Token-in/token-out: turns whose ids the template re-render could not reproduce
    #: (on the trace; summed over traces on the episode, where the run index reads it).
    TITO_MISMATCH: Final = "tito_mismatch"
    #: Token-in/token-out: the session's report (bridges, re-renders, malformed calls).
    TITO: Final = "tito"
    #: Requests whose upstream ids did not extend the matched path (a new root branch).
    TOKEN_MISMATCHES: Final = "token_mismatches"
    #: Requests whose history was rewritten in place of a recorded branch.
    HISTORY_REWRITES: Final = "history_rewrites"
    #: On the episode: it did not finish (rebuilt from a journal, or a rollout the env
    #: server failed), so the index row's status is ``incomplete`` and ``--resume`` reruns it.
    INCOMPLETE: Final = "incomplete"
    #: Trainer bookkeeping on the episode: the training step and the policy's version.
    STEP: Final = "step"
    POLICY_VERSION: Final = "policy_version"
