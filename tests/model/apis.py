"""The token-in APIs the built-in model serves: all of tito's but llama.cpp's native
``/completion``, which llama-server itself serves (tests/realmodel)."""

from tracewire.tito.codecs import UpstreamApi

SERVED_APIS = [a for a in UpstreamApi if a is not UpstreamApi.LLAMACPP]
