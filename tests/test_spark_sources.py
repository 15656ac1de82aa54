"""Kafka and Delta change feeds: the parsing and layout that their streams go through,
checked on static Spark DataFrames (no broker or Delta package here), and the error a
session without those sources gives."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import ringml
from ringml import UpdateBatch

pytestmark = pytest.mark.spark

SCHEMAS = {"R": ["a", "x"], "S": ["a", "y"]}


def _maintainer() -> ringml.Maintainer:
    return ringml.Maintainer(ringml.covariance_query(SCHEMAS))


def _equal(left, right) -> None:
    a = left.query.ring.statistics(left.result())
    b = right.query.ring.statistics(right.result())
    assert a.count == b.count
    np.testing.assert_allclose(a.covariance, b.covariance, rtol=1e-12, atol=1e-12)


def test_kafka_json_values_become_deltas_and_bad_values_dead_letters(spark, tmp_path):
    from ringml.pipelines.spark_stream import (
        ChangeFeed,
        StreamingMaintainer,
        feed_layout,
        parse_kafka_values,
    )

    records = [
        {"relation": "R", "op": "insert", "a": 1, "x": 2.5},
        {"relation": "R", "op": "insert", "a": 1, "x": 4.0},
        {"relation": "R", "op": "insert", "a": 2, "x": -1.0},
        {"relation": "S", "op": "insert", "a": 1, "y": 10.0},
        {"relation": "S", "op": "insert", "a": 2, "y": 3.0},
        {"relation": "R", "op": "delete", "a": 1, "x": 4.0},
    ]
    values = [json.dumps(r).encode() for r in records]
    values += [b"{not json", json.dumps({"relation": "R", "op": "insert", "a": "one"}).encode()]
    feed = ChangeFeed(
        "changes", {"a": "bigint", "x": "double", "y": "double"}, relation=None, format="kafka"
    )
    kafka = spark.createDataFrame([(v,) for v in values], "value binary")
    table = feed_layout(parse_kafka_values(kafka, feed), feed).toArrow()

    streaming = StreamingMaintainer(
        _maintainer(), tmp_path / "state", on_error="dead_letter", dead_letter_path=tmp_path / "d"
    )
    report = streaming.process_batch(table, 0)
    assert report.applied == len(records)
    dead = streaming.dead_letters()
    assert len(dead) == 2 and dead["reason"].str.contains("unparseable").all()
    assert any("not json" in row for row in dead["row"])

    expected = _maintainer()
    expected.apply(
        [
            UpdateBatch.inserts("R", pd.DataFrame({"a": [1, 1, 2], "x": [2.5, 4.0, -1.0]})),
            UpdateBatch.inserts("S", pd.DataFrame({"a": [1, 2], "y": [10.0, 3.0]})),
        ]
    )
    expected.delete("R", pd.DataFrame({"a": [1], "x": [4.0]}))
    _equal(streaming.maintainer, expected)


def test_delta_change_data_feed_rows_with_update_images(spark, tmp_path):
    from ringml.pipelines.spark_stream import ChangeFeed, StreamingMaintainer, feed_layout

    feed = ChangeFeed("/tables/r", {"a": "bigint", "x": "double"}, "R", "delta",
                      op_column="_change_type")  # fmt: skip
    cdf = spark.createDataFrame(
        [
            (1, 2.5, "insert", 1),
            (2, 7.0, "insert", 1),
            (1, 2.5, "update_preimage", 2),
            (1, 3.5, "update_postimage", 2),
            (2, 7.0, "delete", 3),
        ],
        "a bigint, x double, _change_type string, _commit_version bigint",
    )
    streaming = StreamingMaintainer(_maintainer(), tmp_path / "state")
    streaming.maintainer.insert("S", pd.DataFrame({"a": [1, 2], "y": [1.0, 2.0]}))
    report = streaming.process_batch(feed_layout(cdf, feed).toArrow(), 0)
    assert (report.inserts, report.deletes) == (3, 2)

    expected = _maintainer()
    expected.insert("S", pd.DataFrame({"a": [1, 2], "y": [1.0, 2.0]}))
    expected.insert("R", pd.DataFrame({"a": [1], "x": [3.5]}))
    _equal(streaming.maintainer, expected)


@pytest.mark.parametrize(("kind", "hint"), [("kafka", "spark-sql-kafka"), ("delta", "delta-spark")])
def test_a_session_without_the_source_says_which_package_to_add(spark, kind, hint):
    from ringml.pipelines.spark_stream import ChangeFeed, read_change_feed

    options = {"kafka.bootstrap.servers": "localhost:9"} if kind == "kafka" else {}
    feed = ChangeFeed("changes", {"a": "bigint", "x": "double"}, "R", kind, options=options)
    with pytest.raises(ValueError, match=hint):
        read_change_feed(spark, feed)
