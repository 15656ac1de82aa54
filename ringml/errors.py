"""Exceptions raised by the engine; every message names the relation, column and value."""

from __future__ import annotations


class RingmlError(Exception):
    """Base class of ringml's errors."""


class SchemaError(RingmlError, ValueError):
    """A query, relation or variable order that does not fit together."""


class VariableOrderError(SchemaError):
    """A variable order that breaks F-IVM's Definition 2 (or a requested property)."""


class BatchError(RingmlError, ValueError):
    """A rejected update batch; no view was changed."""

    def __init__(
        self,
        message: str,
        relation: str | None = None,
        column: str | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message)
        self.relation = relation
        self.column = column
        self.value = value


class InputTypeError(RingmlError, TypeError):
    """An argument of the wrong kind (a string where rows or names are expected, a
    DataFrame where update batches are expected, ...); the message says what is expected."""


class UnknownCategoryError(RingmlError, ValueError):
    """A category at predict time that the model never saw (``handle_unknown="error"``)."""

    def __init__(self, message: str, column: str, value: object) -> None:
        super().__init__(message)
        self.column = column
        self.value = value


class SubscriberError(RingmlError, RuntimeError):
    """A subscriber raised when it was handed a change.  The batch *was* applied: every
    view holds it and every other subscriber got the change.  ``errors`` pairs each
    callback that raised with its exception (the first is the ``__cause__``)."""

    def __init__(self, message: str, errors: list[tuple[object, BaseException]]) -> None:
        super().__init__(message)
        self.errors = errors
