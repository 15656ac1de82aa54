"""SQL views on the F-IVM engine (GraphIVM-style): ``CREATE TABLE`` catalogs, views defined
by SELECT statements, kept fresh through inserts, deletes and updates, read as DataFrames or
Arrow tables or subscribed to as diffs.

Parsing is sqlglot's (imported here, never by ``import ringml``); the compiler binds names,
checks types and turns a SELECT into one engine query over its FROM items -- plus, beyond
select-project-join-aggregate, hidden keys, a residual filter and views of its subqueries
and aggregate derived tables (MIN/MAX, DISTINCT aggregates, inequality joins, OR across
tables, scalar/IN/EXISTS/ALL/ANY subqueries, HAVING: see :mod:`ringml.sql.compiler`);
errors name the construct and its line and column.  DBToaster's Fig. 7 queries are in
:mod:`ringml.sql.dbtoaster_queries`.  :func:`training_join` turns a SELECT of feature columns
FROM a join into the covariance query a model keeps fresh (the estimators take SQL text too).
:class:`StreamDatabase` adds stream tables and views over windows of them (``RANGE 10
MINUTES``), their expired rows applied as deletes.
"""

from .catalog import Catalog, TableSchema
from .compiler import compile_view
from .errors import (
    SqlError,
    SqlNameError,
    SqlSemanticError,
    SqlSyntaxError,
    SqlTypeError,
    SqlUnsupportedError,
)
from .logical import ViewPlan
from .streams import StreamDatabase
from .training import Feed, TrainingJoin, training_join
from .views import Database, Subscription, View

__all__ = [
    "Catalog",
    "Database",
    "Feed",
    "SqlError",
    "SqlNameError",
    "SqlSemanticError",
    "SqlSyntaxError",
    "SqlTypeError",
    "SqlUnsupportedError",
    "StreamDatabase",
    "Subscription",
    "TableSchema",
    "TrainingJoin",
    "View",
    "ViewPlan",
    "compile_view",
    "training_join",
]
