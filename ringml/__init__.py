"""ringml: keep ML aggregates and models fresh over normalized, changing relational data.

The engine implements F-IVM: a query over a natural join is a tree of views whose payloads
come from a ring; a batch of inserts and deletes travels from its relation's leaf to the
root once, and the join is never materialized.  ``import ringml`` loads neither pyspark nor
mlflow.
"""

from .applications import covariance_query, non_join_variables
from .batch import UpdateBatch
from .errors import BatchError, RingmlError, SchemaError, VariableOrderError
from .maintainer import STRATEGIES, Maintainer
from .microbatch import Flush, MicroBatcher
from .query import Atom, Query, natural_join_query
from .variable_order import (
    VariableOrder,
    is_acyclic,
    is_free_connex,
    is_hierarchical,
    is_q_hierarchical,
)
from .view_tree import ViewTree

__version__ = "0.1.0"

__all__ = [
    "Atom",
    "BatchError",
    "Flush",
    "Maintainer",
    "MicroBatcher",
    "Query",
    "RingmlError",
    "STRATEGIES",
    "SchemaError",
    "UpdateBatch",
    "VariableOrder",
    "VariableOrderError",
    "ViewTree",
    "covariance_query",
    "is_acyclic",
    "is_free_connex",
    "is_hierarchical",
    "is_q_hierarchical",
    "natural_join_query",
    "non_join_variables",
]
