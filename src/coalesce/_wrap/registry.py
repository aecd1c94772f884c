"""Which :class:`~.translator.Translator` serves which SDK method.

One table per SDK, keyed by the method's attribute path on the client. The client
intercepts exactly these paths (those the installed SDK has) and leaves every other
attribute to the SDK. A new SDK method (``responses.create``, a ``with_raw_response``
path) is a new translator module and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .anthropic_messages import AnthropicMessagesCreate
from .anthropic_parse import AnthropicMessagesParse
from .openai_chat import OpenAIChatCreate
from .openai_parse import OpenAIChatParse
from .translator import Translator

__all__ = ["TRANSLATORS"]

_openai_create, _openai_parse = OpenAIChatCreate(), OpenAIChatParse()

#: ``TRANSLATORS[sdk][path]``: the translator of the method at ``client.<path>``, for
#: ``sdk`` ``"openai"`` or ``"anthropic"``.
TRANSLATORS: Mapping[str, Mapping[str, Translator]] = MappingProxyType(
    {
        "openai": MappingProxyType(
            {
                "chat.completions.create": _openai_create,
                "chat.completions.parse": _openai_parse,
                # The SDK's older home of parse(): the same methods.
                "beta.chat.completions.create": _openai_create,
                "beta.chat.completions.parse": _openai_parse,
            }
        ),
        "anthropic": MappingProxyType(
            {
                "messages.create": AnthropicMessagesCreate(),
                "messages.parse": AnthropicMessagesParse(),
            }
        ),
    }
)
