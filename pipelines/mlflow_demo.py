"""The demo job, tracked in MLflow: a Housing-like star, a stream with deletes, a model.

``python -m ringml.pipelines.mlflow_demo --postcodes 200 --deletes 0.3 --batch-size 500``
(also the ``main`` entry point of ``mlflow/MLproject``).  It streams inserts and deletes
into the six relations of a Housing-like star (:func:`ringml.datasets.housing_star`,
:func:`ringml.datasets.build_stream`) and keeps, over their join (never materialized):

* a linear model of ``price`` (:class:`~ringml.models.JoinRegressor`, warm-started BGD,
  categorical features one-hot only inside the solver), refitted after every batch and
  logged by :class:`~ringml.pipelines.mlflow_tracking.RefreshLogger`: metrics on every
  refresh (``step`` = batch number), a registered pyfunc model and the ``champion`` alias
  whenever the holdout RMSE improves by ``--min-improvement``;
* the mutual information of a few variables and their Chow–Liu tree
  (:class:`~ringml.models.JoinChowLiu`), logged as artifacts at the end.

The holdout is the join of another Housing-like star (a different seed): data the model
never saw.  Without ``--tracking-uri`` or ``--store-dir`` it logs where
``$MLFLOW_TRACKING_URI`` points (as under ``mlflow run``) or into ``./ringml-mlflow``.
"""

from __future__ import annotations

import argparse
import sys
import time

from ringml.models import JoinChowLiu, JoinRegressor

from ringml.datasets import build_stream, housing_star

from .mlflow_tracking import PromotionRule, RefreshLogger

LABEL = "price"
CONTINUOUS = [
    "livingarea", "kitchensize", "garden", "averagesalary", "crimesperyear", "unemployment",
    "distancecitycentre", "nbbuslines",
]  # fmt: skip
# house/flat/unknown one-hot the property type: two of them, or they are collinear with the
# intercept
CATEGORICAL = ["nbbedrooms", "nbbathrooms", "house", "flat"]
CHOW_LIU = ["nbbedrooms", "nbbathrooms", "house", "pricerangeshop", "typeeducation", "price"]
CHOW_LIU_BINNED = ["price"]


