"""The change of a maintained result caused by one apply (a view diff).

:class:`ResultDelta` holds, for every group of the result that changed, its group key (codes,
decoded on demand), the change of its payload and the change of its exact derivation count.
A group *appears* when its count goes from 0 to positive and *vanishes* when it drops to 0
(F-IVM Remark 1); a group whose payload changed keeps its count.  Without free variables the
result is one payload and the delta has at most one entry, keyed by ``()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from .rings.base import Ring


class ResultDelta:
    """``free`` group columns (:attr:`codes`), :attr:`payload` changes (a ring batch) and
    :attr:`support` changes (derivation counts; None when deletes are not checked), one
    entry per changed group.

    Built from the root's deltas as the engine computed them; groups whose changes
    cancelled out are dropped the first time the delta is read, so an apply whose delta
    nobody reads pays nothing for it.
    """

    __slots__ = ("free", "ring", "_decoder", "_codes", "_payload", "_support", "_settled")

    def __init__(
        self,
        free: tuple[str, ...],
        codes: np.ndarray,
        payload: object,
        support: np.ndarray | None,
        ring: Ring,
        decoder: Callable[[str, np.ndarray], np.ndarray],
    ) -> None:
        self.free = free
        self.ring = ring
        self._decoder = decoder
        self._codes, self._payload, self._support = codes, payload, support
        self._settled = False

    def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        if not len(self._codes):
            return
        changed = ~self.ring.batch_is_zero(self._payload)
        if self._support is not None:
            changed |= self._support != 0
        if not changed.all():
            keep = np.flatnonzero(changed)
            self._codes = self._codes[keep]
            self._payload = self.ring.batch_take(self._payload, keep)
            self._support = None if self._support is None else self._support[keep]

    @property
    def codes(self) -> np.ndarray:
        """``(n, len(free))`` int64 group codes."""
        self._settle()
        return self._codes

    @property
    def payload(self) -> object:
        """The payload changes, a ring batch of ``n``."""
        self._settle()
        return self._payload

    @property
    def support(self) -> np.ndarray | None:
        """The changes of the groups' derivation counts."""
        self._settle()
        return self._support

    def __len__(self) -> int:
        return self.codes.shape[0]

    def __bool__(self) -> bool:
        return len(self) > 0

    def columns(self) -> dict[str, np.ndarray]:
        """The decoded group values, one array per free variable."""
        return {v: self._decoder(v, self.codes[:, j]) for j, v in enumerate(self.free)}

    def keys(self) -> list[tuple]:
        """The changed groups' values, as tuples in :attr:`free` order."""
        if not self.free:
            return [()] * len(self)
        return list(zip(*self.columns().values(), strict=True))

    def payloads(self) -> list:
        """The payload changes as scalar ring elements."""
        return self.ring.batch_to_list(self.payload)

    def items(self) -> Iterator[tuple[tuple, object]]:
        """``(group values, payload change)`` pairs."""
        return iter(zip(self.keys(), self.payloads(), strict=True))

    def to_dict(self) -> dict[tuple, object]:
        return dict(self.items())

    def to_frame(self, value: Callable = lambda p: p) -> pd.DataFrame:
        """One row per changed group: the free variables, ``payload`` (``value`` of the
        change) and ``support`` (the change of the derivation count)."""
        frame = pd.DataFrame(self.columns(), columns=list(self.free))
        frame["payload"] = [value(p) for p in self.payloads()]
        if self.support is not None:
            frame["support"] = self.support
        return frame

    def __repr__(self) -> str:
        return f"ResultDelta({len(self)} group(s) changed over {list(self.free)})"
