"""The engine-independent container for a normalized dataset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

__all__ = ["Dataset", "DatasetSpec", "natural_join"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A normalized database plus the metadata the F-IVM experiments need.

    Attributes:
        name: short identifier (``"housing"``, ``"retailer"``, ...).
        relations: relation name -> DataFrame; column order is the schema order.
        join_variables: variables shared between relations (the join keys).
        continuous: non-join variables treated as continuous (schema order).
        categorical: non-join variables treated as categorical (schema order).
        label: the regression label, if any (one of ``continuous``).
        description: one-paragraph description (provenance, variable order, caveats).
        variable_order: the paper's variable order for the join variables, as text.
    """

    name: str
    relations: dict[str, pd.DataFrame]
    join_variables: list[str]
    continuous: list[str]
    categorical: list[str]
    label: str | None = None
    description: str = ""
    variable_order: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cols = {c for df in self.relations.values() for c in df.columns}
        joins, cont, cat = set(self.join_variables), set(self.continuous), set(self.categorical)
        if cont & cat or (cont | cat) & joins:
            raise ValueError("join, continuous and categorical variables must be disjoint")
        if cols != joins | cont | cat:
            raise ValueError(
                f"variables {sorted(cols ^ (joins | cont | cat))} are not classified or absent"
            )
        if self.label is not None and self.label not in cols:
            raise ValueError(f"label {self.label!r} is not a column")

    @property
    def schemas(self) -> dict[str, list[str]]:
        """Relation name -> column names in schema order."""
        return {r: list(df.columns) for r, df in self.relations.items()}

    @property
    def variables(self) -> list[str]:
        """All non-join variables, in schema order (relation by relation)."""
        joins, seen, out = set(self.join_variables), set(), []
        for df in self.relations.values():
            for c in df.columns:
                if c not in joins and c not in seen:
                    seen.add(c)
                    out.append(c)
        return out

    def join(self) -> pd.DataFrame:
        """The natural join of all relations (pandas; for small data and oracles)."""
        return natural_join(self.relations)

    def sizes(self) -> dict[str, int]:
        """Relation name -> number of tuples."""
        return {r: len(df) for r, df in self.relations.items()}

    def __repr__(self) -> str:
        sizes = ", ".join(f"{r}={n}" for r, n in self.sizes().items())
        return (
            f"Dataset({self.name!r}: {sizes}; {len(self.continuous)} continuous, "
            f"{len(self.categorical)} categorical, label={self.label!r})"
        )


#: Alias: the brief calls the same structure a ``DatasetSpec``.
DatasetSpec = Dataset


def natural_join(relations: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Natural join of the frames (pandas inner merges on shared columns).

    Joins in mapping order, but always next merges a relation that shares a column with
    the result so far (a cross product only if none does).  Materializes the result:
    meant for small databases and test oracles.
    """
    todo = list(relations.values())
    if not todo:
        raise ValueError("no relations")
    out = todo.pop(0)
    while todo:
        cols = set(out.columns)
        i = next((j for j, df in enumerate(todo) if cols & set(df.columns)), 0)
        df = todo.pop(i)
        on = [c for c in df.columns if c in cols]
        out = out.merge(df, on=on, how="inner") if on else out.merge(df, how="cross")
    return out
