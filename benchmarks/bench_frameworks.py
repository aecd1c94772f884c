"""Issue 22's table: 40 concurrent calls through each framework, with and without coalesce.

Every framework path of issue 22 (instructor, pydantic-ai, LangChain, the OpenAI Agents
SDK; OpenAI chat, the Responses API and Anthropic messages) sends the task of the
integration tests (``tests/integrations/_integration.py``: a support ticket -> its
category and urgency, ~600 tokens of shared instructions) for 40 different tickets at
once, twice: given the plain SDK client (the baseline), and given
``coalesce.wrap(client, latency_budget=2.0, max_items=20)``.

For each run it prints the HTTP requests that reached the server (counted by an event
hook on the SDK client's own ``httpx2`` client, so the SDK's and the frameworks' retries
count too; against the simulator, checked against the simulator's own record), the items
in each request (the tickets found in its body), how many callers got a well-formed
answer of the path's own type, how many got the right one (against the simulator only:
its answers are known), the errors, the framework's result type and the wall time.

Servers:

* default: the simulated provider (``coalesce.testing.SimulatedProvider``) over HTTP in
  a background thread, OpenAI and Anthropic APIs, every answer known;
* ``--url URL``: any OpenAI-compatible server (``.../v1``); ``--anthropic-url ROOT``
  adds the Anthropic paths (the SDK appends ``/v1/messages``), else they are skipped;
* ``--llama``: llama.cpp's server (``xllamacpp``) with SmolLM2-135M-Instruct, started
  as the slow tests start it (``tests/_llama.py``), ``--llama-parallel`` slots of
  ``--llama-slot-ctx`` tokens each; it serves chat, ``/v1/responses`` and
  ``/v1/messages``.

Run: ``python benchmarks/bench_frameworks.py [--paths instructor,agents] [--calls 40]
[--budget 2.0] [--skip-plain]``; progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx2
import openai

import coalesce

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integrations"))
sys.path.insert(0, str(ROOT / "tests"))

from _integration import (  # noqa: E402  (the tests' task, shared on purpose)
    INSTRUCTIONS,
    MAX_TOKENS,
    TICKETS,
    Ticket,
    expected_text,
    expected_ticket,
)

_TICKET_NUMBER = re.compile(r"Ticket (1\d{3}):")

#: What instructor's MD_JSON mode appends to the user message (instructor 1.17).
MD_JSON_REQUEST = "Return the correct JSON response within a ```json codeblock. not the JSON_SCHEMA"
#: A model to which pydantic-ai sends its whole output limit as max_tokens (64,000).
DEFAULTS_MODEL = "claude-haiku-4-5"
#: Public output limits and context windows of the models the paths use.
OUTPUT_LIMITS = {"gpt-4o-mini": 16_384, "claude-3-5-haiku-latest": 8_192, DEFAULTS_MODEL: 64_000}
WINDOWS = {"gpt-4o-mini": 128_000, "claude-3-5-haiku-latest": 200_000, DEFAULTS_MODEL: 200_000}


# -- the server's side: what reached it --------------------------------------------------


@dataclass
class Counter:
    """Every HTTP request an SDK client sent: its path and the tickets in its body."""

    sent: list[tuple[str, int]] = field(default_factory=list)

    async def hook(self, request: httpx2.Request) -> None:
        body = request.content.decode("utf-8", errors="replace")
        self.sent.append((request.url.path, len(set(_TICKET_NUMBER.findall(body)))))

    def http_client(self, sdk: Any) -> Any:
        """The SDK's own default ``httpx2`` client, with this counter's hook."""
        return sdk.DefaultAsyncHttpxClient(event_hooks={"request": [self.hook]})


@dataclass(frozen=True)
class Server:
    """Where the clients go: OpenAI base URL (``.../v1``), Anthropic root or ``None``."""

    openai_url: str
    anthropic_url: str | None
    model: str
    anthropic_model: str
    sim: Any = None  # the SimulatedProvider when it is the server: its answers are known

    def openai(self, counter: Counter) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.openai_url,
            api_key="sk-bench",
            http_client=counter.http_client(openai),
        )

    def anthropic(self, counter: Counter) -> anthropic.AsyncAnthropic:
        assert self.anthropic_url is not None
        return anthropic.AsyncAnthropic(
            base_url=self.anthropic_url,
            api_key="sk-ant-bench",
            http_client=counter.http_client(anthropic),
        )


# -- the paths ----------------------------------------------------------------------------

Call = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One framework path: which SDK it is given, how one call is made, what it returns.

    ``build(client, server)`` returns the call; ``answer(result)`` extracts the answer
    (a ``Ticket``, or the text for a plain-text path); ``describe(result)`` names the
    framework's result type.
    """

    name: str
    sdk: str  # "openai" or "anthropic"
    build: Callable[[Any, Server], Call]
    answer: Callable[[Any], Any] = lambda result: result
    describe: Callable[[Any], str] = lambda result: type(result).__name__
    text: bool = False  # the answer is plain text, not a Ticket
    # What the simulator reads as the item, when the framework adds to the ticket.
    asked: Callable[[str], str] = lambda ticket: ticket


