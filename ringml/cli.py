"""The ``ringml`` command line."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(
        postcodes=args.postcodes,
        delete_fraction=args.deletes,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    return 0 if result["count_ok"] and result["max_error"] < 1e-6 else 1


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
        help="stream inserts and deletes into a Housing-like database and keep its "
        "covariance matrix fresh (the main job)",
    )
    demo.add_argument("--postcodes", type=int, default=1000, help="database scale (default 1000)")
    demo.add_argument(
        "--deletes",
        type=float,
        default=0.3,
        help="fraction of the stream that deletes earlier inserts (default 0.3)",
    )
    demo.add_argument("--batch-size", type=int, default=1000, help="tuples per batch")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_demo)
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
