"""Known limitations the real-engine tests meet, each its own exception so an ``xfail`` can
expect exactly it (``raises=KNOWN``) while any other failure still fails the test. Each is
raised only after every other check of the test has passed."""

from __future__ import annotations


class LengthCutCloseCounted(AssertionError):
    """The mismatch report counted the close token a length-cut last turn never sampled
    (its canonical render closes the turn) as a ``special`` difference: a false positive of
    the report, not of the recording."""


class StreamWithheldRefused(AssertionError):
    """llama-server's stream never sends the id of a token that ends inside a multi-byte
    character (it sends only the next one's), so the proxy refused that streamed answer
    (a 502 and a recorded failed call) instead of recording guessed ids."""


KNOWN = (LengthCutCloseCounted, StreamWithheldRefused)
REASON = ("known: the mismatch report counts a length-cut last turn's missing close; "
          "llama-server streams lose ids of split multi-byte characters (refused). Only "
          "these are expected; any other failure fails")
