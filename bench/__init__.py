"""Benchmarks: timing lives here, never in tests."""
