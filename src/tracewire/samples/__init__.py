"""Training samples from traces: compute → truncate → merge per branch, and a safetensors
payload. Importable by a trainer without the proxy or aiohttp.

Layout: ``tokens``, ``loss_mask`` and ``logprobs`` of a :class:`Sample` cover the whole
sequence; the response region is ``[prompt_len:]`` (details: ``tracewire.samples._sample``,
payload: ``tracewire.samples._codec``). The session API that serves them over HTTP is the
proxy's (``tracewire.proxy``); its client is ``tracewire.sessions.SessionClient``.
"""

from ._assemble import assemble
from ._builder import SampleBuilder
from ._codec import decode_samples, encode_parts, encode_samples, payload_meta
from ._hooks import Picker, Postprocess, default_picker, default_postprocess, hook_name
from ._sample import Sample, SampleStatus, status_of
from ._torch import to_torch

__all__ = [
    "Picker",
    "Postprocess",
    "Sample",
    "SampleBuilder",
    "SampleStatus",
    "assemble",
    "decode_samples",
    "default_picker",
    "default_postprocess",
    "encode_parts",
    "encode_samples",
    "hook_name",
    "payload_meta",
    "status_of",
    "to_torch",
]