def _messages(ticket: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ticket}]


def _instructor_openai(mode_name: str) -> Callable[[Any, Server], Call]:
    def build(client: Any, server: Server) -> Call:
        import instructor

        patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode_name))

        async def call(ticket: str) -> Any:
            return await patched.chat.completions.create(
                model=server.model, response_model=Ticket, messages=_messages(ticket)
            )

        return call

    return build


def _instructor_anthropic(client: Any, server: Server) -> Call:
    import instructor

    patched = instructor.from_anthropic(client)

    async def call(ticket: str) -> Any:
        return await patched.messages.create(
            model=server.anthropic_model,
            max_tokens=MAX_TOKENS,
            system=INSTRUCTIONS,
            response_model=Ticket,
            messages=[{"role": "user", "content": ticket}],
        )

    return call


def _pydantic_ai(kind: str) -> Callable[[Any, Server], Call]:
    def build(client: Any, server: Server) -> Call:
        from pydantic_ai import Agent, NativeOutput, PromptedOutput, ToolOutput
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.anthropic import AnthropicProvider
        from pydantic_ai.providers.openai import OpenAIProvider

        output: Any = Ticket
        model: Any
        if kind.startswith("anthropic"):
            # "anthropic-4-5": Haiku 4.5, to which pydantic-ai sends max_tokens=64,000.
            name = DEFAULTS_MODEL if kind.endswith("4-5") else server.anthropic_model
            provider: Any = AnthropicProvider(anthropic_client=client)
            model = AnthropicModel(name, provider=provider)
            output = NativeOutput(Ticket) if "native" in kind else Ticket
        elif kind.startswith("responses"):
            model = OpenAIResponsesModel(
                server.model, provider=OpenAIProvider(openai_client=client)
            )
            output = PromptedOutput(Ticket) if kind.endswith("prompted") else Ticket
        else:
            model = OpenAIChatModel(server.model, provider=OpenAIProvider(openai_client=client))
            kinds = {"tool": ToolOutput, "native": NativeOutput, "prompted": PromptedOutput}
            output = kinds[kind](Ticket)
        agent = Agent(model, output_type=output, instructions=INSTRUCTIONS)
        return agent.run

    return build


def _chat_openai(client: Any, server: Server, **options: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=server.model,
        api_key="sk-bench",
        base_url=server.openai_url,
        root_async_client=client,
        async_client=client.chat.completions,
        **options,
    )


def _lc_messages(ticket: str) -> list[tuple[str, str]]:
    return [("system", INSTRUCTIONS), ("human", ticket)]


def _langchain_ainvoke(client: Any, server: Server) -> Call:
    # A cap, as the Anthropic paths have: a small model's free text may not stop.
    llm = _chat_openai(client, server, max_tokens=MAX_TOKENS)
    return lambda ticket: llm.ainvoke(_lc_messages(ticket))


def _langchain_structured(use_responses_api: bool) -> Callable[[Any, Server], Call]:
    def build(client: Any, server: Server) -> Call:
        llm = _chat_openai(client, server, use_responses_api=use_responses_api)
        structured = llm.with_structured_output(Ticket)
        return lambda ticket: structured.ainvoke(_lc_messages(ticket))

    return build


def _langchain_json_mode(client: Any, server: Server) -> Call:
    llm = _chat_openai(client, server)
    structured = llm.with_structured_output(Ticket, method="json_mode")
    # json_mode spells out no schema: the prompt does, as LangChain's docs show.
    schema = json.dumps(Ticket.model_json_schema())

    def messages(ticket: str) -> list[tuple[str, str]]:
        system = f"{INSTRUCTIONS}\nAnswer in JSON matching this schema: {schema}"
        return [("system", system), ("human", ticket)]

    return lambda ticket: structured.ainvoke(messages(ticket))


def _langchain_astream(client: Any, server: Server) -> Call:
    llm = _chat_openai(client, server)
    structured = llm.with_structured_output(Ticket, method="json_schema")

    async def call(ticket: str) -> Any:
        last = None
        async for chunk in structured.astream(_lc_messages(ticket)):
            last = chunk
        return last

    return call


