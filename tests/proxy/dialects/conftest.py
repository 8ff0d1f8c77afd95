"""Proxies in front of the shared engines, one each for the whole package: the corpus replay
(test_engine_oracle.py) and the Responses stream oracle (test_responses_stream_oracle.py) send to the same ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, launch_proxy


@pytest.fixture(scope="package")
def oracle_proxy(tiny_engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """The recording proxy in front of the tiny model's engine."""
    proxy = launch_proxy(tmp_path_factory.mktemp("oracle"), tiny_engine.url, pg_url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="package")
def oracle_proxy_long(
    tiny_long_engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """The recording proxy in front of the long-context tiny model's engine (the CLIs' corpus-sized requests)."""
    proxy = launch_proxy(tmp_path_factory.mktemp("oracle-long"), tiny_long_engine.url, pg_url)
    yield proxy
    proxy.stop()
