"""The ``ringml`` command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from .pipelines.main_job import JobConfig, run_main_job

    config = JobConfig(
        postcodes=args.postcodes,
        delete_fraction=args.deletes,
        batch_size=args.batch_size,
        micro_batches=args.micro_batches,
        seed=args.seed,
        ridge=args.ridge,
        workdir=args.workdir,
        tracking_uri=args.tracking_uri,
        master=args.master,
        malformed_rows=not args.no_malformed_rows,
        progress=not args.no_progress,
    )
    return 0 if run_main_job(config).ok else 1


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
    data = loaders[args.dataset]()
    relations = {name: list(frame.columns) for name, frame in data.relations.items()}
    updatable = args.updatable.split(",") if args.updatable else None
    maintainer = Maintainer(covariance_query(relations), updatable=updatable, order=args.order)
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
        "--postcodes",
        type=int,
        default=1000,
        help="database scale (default 1000: 21,000 tuples, a 200,000-row join)",
    )
    demo.add_argument(
        "--deletes",
        type=float,
        default=0.3,
        help="fraction of the stream that deletes earlier inserts (default 0.3)",
    )
    demo.add_argument(
        "--batch-size", type=int, default=1000, help="tuples per stream batch (default 1000)"
    )
    demo.add_argument(
        "--micro-batches",
        type=int,
        default=24,
        help="at most this many Spark micro-batches (one feed file each; default 24)",
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--ridge", type=float, default=1e-3, help="per-row ridge penalty (default 1e-3)"
    )
    demo.add_argument(
        "--workdir",
        default="ringml-demo",
        help="folder for the feed, checkpoints, dead letters and the MLflow store "
        "(default ./ringml-demo)",
    )
    demo.add_argument(
        "--tracking-uri",
        default=None,
        help="log to this MLflow tracking URI instead (default: $MLFLOW_TRACKING_URI, "
        "else WORKDIR/mlflow/mlflow.db)",
    )
    demo.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    demo.add_argument(
        "--no-malformed-rows",
        action="store_true",
        help="do not inject the three malformed feed rows that show the dead-letter output",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)
    bench = commands.add_parser(
        "bench",
        help="run a benchmark from benchmarks/ (engine, rings, models, spark or sql_tpch)",
        description="Run benchmarks/<BENCHMARK>.py of the source checkout; every option "
        "after the name goes to the script (e.g. ringml bench engine --quick; "
        "ringml bench spark --help). Results go to benchmarks/results/.",
    )
    bench.add_argument("benchmark", choices=["engine", "rings", "models", "spark", "sql_tpch"])
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
    explain.set_defaults(run=_explain)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
