"""Datasets and update streams for ringml (engine-independent; numpy + pandas only).

* :func:`load_housing` -- the real Housing files (6 x 25,000 rows, star on ``postcode``).
* Seeded generators: :func:`housing_star`, :func:`retailer_snowflake`,
  :func:`favorita_star`, :func:`graph_edges` (+ :func:`path_query_relations`).
* Streams: :func:`build_stream` (round-robin batches, optional deletes),
  :func:`stream_to_frame`, :func:`final_state`.
* DBToaster's workloads: the finance order book (:func:`order_book_messages`, the adaptor
  :func:`order_book_updates` to ``bids``/``asks`` inserts and deletes,
  :func:`order_book_stream`) and TPC-H (:func:`tpch_tables` from ``tpchgen-cli``,
  :func:`tpch_stream` with deletes, or DBToaster's live-orders window).

Every loader/generator returns a :class:`Dataset`: ``relations`` (name -> DataFrame in
schema order), ``join_variables``, ``continuous``/``categorical`` (the non-join variables),
``label`` and a description.
"""

from ._base import Dataset, DatasetSpec, natural_join
from .favorita import (
    FAVORITA_CATEGORICAL,
    FAVORITA_CONTINUOUS,
    FAVORITA_PAPER_NAMES,
    FAVORITA_SCHEMA,
    FAVORITA_VARIABLE_ORDER,
    favorita_star,
)
from .finance import (
    FINANCE_COLUMNS,
    OrderBookRefresh,
    order_book_messages,
    order_book_stream,
    order_book_updates,
)
from .graphs import graph_edges, path_query_relations
from .housing import (
    HOUSING_CATEGORICAL,
    HOUSING_CONTINUOUS,
    HOUSING_DEFAULT_ROWS_PER_POSTCODE,
    HOUSING_SCHEMA,
    housing_star,
    load_housing,
)
from .retailer import (
    RETAILER_CATEGORICAL,
    RETAILER_CONTINUOUS,
    RETAILER_SCHEMA,
    RETAILER_VARIABLE_ORDER,
    retailer_snowflake,
)
from .streams import StreamBatch, build_stream, final_state, stream_to_frame
from .tpch import TPCH_KEYS, TPCH_TABLES, tpch_stream, tpch_tables

__all__ = [
    "FAVORITA_CATEGORICAL",
    "FAVORITA_CONTINUOUS",
    "FAVORITA_PAPER_NAMES",
    "FAVORITA_SCHEMA",
    "FAVORITA_VARIABLE_ORDER",
    "FINANCE_COLUMNS",
    "HOUSING_CATEGORICAL",
    "HOUSING_CONTINUOUS",
    "HOUSING_DEFAULT_ROWS_PER_POSTCODE",
    "HOUSING_SCHEMA",
    "RETAILER_CATEGORICAL",
    "RETAILER_CONTINUOUS",
    "RETAILER_SCHEMA",
    "RETAILER_VARIABLE_ORDER",
    "TPCH_KEYS",
    "TPCH_TABLES",
    "Dataset",
    "DatasetSpec",
    "OrderBookRefresh",
    "StreamBatch",
    "build_stream",
    "favorita_star",
    "final_state",
    "graph_edges",
    "housing_star",
    "load_housing",
    "natural_join",
    "order_book_messages",
    "order_book_stream",
    "order_book_updates",
    "path_query_relations",
    "retailer_snowflake",
    "stream_to_frame",
    "tpch_stream",
    "tpch_tables",
]
