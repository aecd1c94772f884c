"""Synchronous web frameworks: 40 concurrent requests to a view that calls ``tag.sync``,
from 40 threads, through each framework's own test client (real time).

Flask and Django views are plain functions; FastAPI runs ``def`` endpoints in its
thread pool. Every request is answered with its own ticket's tag, in at most 10
requests to the provider, and the function still serves async code afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
from _threads import CALLS, MOST_REQUESTS, Tag, expected, in_threads, make_tag, tickets

from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.integration

#: The function the Django view calls (Django's URLconf is module-level).
_DJANGO_TAG: dict[str, Any] = {}


def _answers(sim: SimulatedProvider, items: list[str]) -> list[dict[str, Any]]:
    return [expected(sim, item).model_dump() for item in items]


def test_flask_view(sim: SimulatedProvider) -> None:
    flask = pytest.importorskip("flask")
    tag = make_tag(sim.openai_client(max_retries=0))
    app = flask.Flask(__name__)

    @app.get("/tag")
    def tag_view() -> dict[str, Any]:
        return tag.sync(flask.request.args["ticket"]).model_dump()

    def get(ticket: str) -> dict[str, Any]:
        response = app.test_client().get("/tag", query_string={"ticket": ticket})
        assert response.status_code == 200
        return dict(response.get_json())

    items = tickets()
    assert in_threads(get, items) == _answers(sim, items)
    assert sim.statistics().requests == CALLS // 10 <= MOST_REQUESTS
    tag.sync.close()


def _django_view(request: Any) -> Any:
    from django.http import JsonResponse

    tag = _DJANGO_TAG["tag"]
    return JsonResponse(tag.sync(request.GET["ticket"]).model_dump())


def _setup_django() -> None:
    import django
    from django.conf import settings
    from django.urls import path

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="coalesce-tests",
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            DATABASES={},
        )
        django.setup()
    globals()["urlpatterns"] = [path("tag/", _django_view)]


def test_django_view(sim: SimulatedProvider) -> None:
    pytest.importorskip("django")
    _setup_django()
    from django.test import Client

    _DJANGO_TAG["tag"] = tag = make_tag(sim.openai_client(max_retries=0))

    def get(ticket: str) -> dict[str, Any]:
        response = Client().get("/tag/", {"ticket": ticket})
        assert response.status_code == 200
        return dict(response.json())

    items = tickets()
    assert in_threads(get, items) == _answers(sim, items)
    assert sim.statistics().requests == CALLS // 10 <= MOST_REQUESTS
    tag.sync.close()


def test_fastapi_def_endpoint(sim: SimulatedProvider) -> None:
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    tag = make_tag(sim.openai_client(max_retries=0))
    app = fastapi.FastAPI()

    @app.get("/tag")
    def tag_endpoint(ticket: str) -> Tag:  # a def endpoint: run in the thread pool
        return tag.sync(ticket)

    @app.get("/tag-async")
    async def tag_async_endpoint(ticket: str) -> Tag:  # on the app's own event loop
        return await tag(ticket)

    items = tickets()
    with TestClient(app) as client:

        def get(ticket: str, route: str = "/tag") -> dict[str, Any]:
            response = client.get(route, params={"ticket": ticket})
            assert response.status_code == 200
            return dict(response.json())

        assert in_threads(get, items) == _answers(sim, items)
        assert sim.statistics().requests == CALLS // 10 <= MOST_REQUESTS
        # Nothing is left broken: the app's async endpoints are served as well.
        later = tickets(CALLS, prefix="async")
        assert in_threads(lambda item: get(item, "/tag-async"), later) == _answers(sim, later)
        assert sim.statistics().requests == 2 * CALLS // 10
    tag.sync.close()
