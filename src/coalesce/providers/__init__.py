"""Providers: the one seam between coalesce and an LLM, and its implementations.

Importing this package imports neither the openai nor the anthropic SDK: each
provider imports its SDK only when it is used.
"""

from __future__ import annotations

from ._anthropic import AnthropicProvider
from ._base import Completion, CompletionRequest, Provider, RetryAdvice, Usage
from ._callable import CallableProvider
from ._http import OpenAICompatibleProvider
from ._openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "CallableProvider",
    "Completion",
    "CompletionRequest",
    "OpenAICompatibleProvider",
    "OpenAIProvider",
    "Provider",
    "RetryAdvice",
    "Usage",
]