def _litellm(client: Any, server: Server) -> Call:
    import litellm

    async def call(ticket: str) -> Any:
        reply = await litellm.acompletion(
            model=f"openai/{server.model}",
            messages=_messages(ticket),
            response_format=Ticket,
            client=client,
            api_key="sk-bench",
            base_url=server.openai_url,
        )
        return Ticket.model_validate_json(reply.choices[0].message.content)

    return call


def _langchain_anthropic(client: Any, server: Server) -> Call:
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(  # type: ignore[call-arg]
        model_name=server.anthropic_model,
        api_key="sk-ant-bench",
        base_url=server.anthropic_url,
        max_tokens=MAX_TOKENS,
        timeout=None,
        stop=None,
    )
    llm.__dict__["_async_client"] = client  # ChatAnthropic takes no client: fill its cache
    structured = llm.with_structured_output(Ticket)
    return lambda ticket: structured.ainvoke(_lc_messages(ticket))


def _agents(api: str) -> Callable[[Any, Server], Call]:
    def build(client: Any, server: Server) -> Call:
        from agents import (
            Agent,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
            Runner,
            set_tracing_disabled,
        )

        set_tracing_disabled(True)  # tracing would export to OpenAI
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        model = kind(server.model, openai_client=client)
        agent = Agent(name="triage", instructions=INSTRUCTIONS, model=model, output_type=Ticket)
        return lambda ticket: Runner.run(agent, ticket)

    return build


def _of(attribute: str) -> Callable[[Any], Any]:
    return lambda result: getattr(result, attribute)


def _wrapper(attribute: str) -> Callable[[Any], str]:
    return lambda result: f"{type(result).__name__}[{type(getattr(result, attribute)).__name__}]"


def _ai_message_text(message: Any) -> Any:
    return message.content if isinstance(message.content, str) else None


PATHS = (
    Route("instructor from_openai TOOLS", "openai", _instructor_openai("TOOLS")),
    *(
        Route(f"instructor from_openai {mode}", "openai", _instructor_openai(mode))
        for mode in ("JSON_SCHEMA", "JSON")
    ),
    Route(
        "instructor from_openai MD_JSON",
        "openai",
        _instructor_openai("MD_JSON"),
        asked=lambda ticket: f"{ticket}\n\n{MD_JSON_REQUEST}",
    ),
    Route("instructor from_anthropic", "anthropic", _instructor_anthropic),
    *(
        Route(f"pydantic-ai {name}", sdk, _pydantic_ai(kind), _of("output"), _wrapper("output"))
        for name, sdk, kind in (
            ("OpenAIResponsesModel", "openai", "responses"),
            ("OpenAIResponsesModel PromptedOutput", "openai", "responses-prompted"),
            ("OpenAIChatModel ToolOutput", "openai", "tool"),
            ("OpenAIChatModel NativeOutput", "openai", "native"),
            ("OpenAIChatModel PromptedOutput", "openai", "prompted"),
            ("AnthropicModel", "anthropic", "anthropic"),
            (f"AnthropicModel {DEFAULTS_MODEL} (its max_tokens)", "anthropic", "anthropic-4-5"),
            (
                f"AnthropicModel {DEFAULTS_MODEL} NativeOutput (its max_tokens)",
                "anthropic",
                "anthropic-native-4-5",
            ),
        )
    ),
    Route(
        "LangChain ChatOpenAI.ainvoke (text)",
        "openai",
        _langchain_ainvoke,
        _ai_message_text,
        text=True,
    ),
    Route("LangChain with_structured_output (chat)", "openai", _langchain_structured(False)),
    Route("LangChain with_structured_output (responses)", "openai", _langchain_structured(True)),
    Route("LangChain with_structured_output json_mode", "openai", _langchain_json_mode),
    Route("LangChain with_structured_output json_schema astream", "openai", _langchain_astream),
    Route("litellm acompletion(client=wrapped)", "openai", _litellm),
    Route("LangChain ChatAnthropic with_structured_output", "anthropic", _langchain_anthropic),
    *(
        Route(
            f"Agents SDK {api}",
            "openai",
            _agents(api),
            _of("final_output"),
            _wrapper("final_output"),
        )
        for api in ("responses", "chat_completions")
    ),
)


# -- one run: 40 calls through one path, plain or wrapped -----------------------------


@dataclass
class Row:
    """What one run of one path produced."""

    path: str
    wrapped: bool
    results: list[Any]
    errors: collections.Counter[str]
    sent: list[tuple[str, int]]
    seconds: float
    sim_requests: int | None = None
    latencies: list[float] = field(default_factory=list)  # each call's, sorted


