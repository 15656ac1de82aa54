"""Shared fixtures: one local Spark session for the tests marked ``spark``.

Tests marked ``spark`` are skipped, with the reason, when pyspark (or pyarrow) is missing or
no Java 17+ runtime is found; nothing here starts a JVM unless such a test runs.  Tests run
against this checkout's ``rings/``, ``models/`` and ``pipelines/`` too when the virtual
environment's editable install was made from another checkout (``_CheckoutPackages``).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class _CheckoutPackages:
    """Serves the packages pyproject maps to other folders (``ringml.rings`` is
    ``rings/``, ...) from this checkout.  An editable install made from another checkout
    (a git worktree sharing its virtual environment) imports ``ringml`` from here but
    those packages from there: tests would run another checkout's rings."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders

    def find_spec(self, name, path=None, target=None):
        folder = self.folders.get(name)
        if folder is None:
            return None
        init = folder / "__init__.py"
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )


def _serve_this_checkout() -> None:
    spec = importlib.util.find_spec("ringml")
    if spec is None or spec.origin is None or Path(spec.origin).parent != ROOT / "ringml":
        return  # ringml is not imported from this checkout: nothing to align
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        name: ROOT / folder
        for name, folder in setuptools.get("package-dir", {}).items()
        if name.startswith("ringml.")
    }
    sys.meta_path.insert(0, _CheckoutPackages(folders))


_serve_this_checkout()


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
