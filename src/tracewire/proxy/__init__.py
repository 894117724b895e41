"""Interception proxy: token-exact capture of every agent turn into the session's trace.

Harnesses talk OpenAI chat completions, OpenAI Responses or Anthropic Messages to the proxy
with a per-rollout secret; the proxy calls one OpenAI-compatible upstream asking for token
ids and logprobs, relays the answer (streamed as it arrives), and commits each turn into
the session's :class:`~tracewire.trace.Trace` as described in docs/CONTRACTS.md.
"""

from ._cli import COMMAND, UpstreamOptions, proxy_command
from ._collector import SampleCollector
from ._config import ProxyConfig, RequestHook, ResponseHook
from ._server import Proxy
from ._session import Session, SessionRegistry
from ._session_api import SessionAPI, add_session_routes
from ._upstream_api import StreamChunk, TurnContext, Upstream, UpstreamReply, UpstreamRequest
from ._upstream_http import HttpUpstream
from ._upstream_mock import MockCall, MockResponse, MockUpstream

__all__ = [
    "COMMAND",
    "HttpUpstream",
    "MockCall",
    "MockResponse",
    "MockUpstream",
    "Proxy",
    "ProxyConfig",
    "RequestHook",
    "ResponseHook",
    "SampleCollector",
    "Session",
    "SessionAPI",
    "SessionRegistry",
    "StreamChunk",
    "TurnContext",
    "Upstream",
    "UpstreamOptions",
    "UpstreamReply",
    "UpstreamRequest",
    "add_session_routes",
    "proxy_command",
]
