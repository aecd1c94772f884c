"""litellm, given a wrapped client: ``acompletion(model="openai/...", client=wrapped)``.

litellm does not call ``chat.completions.create``: it posts the chat completion's body
through the client's own ``post("/chat/completions", ...)`` and asks for the raw
response. The wrapped client's ``post`` sends such a body through the coalescing
``create``, so these calls coalesce like the others. Structured output both ways
litellm asks it: ``response_format=Ticket`` (a ``json_schema``) and
``{"type": "json_object"}`` with the schema in the prompt.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from _integration import (
    ASYNCIO_ONLY,
    INSTRUCTIONS,
    OPENAI_MODEL,
    TICKETS,
    Ticket,
    assert_coalesced,
    expected_ticket,
    gather,
)

from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    ASYNCIO_ONLY,
    # litellm's own TypedDicts, as pydantic reads them on litellm's first call.
    pytest.mark.filterwarnings(
        "ignore:Item .* on TypedDict class .* is using the .ReadOnly. qualifier:UserWarning"
    ),
]

#: litellm's switches for its bundled cost map and beta headers (no fetch at import).
_OFFLINE = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
}

#: The schema spelled out for ``json_object``, which sends none.
JSON_OBJECT_INSTRUCTIONS = (
    f"{INSTRUCTIONS}\nAnswer with one JSON object valid against this JSON schema:"
    f" {json.dumps(Ticket.model_json_schema())}"
)


@pytest.fixture
def litellm(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in _OFFLINE.items():
        monkeypatch.setenv(name, value)
    return pytest.importorskip("litellm")


@pytest.mark.parametrize(
    ("response_format", "system"),
    [(Ticket, INSTRUCTIONS), ({"type": "json_object"}, JSON_OBJECT_INSTRUCTIONS)],
    ids=["json_schema", "json_object"],
)
async def test_acompletion_with_a_wrapped_client(
    sim: SimulatedProvider,
    openai_client: openai.AsyncOpenAI,
    litellm: Any,
    response_format: Any,
    system: str,
) -> None:
    async def one(ticket: str) -> Any:
        return await litellm.acompletion(
            model=f"openai/{OPENAI_MODEL}",
            client=openai_client,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": ticket}],
            response_format=response_format,
        )

    answers = await gather(one)
    assert all(type(answer) is litellm.ModelResponse for answer in answers)
    tickets = [Ticket.model_validate_json(a.choices[0].message.content) for a in answers]
    assert tickets == [expected_ticket(ticket) for ticket in TICKETS]
    assert_coalesced(sim)
