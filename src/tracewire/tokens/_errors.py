"""Errors of loading a tokenizer and rendering its chat template, under the one error tree."""

from __future__ import annotations

from .._errors import ProxyError, TracewireError

__all__ = ["TemplateError", "TitoUnavailableError"]


class TitoUnavailableError(TracewireError, ImportError):
    """The optional ``tracewire[tito]`` extra (transformers, tokenizers, jinja2) is missing."""


class TemplateError(ProxyError, ValueError):
    """A tokenizer directory cannot be loaded, or its chat template fails to render."""

    status = 400
