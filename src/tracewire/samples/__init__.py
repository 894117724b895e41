"""Training samples from traces: compute → truncate → merge per branch, a safetensors
payload, and the HTTP session API (``/sessions``) with its client.

Layout: ``tokens``, ``loss_mask`` and ``logprobs`` of a :class:`Sample` cover the whole
sequence; the response region is ``[prompt_len:]`` (details: ``tracewire.samples._sample``,
payload: ``tracewire.samples._codec``, HTTP: ``tracewire.samples._routes``).
"""

from ._assemble import assemble
from ._builder import SampleBuilder
from ._client import SessionClient, SessionInfo, SyncSessionClient, to_torch
from ._codec import decode_samples, encode_samples, payload_meta
from ._hooks import Picker, Postprocess, default_picker, default_postprocess
from ._routes import SessionAPI, add_session_routes
from ._sample import Sample, status_of

__all__ = [
    "Picker",
    "Postprocess",
    "Sample",
    "SampleBuilder",
    "SessionAPI",
    "SessionClient",
    "SessionInfo",
    "SyncSessionClient",
    "add_session_routes",
    "assemble",
    "decode_samples",
    "default_picker",
    "default_postprocess",
    "encode_samples",
    "payload_meta",
    "status_of",
    "to_torch",
]
