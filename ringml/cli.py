"""The ``ringml`` command line."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

#: options of one demo mode only: (flag, attribute)
_STREAM_ONLY = [
    ("--deletes", "deletes"),
    ("--batch-size", "batch_size"),
    ("--micro-batches", "micro_batches"),
    ("--no-malformed-rows", "no_malformed_rows"),
]
_WINDOW_ONLY = [("--days", "days"), ("--lateness", "lateness"), ("--batch-days", "batch_days")]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _number_in(low: float, high: float, what: str):
    """An argparse type: a float with ``low <= value <= high`` (NaN never is)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
        return value

    return parse


_non_negative = _number_in(0.0, sys.float_info.max, "a finite number >= 0")
# deletes never outnumber the inserts they delete
_delete_fraction = _number_in(0.0, 0.5, "a number in [0, 0.5]")


#: Spark's master URLs: local[N] (N threads, or * for one per core), a cluster manager
_SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn"
    r"|(spark|k8s|mesos)://\S+"
)


def _spark_master(text: str) -> str:
    if _SPARK_MASTER.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Spark master URL (local, local[N], local[*], "
            "spark://HOST:PORT, yarn, k8s://...)"
        )
    return text


#: the URI schemes MLflow has a tracking store for ('': a local folder)
_MLFLOW_SCHEMES = {
    "", "file", "http", "https", "sqlite", "postgresql", "mysql", "mssql",
    "databricks", "databricks-uc", "uc",
}  # fmt: skip


def _tracking_uri(text: str) -> str:
    scheme = urlparse(text).scheme.lower().split("+")[0]  # postgresql+psycopg2: postgresql
    if scheme not in _MLFLOW_SCHEMES:
        known = ", ".join(sorted(_MLFLOW_SCHEMES - {""}))
        raise argparse.ArgumentTypeError(
            f"{text!r}: MLflow has no tracking store for {scheme!r} URIs ({known})"
        )
    return text


def _workdir(text: str) -> str:
    path = Path(text).resolve()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not writable")
    return text


def _run_job(job, config) -> int:
    """0 when ``job(config)``'s checks pass, else 1; a job that cannot start here (no
    Java, a folder the demo did not make) is a one-line error, not a traceback."""
    from .pipelines.main_job import JobSetupError

    try:
        return 0 if job(config).ok else 1
    except JobSetupError as error:
        print(f"ringml demo: error: {error}", file=sys.stderr)
        return 1


def _demo(args: argparse.Namespace) -> int:
    given = [flag for flag, name in _STREAM_ONLY if getattr(args, name) not in (None, False)]
    if args.window is not None:
        if given:
            args.parser.error(f"{', '.join(given)}: not an option of the --window mode")
        return _window_demo(args)
    given = [flag for flag, name in _WINDOW_ONLY if getattr(args, name) is not None]
    if given:
        args.parser.error(f"{', '.join(given)}: only with --window")
    deletes = 0.3 if args.deletes is None else args.deletes
    if deletes > 0 and args.batch_size == 1:
        args.parser.error(
            "--batch-size 1: deletes need a batch size of at least 2 (or --deletes 0)"
        )
    from .pipelines.main_job import JobConfig, run_main_job

    config = JobConfig(
        postcodes=1000 if args.postcodes is None else args.postcodes,
        delete_fraction=deletes,
        batch_size=1000 if args.batch_size is None else args.batch_size,
        micro_batches=24 if args.micro_batches is None else args.micro_batches,
        seed=args.seed,
        ridge=args.ridge,
        workdir=args.workdir or "ringml-demo",
        tracking_uri=args.tracking_uri,
        master=args.master,
        malformed_rows=not args.no_malformed_rows,
        progress=not args.no_progress,
    )
    return _run_job(run_main_job, config)


def _window_demo(args: argparse.Namespace) -> int:
    from .pipelines.window_job import WindowJobConfig, run_window_job

    defaults = WindowJobConfig()
    config = WindowJobConfig(
        window_days=args.window,
        days=defaults.days if args.days is None else args.days,
        days_per_batch=defaults.days_per_batch if args.batch_days is None else args.batch_days,
        lateness_days=defaults.lateness_days if args.lateness is None else args.lateness,
        postcodes=defaults.postcodes if args.postcodes is None else args.postcodes,
        seed=args.seed,
        ridge=args.ridge,
        workdir=args.workdir or defaults.workdir,
        tracking_uri=args.tracking_uri,
        master=args.master,
        progress=not args.no_progress,
    )
    return _run_job(run_window_job, config)


def _bench(args: argparse.Namespace) -> int:
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    script = folder / f"{args.benchmark}.py"
    if not script.is_file():
        print(
            f"ringml bench: {script} not found; the benchmarks ship with the source "
            "checkout (git clone, then pip install -e .)",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, str(script), *args.options]
    return subprocess.run(command, cwd=folder.parent, check=False).returncode


