"""version_compat: the page's user on an Airflow whose ``get_user`` reads the request (3.1.x
from some patch on, 3.2, 3.3) and on one whose ``get_user`` takes no request and reads no
cookie (3.1.0): bearer token first, else the UI's login cookie, as Airflow resolves it.
The lowest Airflow itself runs in tests/integration/install/test_wheel.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from airflow_provider_eo import version_compat


def _request(*, bearer: str | None = None, cookie: str | None = None) -> Request:
    headers = []
    if bearer is not None:
        headers.append((b"authorization", f"Bearer {bearer}".encode()))
    if cookie is not None:
        headers.append((b"cookie", f"_token={cookie}".encode()))
    return Request({"type": "http", "method": "GET", "path": "/eo/api/pipelines", "headers": headers})


@pytest.fixture()
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The tokens Airflow's resolver is asked about (it answers with a user named after it)."""
    from airflow.api_fastapi.core_api import security

    asked: list[str | None] = []

    async def resolve_user_from_token(token: str | None) -> Any:
        asked.append(token)
        return f"user-of-{token}"

    monkeypatch.setattr(security, "resolve_user_from_token", resolve_user_from_token)
    return asked


def test_an_airflow_whose_get_user_reads_the_request_resolves_the_user(
    resolved: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.core_api import security

    seen: list[tuple[Any, ...]] = []

    async def get_user(request: Any, oauth_token: Any = None, bearer_credentials: Any = None) -> Any:
        seen.append((request, oauth_token, bearer_credentials.credentials if bearer_credentials else None))
        return "airflow's user"

    monkeypatch.setattr(security, "get_user", get_user)
    request = _request(bearer="tok", cookie="cookie-tok")
    assert asyncio.run(version_compat.request_user(request)) == "airflow's user"
    assert seen == [(request, None, "tok")] and resolved == []


@pytest.mark.parametrize(
    ("bearer", "cookie", "token"),
    [("tok", "cookie-tok", "tok"), (None, "cookie-tok", "cookie-tok"), (None, None, None)],
)
def test_airflow_3_1_0s_get_user_without_a_request_bearer_first_then_the_cookie(
    bearer: str | None,
    cookie: str | None,
    token: str | None,
    resolved: list[str | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.api_fastapi.core_api import security

    async def get_user(oauth_token: Any = None, bearer_credentials: Any = None) -> Any:
        raise AssertionError("Airflow 3.1.0's get_user cannot be given the request")

    monkeypatch.setattr(security, "get_user", get_user)
    user = asyncio.run(version_compat.request_user(_request(bearer=bearer, cookie=cookie)))
    assert resolved == [token] and user == f"user-of-{token}"
