"""Groups of a maintained result with their payloads: the result itself, or its change.

:class:`Groups` holds group keys (codes, decoded on demand), one payload per group (a ring
batch) and its exact number of derivations.  ``Maintainer.apply`` returns the *change* of
the result as one (:data:`ResultDelta`): per changed group the payload change and the change
of the count -- a group appears when its count goes from 0 to positive and vanishes when it
drops to 0 (F-IVM Remark 1).  ``Maintainer.groups`` gives the current result in the same
form.  Without free variables the result is one payload keyed by ``()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import pandas as pd

from .errors import SubscriberError
from .rings.base import Ring


class Groups:
    """``free`` group columns (:attr:`codes`), :attr:`payload` (a ring batch) and
    :attr:`support` (derivation counts; None when they are not kept), one entry per group.

    A delta is built from the root's deltas as the engine computed them; groups whose
    changes cancelled out are dropped the first time it is read, so an apply whose delta
    nobody reads pays nothing for it.
    """

    __slots__ = (
        "free", "ring", "_decoder", "_codes", "_payload", "_support", "_previous", "_settled"
    )  # fmt: skip

    def __init__(
        self,
        free: tuple[str, ...],
        codes: np.ndarray,
        payload: object,
        support: np.ndarray | None,
        ring: Ring,
        decoder: Callable[[str, np.ndarray], np.ndarray],
        prune: bool = False,
        previous: object | None = None,
    ) -> None:
        """``prune``: drop, when first read, the groups whose payload and count are zero
        (the cancelled changes of a delta); ``previous``: a delta's groups' payloads before
        the change (see :attr:`previous`)."""
        self.free = free
        self.ring = ring
        self._decoder = decoder
        self._codes, self._payload, self._support = codes, payload, support
        self._previous = previous
        self._settled = not prune

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
            if self._previous is not None:
                self._previous = self.ring.batch_take(self._previous, keep)

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

    @property
    def previous(self) -> object | None:
        """A delta's groups' payloads before the apply (zero for new groups), exactly as
        they were read; None unless the maintainer :attr:`~Maintainer.keep_previous`."""
        self._settle()
        return self._previous

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
        change) and ``support`` (the change of the derivation count); those two names take
        a trailing ``_`` while a free variable has them."""
        frame = pd.DataFrame(self.columns(), columns=list(self.free))
        frame[_fresh("payload", frame.columns)] = [value(p) for p in self.payloads()]
        if self.support is not None:
            frame[_fresh("support", frame.columns)] = self.support
        return frame

    def __repr__(self) -> str:
        return f"Groups({len(self)} group(s) over {list(self.free)})"


def _fresh(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name


#: The change of a result caused by one apply: per changed group, payload and count changes.
ResultDelta = Groups


Delivery = tuple[Callable[[object], object], object]

#: The deliveries held back in this context (see :func:`held_deliveries`), or None.
_HELD: ContextVar[list[Delivery] | None] = ContextVar("ringml_held_deliveries", default=None)


def notify(deliveries: Iterable[Delivery]) -> None:
    """Call ``callback(change)`` for every pair, also after one raised; then
    :class:`~ringml.errors.SubscriberError` (the changes were applied) if any did.
    Inside :func:`held_deliveries` the pairs are collected instead, and nobody is called."""
    held = _HELD.get()
    if held is not None:
        held.extend(deliveries)
        return
    errors: list[tuple[object, BaseException]] = []
    for callback, change in list(deliveries):
        try:
            callback(change)
        except Exception as error:  # an interrupt stops at once; anything else waits
            errors.append((callback, error))
    if errors:
        raise SubscriberError(
            f"{len(errors)} subscriber(s) raised when handed the change of an applied batch "
            f"(it stays applied; every other subscriber got it): {errors[0][1]!r}",
            errors,
        ) from errors[0][1]


@contextmanager
def held_deliveries() -> Iterator[list[Delivery]]:
    """Collect what :func:`notify` would deliver in this block (the list yielded) instead
    of calling the subscribers: an apply spanning several targets (a windowed stream) hands
    its diffs over with ``notify(held)`` once every target took the batch, and drops them
    if one refused it (the earlier targets are then undone, their diffs never seen)."""
    held: list[Delivery] = []
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)