def run_tracked_demo(
    postcodes: int = 200,
    delete_fraction: float = 0.3,
    batch_size: int = 500,
    seed: int = 0,
    ridge: float = 1e-3,
    *,
    tracking_uri: str | None = None,
    store_dir: str | None = None,
    experiment: str = "ringml-demo",
    model_name: str = "ringml-housing-price",
    min_improvement: float = 0.01,
    holdout_postcodes: int | None = None,
    chow_liu: bool = True,
    out=print,
) -> dict:
    """Run the tracked demo; returns a summary (run id, refreshes, promotions, champion)."""
    data = housing_star(postcodes=postcodes, seed=seed)
    schemas = data.schemas
    extra = max(10, postcodes // 5) if holdout_postcodes is None else holdout_postcodes
    holdout = housing_star(postcodes=extra, seed=seed + 1000).join()
    holdout = holdout[[*CONTINUOUS, *CATEGORICAL, LABEL]]
    if len(holdout) > 5000:
        holdout = holdout.sample(5000, random_state=seed).reset_index(drop=True)
    stream = build_stream(
        data.relations, batch_size=batch_size, delete_fraction=delete_fraction, seed=seed
    )
    model = JoinRegressor(schemas, LABEL, CONTINUOUS + CATEGORICAL, CATEGORICAL, ridge=ridge)
    tree = JoinChowLiu(schemas, CHOW_LIU, continuous=CHOW_LIU_BINNED, n_bins=10)
    logger = RefreshLogger(
        model_name,
        experiment=experiment,
        tracking_uri=tracking_uri,
        store_dir=store_dir,
        run_name=f"housing-{postcodes}pc-{delete_fraction:.0%}del",
        holdout=holdout,
        promotion=PromotionRule(min_relative_improvement=min_improvement),
        extra_params={
            "postcodes": postcodes,
            "delete_fraction": delete_fraction,
            "batch_size": batch_size,
            "seed": seed,
            "holdout_rows": len(holdout),
            "stream_batches": len(stream),
        },
    )
    tuples = sum(len(b.rows) for b in stream)
    out(
        f"Housing-like star, {postcodes} postcodes: {len(stream)} batches, {tuples:,} tuples "
        f"({delete_fraction:.0%} deletes); holdout {len(holdout):,} rows; "
        f"tracking {logger.tracking_uri}"
    )
    start = time.perf_counter()
    with logger:
        for batch in stream:
            record = logger.partial_fit(model, batch)
            if chow_liu:
                tree.partial_fit(batch)
            if record.promoted:
                out(
                    f"  refresh {record.step:>4}: {record.metrics['join_rows']:>10,.0f} join "
                    f"rows, holdout RMSE {record.metrics.get('holdout_rmse', float('nan')):,.1f}"
                    f" -> champion v{record.version}"
                )
        if chow_liu:
            logger.log_chow_liu(tree, title="Chow-Liu tree over the Housing join")
    elapsed = time.perf_counter() - start
    promotions = [r for r in logger.records if r.promoted]
    last = logger.records[-1].metrics if logger.records else {}
    champion = logger.champion()
    out(
        f"{len(logger.records)} refreshes logged in {elapsed:.1f} s, {len(promotions)} "
        f"promotion(s); champion {model_name} v{champion[0] if champion else '-'}; "
        f"last holdout RMSE {last.get('holdout_rmse', float('nan')):,.1f}"
    )
    out(f"run {logger.run_id} in experiment {experiment!r}")
    if logger.tracking_uri.startswith("sqlite:"):
        out(f"browse it: mlflow ui --backend-store-uri {logger.tracking_uri}")
    return {
        "run_id": logger.run_id,
        "tracking_uri": logger.tracking_uri,
        "refreshes": len(logger.records),
        "promotions": len(promotions),
        "champion": champion[0] if champion else None,
        "seconds": elapsed,
    }


def _count(text: str) -> int:
    """An integer, also from ``200.0`` (MLproject parameters of type float)."""
    value = float(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ringml.pipelines.mlflow_demo",
        description="Stream inserts and deletes into a Housing-like star, keep a price model "
        "fresh over the join and track every refresh in MLflow.",
    )
    parser.add_argument("--postcodes", type=_count, default=200, help="database scale")
    parser.add_argument(
        "--deletes", type=float, default=0.3, help="fraction of the stream that deletes"
    )
    parser.add_argument("--batch-size", type=_count, default=500, help="tuples per batch")
    parser.add_argument("--seed", type=_count, default=0)
    parser.add_argument("--ridge", type=float, default=1e-3, help="per-row ridge penalty")
    parser.add_argument(
        "--min-improvement",
        type=float,
        default=0.01,
        help="relative holdout-RMSE improvement that promotes a new champion",
    )
    parser.add_argument("--experiment", default="ringml-demo")
    parser.add_argument("--model-name", default="ringml-housing-price")
    parser.add_argument(
        "--tracking-uri", default=None, help="an MLflow tracking URI (wins over --store-dir)"
    )
    parser.add_argument(
        "--store-dir", default=None, help="folder of a local SQLite store (mlflow.db)"
    )
    parser.add_argument("--no-chow-liu", action="store_true", help="skip the Chow-Liu tree")
    args = parser.parse_args(argv)
    run_tracked_demo(
        postcodes=args.postcodes,
        delete_fraction=args.deletes,
        batch_size=args.batch_size,
        seed=args.seed,
        ridge=args.ridge,
        tracking_uri=args.tracking_uri or None,
        store_dir=args.store_dir or None,
        experiment=args.experiment,
        model_name=args.model_name,
        min_improvement=args.min_improvement,
        chow_liu=not args.no_chow_liu,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
