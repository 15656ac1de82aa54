"""Shared fixtures: one local Spark session for the tests marked ``spark``.

Tests marked ``spark`` are skipped, with the reason, when pyspark (or pyarrow) is missing or
no Java 17+ runtime is found; nothing here starts a JVM unless such a test runs.
"""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def _spark_unavailable() -> str | None:
    try:
        from ringml.pipelines.spark_session import spark_unavailable
    except ImportError as error:  # pragma: no cover - broken install
        return f"ringml.pipelines cannot be imported ({error})"
    return spark_unavailable()


def pytest_collection_modifyitems(config, items):
    if "slow" not in (config.getoption("markexpr") or ""):
        # the long profiles run only when asked for by marker (``-m slow``)
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    marked = [item for item in items if item.get_closest_marker("spark") is not None]
    if not marked:
        return
    reason = _spark_unavailable()
    if reason is not None:
        skip = pytest.mark.skip(reason=f"Spark tests need pyspark and Java 17+: {reason}")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    """A ``local[2]`` SparkSession (2 shuffle partitions, UI off, UTC, workers on this
    interpreter), stopped at the end of the session."""
    reason = _spark_unavailable()
    if reason is not None:
        pytest.skip(f"Spark tests need pyspark and Java 17+: {reason}")
    from ringml.pipelines.spark_session import local_session

    session = local_session("local[2]", "ringml-tests", shuffle_partitions=2)
    yield session
    session.stop()
