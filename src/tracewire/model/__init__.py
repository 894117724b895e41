"""Built-in model server: a tiny deterministic n-gram model behind an OpenAI/vLLM-style API.

It is the embedded default for tests and demos when no GPU server is given: a real
byte-level tokenizer, a documented chat template with tool calls, honest log-probabilities
and vLLM's token-id fields. It is not a useful assistant. See ``src/tracewire/model/README.md``.
"""

from ._cli import COMMAND
from ._engine import Engine, Generation, SamplingParams, get_engine
from ._foreign import ForeignModel, ForeignPlan
from ._policy import Policy
from ._protocol import MAX_MODEL_LEN, MODEL_NAME
from ._rescore import Rescored, rescore
from ._server import ModelServer, ServerThread
from ._template import ChatTemplate, ParsedTurn
from ._tokenizer import SPECIAL_TOKENS, Tokenizer, load_tokenizer

__all__ = [
    "COMMAND",
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "SPECIAL_TOKENS",
    "ChatTemplate",
    "Engine",
    "ForeignModel",
    "ForeignPlan",
    "Generation",
    "ModelServer",
    "ParsedTurn",
    "Policy",
    "Rescored",
    "SamplingParams",
    "ServerThread",
    "Tokenizer",
    "get_engine",
    "load_tokenizer",
    "render_chat",
    "rescore",
]


def render_chat(
    messages: list[dict[str, object]],
    tools: list[dict[str, object]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a conversation under the built-in model's chat template."""
    return ChatTemplate(load_tokenizer()).render(messages, tools, add_generation_prompt)