async def _gather(
    call: Call, tickets: tuple[str, ...], limit: float, latencies: list[float]
) -> list[Any]:
    """``call(ticket)`` for every ticket at once; each result or its exception, in order."""
    results: list[Any] = [None] * len(tickets)

    async def one(index: int) -> None:
        started = time.perf_counter()
        try:
            with anyio.fail_after(limit):
                results[index] = await call(tickets[index])
        except Exception as exc:
            results[index] = exc
        latencies.append(time.perf_counter() - started)

    async with anyio.create_task_group() as group:
        for index in range(len(tickets)):
            group.start_soon(one, index)
    return results


def _client_for(path: Route, server: Server, counter: Counter, options: argparse.Namespace) -> Any:
    raw = server.openai(counter) if path.sdk == "openai" else server.anthropic(counter)
    if not options.wrapped:
        return raw
    return coalesce.wrap(raw, latency_budget=options.budget, max_items=options.max_items)


async def run_path(path: Route, server: Server, options: argparse.Namespace) -> Row:
    if server.sim is not None:
        server.sim.reset()
    counter = Counter()
    tickets = TICKETS[: options.calls]
    client = _client_for(path, server, counter, options)
    latencies: list[float] = []
    async with client:
        call = path.build(client, server)  # before the clock: it imports the framework
        started = time.perf_counter()
        results = await _gather(call, tickets, options.call_timeout, latencies)
        seconds = time.perf_counter() - started
    errors = collections.Counter(type(r).__name__ for r in results if isinstance(r, Exception))
    sim_requests = len(server.sim.requests) if server.sim is not None else None
    row = Row(path.name, options.wrapped, results, errors, counter.sent, seconds, sim_requests)
    row.latencies = sorted(latencies)
    return row


# -- the table ------------------------------------------------------------------------------


def _items(sent: list[tuple[str, int]]) -> str:
    """Items per request, the largest first: ``20, 20`` or ``1 x40``."""
    counts = sorted((items for _, items in sent), reverse=True)
    if len(counts) <= 10:
        return ", ".join(map(str, counts)) or "-"
    tally = collections.Counter(counts)
    return ", ".join(f"{items} x{n}" for items, n in sorted(tally.items(), reverse=True))


def _answers(path: Route, results: list[Any]) -> list[Any]:
    """Each caller's answer, or ``None`` when it got none of the path's own type."""
    answers = []
    for result in results:
        try:
            answer = None if isinstance(result, Exception) else path.answer(result)
        except Exception:
            answer = None
        well_formed = (
            isinstance(answer, str) and answer if path.text else isinstance(answer, Ticket)
        )
        answers.append(answer if well_formed else None)
    return answers


def _right(path: Route, answers: list[Any], server: Server) -> str:
    if server.sim is None:
        return "-"
    expect = expected_text if path.text else expected_ticket
    tickets = TICKETS[: len(answers)]
    right = 0
    for answer, given in zip(answers, tickets, strict=True):
        ticket = path.asked(given)
        if path.text:
            right += answer == expect(ticket)
        else:  # instructor answers with its own subclass of Ticket: compare the fields
            right += answer is not None and answer.model_dump() == expect(ticket).model_dump()
    return str(right)


def _types(path: Route, results: list[Any]) -> str:
    names = collections.Counter(path.describe(r) for r in results if not isinstance(r, Exception))
    return ", ".join(sorted(names)) or "-"


def _requests(row: Row) -> str:
    shown = str(len(row.sent))
    if row.sim_requests is not None and row.sim_requests != len(row.sent):
        shown += f" (simulator: {row.sim_requests})"
    apis = collections.Counter(p.rsplit("/", 1)[-1] for p, _ in row.sent)
    return shown + " " + "/".join(sorted(apis)) if len(apis) > 1 else shown


def table_line(path: Route, row: Row, server: Server) -> str:
    answers = _answers(path, row.results)
    errors = ", ".join(f"{n} {name}" for name, n in row.errors.most_common()) or "0"
    cells = (
        path.name,
        "wrap" if row.wrapped else "plain",
        _requests(row),
        _items(row.sent),
        f"{sum(a is not None for a in answers)}/{len(answers)}",
        _right(path, answers, server),
        errors,
        _types(path, row.results),
        f"{statistics.median(row.latencies):.1f} / {row.latencies[-1]:.1f}",
    )
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| path | client | requests | items per request | well-formed | right | errors "
    "| result type | latency p50 / max (s) |\n|---|---|---:|---|---:|---:|---|---|---:|"
)


def _first_error(row: Row) -> str | None:
    for result in row.results:
        if isinstance(result, Exception):
            return f"{type(result).__name__}: {str(result)[:300]}"
    return None