def _explain(args: argparse.Namespace) -> int:
    from . import datasets
    from .applications import covariance_query
    from .maintainer import Maintainer

    loaders = {
        "housing": lambda: datasets.housing_star(postcodes=10),
        "retailer": lambda: datasets.retailer_snowflake(seed=0),
        "favorita": lambda: datasets.favorita_star(seed=0),
    }
    from .errors import RingmlError

    data = loaders[args.dataset]()
    relations = {name: list(frame.columns) for name, frame in data.relations.items()}
    updatable = None
    if args.updatable is not None:
        updatable = [name.strip() for name in args.updatable.split(",") if name.strip()]
        if not updatable:
            args.parser.error("--updatable names no relation")
    try:
        maintainer = Maintainer(covariance_query(relations), updatable=updatable, order=args.order)
    except RingmlError as error:  # a bad order or relation name: the user's, no traceback
        args.parser.error(str(error))
    print(maintainer.explain())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ringml`` command."""
    parser = argparse.ArgumentParser(
        prog="ringml",
        description="Keep ML aggregates fresh over changing relational data (F-IVM over rings).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="the main job: stream inserts and deletes through Spark into a fresh price "
        "model and Chow-Liu tree over a Housing-like join, tracked in MLflow",
        description="Generate a Housing-like database (six relations joined on postcode), "
        "stream inserts and deletes through Spark Structured Streaming (local mode) into "
        "ringml's engine exactly once, refit a linear model of price and a Chow-Liu tree "
        "after every micro-batch, log every refresh to MLflow (SQLite store under "
        "WORKDIR/mlflow), and check the final model against scikit-learn on the "
        "materialized join.",
    )
    demo.add_argument(
        "--window",
        type=_positive_int,
        default=None,
        metavar="DAYS",
        help="window mode: House sales with a sale time stream in, and the price model and "
        "Chow-Liu tree are kept over the last DAYS days of the join (expired days are "
        "deletes), in a drifting market; the coefficients and holdout errors over event "
        "time are logged to MLflow as a plot",
    )
    demo.add_argument(
        "--postcodes",
        type=_positive_int,
        default=None,
        help="database scale (default 1000: 21,000 tuples, a 200,000-row join; with "
        "--window 500 postcodes, 10,000 sales)",
    )
    demo.add_argument(
        "--deletes",
        type=_delete_fraction,
        default=None,
        help="fraction of the stream that deletes earlier inserts, in [0, 0.5] (default 0.3; "
        "deletes need --batch-size 2 or more)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="tuples per stream batch (default 1000)",
    )
    demo.add_argument(
        "--micro-batches",
        type=_positive_int,
        default=None,
        help="at most this many Spark micro-batches (one feed file each; default 24)",
    )
    demo.add_argument(
        "--days", type=_positive_int, default=None, help="--window: days of sales (default 60)"
    )
    demo.add_argument(
        "--batch-days",
        type=_positive_int,
        default=None,
        help="--window: days of arrivals per micro-batch (default 3)",
    )
    demo.add_argument(
        "--lateness",
        type=_non_negative,
        default=None,
        help="--window: days the watermark stays behind the latest sale time; sales that "
        "arrive later than that are dead letters (default 1)",
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--ridge", type=_non_negative, default=1e-3, help="per-row ridge penalty (default 1e-3)"
    )
    demo.add_argument(
        "--workdir",
        type=_workdir,
        default=None,
        help="folder for the feed, checkpoints, dead letters and the MLflow store "
        "(default ./ringml-demo, with --window ./ringml-demo-window); each run replaces its "
        "feeds, checkpoint, state and dead-letters sub-folders, and refuses to start where "
        "one of them exists that an earlier demo did not make",
    )
    demo.add_argument(
        "--tracking-uri",
        type=_tracking_uri,
        default=None,
        help="log to this MLflow tracking URI instead (default: $MLFLOW_TRACKING_URI, "
        "else WORKDIR/mlflow/mlflow.db)",
    )
    demo.add_argument(
        "--master", type=_spark_master, default="local[2]", help="Spark master (default local[2])"
    )
    demo.add_argument(
        "--no-malformed-rows",
        action="store_true",
        help="do not inject the three malformed feed rows that show the dead-letter output",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo, parser=demo)
    bench = commands.add_parser(
        "bench",
        help="run a benchmark from benchmarks/ (engine, rings, models, spark, sql_tpch, "
        "sql_single_rows, windows or dbtoaster_fig7)",
        description="Run benchmarks/<BENCHMARK>.py of the source checkout; every option "
        "after the name goes to the script (e.g. ringml bench engine --quick; "
        "ringml bench spark --help). Results go to benchmarks/results/.",
    )
    bench.add_argument(
        "benchmark",
        choices=[
            "engine",
            "rings",
            "models",
            "spark",
            "sql_tpch",
            "sql_single_rows",
            "windows",
            "dbtoaster_fig7",
        ],
    )
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options for the script")
    bench.set_defaults(run=_bench)
    explain = commands.add_parser(
        "explain",
        help="print the variable order, view tree and materialized views of the "
        "covariance query over a dataset's join",
    )
    explain.add_argument("dataset", choices=["housing", "retailer", "favorita"])
    explain.add_argument(
        "--order",
        default=None,
        help="a variable order in the F-IVM bracket format (default: automatic)",
    )
    explain.add_argument(
        "--updatable", default=None, help="comma-separated updatable relations (default: all)"
    )
    explain.set_defaults(run=_explain, parser=explain)
    args = parser.parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
    except BrokenPipeError:  # the reader left (ringml explain ... | head -1): stop quietly
        # Python flushes stdout again at exit; that flush must not fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
