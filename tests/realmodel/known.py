"""Known limitations the real-engine tests meet, each its own exception so an ``xfail`` can
expect exactly it (``raises=KNOWN``) while any other failure still fails the test. Each is
raised only after every other check of the test has passed."""

from __future__ import annotations


class LengthCutCloseCounted(AssertionError):
    """The mismatch report counted the close token a length-cut last turn never sampled
    (its canonical render closes the turn) as a ``special`` difference: a false positive of
    the report, not of the recording."""


KNOWN = (LengthCutCloseCounted,)
REASON = ("known: the mismatch report counts a length-cut last turn's missing close as a "
          "special difference; only that is expected, any other failure fails")