async def run_all(server: Server, options: argparse.Namespace) -> list[str]:
    lines = []
    for path in selected(options.paths):
        if path.sdk == "anthropic" and server.anthropic_url is None:
            print(f"skip {path.name}: no --anthropic-url", file=sys.stderr)
            continue
        for wrapped in (False, True) if not options.skip_plain else (True,):
            options.wrapped = wrapped
            row = await run_path(path, server, options)
            line = table_line(path, row, server)
            lines.append(line)
            print(line, file=sys.stderr)
            if (error := _first_error(row)) is not None:
                print(f"    first error: {error}", file=sys.stderr)
    return lines


def selected(names: str | None) -> list[Route]:
    """The paths whose name contains one of the comma-separated ``names`` (all if none)."""
    if not names:
        return list(PATHS)
    wanted = [name.strip().lower() for name in names.split(",") if name.strip()]
    return [p for p in PATHS if any(w in p.name.lower() for w in wanted)]


# -- servers -------------------------------------------------------------------------------


@contextmanager
def llama_server(options: argparse.Namespace) -> Iterator[str]:
    """llama.cpp's server with SmolLM2 (``tests/_llama.py``), its replies capped at
    ``--llama-n-predict`` tokens when a request sets no cap (llama.cpp's default is none:
    a small model's text, or a request it cannot hold to a schema, runs to the end of
    the context)."""
    import _llama

    start = "server = xllamacpp.Server(params)"
    assert start in _llama._CHILD, "tests/_llama.py changed: update llama_server()"
    cap = f"params.n_predict = {options.llama_n_predict}\n{start}"
    _llama._CHILD = _llama._CHILD.replace(start, cap)  # running_server() takes no cap
    slots = options.llama_parallel
    with _llama.running_server(
        n_ctx=slots * options.llama_slot_ctx, parallel=slots, threads=options.llama_threads
    ) as url:
        yield url


@contextmanager
def server_for(options: argparse.Namespace) -> Iterator[Server]:
    models = (options.model, options.anthropic_model)
    if options.url:
        yield Server(options.url.rstrip("/"), options.anthropic_url, *models)
    elif options.llama:
        with llama_server(options) as url:
            yield Server(url, url.removesuffix("/v1"), *models)
    else:
        from coalesce.testing import SimulatedProvider

        # The models' own limits, which the simulator enforces as the providers do.
        sim = SimulatedProvider(
            time_scale=options.time_scale, output_limit=OUTPUT_LIMITS, context_window=WINDOWS
        )
        with sim.serve() as url:
            yield Server(f"{url}/v1", url, *models, sim=sim)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="an OpenAI-compatible server's base URL (.../v1)")
    parser.add_argument("--anthropic-url", help="its Anthropic root URL (without /v1)")
    parser.add_argument("--llama", action="store_true", help="start llama.cpp with SmolLM2")
    parser.add_argument("--llama-parallel", type=int, default=4, help="llama.cpp slots")
    parser.add_argument("--llama-slot-ctx", type=int, default=4096, help="context per slot")
    parser.add_argument("--llama-threads", type=int, default=0, help="0: tests/_llama.py's")
    parser.add_argument("--llama-n-predict", type=int, default=1024, help="default reply cap")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--anthropic-model", default="claude-3-5-haiku-latest")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--budget", type=float, default=2.0, help="latency_budget of wrap")
    parser.add_argument("--max-items", type=int, default=20, help="max_items of wrap")
    parser.add_argument("--call-timeout", type=float, default=300.0, help="seconds per call")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulator's")
    parser.add_argument("--paths", help="comma-separated parts of path names")
    parser.add_argument("--skip-plain", action="store_true", help="no baseline rows")
    options = parser.parse_args(argv)
    if options.calls > len(TICKETS):
        parser.error(f"--calls is at most {len(TICKETS)} (the task's tickets)")
    return options


def main() -> None:
    options = parse_args()
    warnings.simplefilter("ignore")  # frameworks' deprecation chatter; errors are counted
    logging.getLogger().addHandler(logging.NullHandler())  # and their retry logs
    started = time.perf_counter()
    with server_for(options) as server:
        where = "the simulator" if server.sim is not None else server.openai_url
        print(f"server: {where}; budget {options.budget} s", file=sys.stderr)
        lines = anyio.run(run_all, server, options)
    print(
        f"{options.calls} concurrent calls per row, coalesce.wrap(latency_budget="
        f"{options.budget}, max_items={options.max_items}); model {options.model}\n"
    )
    print(HEADER)
    print("\n".join(lines))
    print(f"\nTotal: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    main()
