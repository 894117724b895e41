"""Training samples from traces: compute → truncate → merge per branch, a safetensors
payload, and the HTTP session API (``/sessions``) with its client.

Layout: ``tokens``, ``loss_mask`` and ``logprobs`` of a :class:`Sample` cover the whole
sequence; the response region is ``[prompt_len:]`` (details: ``tracewire.samples._sample``).
"""

from ._builder import SampleBuilder, assemble
from ._codec import decode_samples, encode_samples, payload_meta
from ._hooks import Picker, Postprocess, default_picker, default_postprocess
from ._sample import Sample, status_of

__all__ = [
    "Picker",
    "Postprocess",
    "Sample",
    "SampleBuilder",
    "assemble",
    "decode_samples",
    "default_picker",
    "default_postprocess",
    "encode_samples",
    "payload_meta",
    "status_of",
]
