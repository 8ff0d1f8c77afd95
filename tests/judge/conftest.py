"""The proxy fixtures, for the judge's end-to-end posting test."""

from tests.proxy.conftest import start_proxy, stub_upstream

__all__ = ["start_proxy", "stub_upstream"]
