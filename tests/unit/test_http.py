"""The one place that picks the HTTP library (`tito_agents._http`)."""

from __future__ import annotations

import openai
import pytest

from tito_agents import integration, rescore, sampling
from tito_agents._http import http_module, http_module_of


@pytest.mark.parametrize("name", ["httpx", "httpx2"])
def test_a_client_is_of_the_library_it_comes_from(name: str) -> None:
    library = pytest.importorskip(name)
    with library.Client() as client:
        assert http_module_of(client) is library
    assert http_module_of(library.AsyncClient()) is library


def test_the_openai_sdk_client_is_of_the_library_tito_uses() -> None:
    """tito's own requests use the library the installed openai SDK builds its clients on."""
    with openai.DefaultHttpxClient() as client:
        assert http_module_of(client) is http_module()


def test_anything_else_is_no_http_client() -> None:
    with pytest.raises(TypeError, match="not an httpx or httpx2 client"):
        http_module_of(object())


def test_every_user_picks_the_library_here() -> None:
    assert integration.http_module_of is http_module_of
    assert rescore.http_module is sampling.http_module is http_module
