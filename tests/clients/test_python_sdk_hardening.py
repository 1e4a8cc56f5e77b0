"""The Python SDK (clients/python) against what it must not do: show the API key in a repr."""

from __future__ import annotations

from sabre_api.client import AuthenticatedClient
from sabre_client import Sabre


def test_the_client_repr_never_shows_the_token() -> None:
    client = AuthenticatedClient(base_url="http://127.0.0.1:1", token="sk-secret")
    for shown in (repr(client), str(client)):
        assert "sk-secret" not in shown
        assert "http://127.0.0.1:1" in shown
    # Building the httpx client copies the token into the headers: still hidden.
    client.get_httpx_client()
    client.get_async_httpx_client()
    headed = client.with_headers({"X-Trace": "t1"})
    for shown in (repr(client), str(client), repr(headed), str(headed)):
        assert "sk-secret" not in shown
    with Sabre("http://127.0.0.1:1", api_key="sk-secret") as sabre:
        assert "sk-secret" not in repr(sabre.api)
