"""A local Spark session with the settings ringml's Spark pipelines expect.

PySpark 4 needs Java 17+; the Python workers must run the interpreter that has ringml
installed (``PYSPARK_PYTHON``), otherwise ``applyInPandas`` and ``foreachBatch`` fail to
import it.  :func:`spark_unavailable` tells, without starting anything, why a session cannot
be made (a reason string) or ``None``; :func:`local_session` builds one.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["java_version", "local_session", "spark_unavailable"]


def java_version() -> int | None:
    """The major version of the ``java`` on ``JAVA_HOME`` or ``PATH`` (None if absent)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def spark_unavailable() -> str | None:
    """Why a local Spark session cannot start here (missing pyspark, pyarrow, Java < 17), or
    None when it can."""
    for module in ("pyspark", "pyarrow", "pandas"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'ringml[spark]')"
    version = java_version()
    if version is None:
        return "no Java runtime found (PySpark 4 needs Java 17+; set JAVA_HOME or PATH)"
    if version < 17:
        return f"Java {version} found; PySpark 4 needs Java 17+"
    return None


def local_session(
    master: str = "local[2]",
    app_name: str = "ringml",
    shuffle_partitions: int = 2,
    driver_memory: str | None = None,
    conf: Mapping[str, str] | None = None,
):
    """A ``SparkSession`` for local runs: UI off, UTC, Arrow on, workers on this Python.

    ``driver_memory`` (e.g. ``"8g"``) only takes effect when this call starts the JVM.
    ``conf`` adds or overrides settings.  An existing session is returned as is by Spark's
    ``getOrCreate`` (static settings such as the master then keep their old values).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.fallback.enabled", "false")
        .config("spark.sql.streaming.stopTimeout", "60s")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
