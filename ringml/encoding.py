"""Dictionary encoding of column values to dense integer codes, once, at the edge.

Values of any type a user has (ints, floats, decimals, strings, bytes, booleans, dates,
timestamps and durations) map to codes ``0, 1, 2, ...`` per variable, shared by every
relation in which the variable occurs, so the engine joins and groups on int64 arrays
only.  Two values get one code exactly when Python finds them equal: numbers by value
across types (``1 == 1.0 == Decimal("1")``), never a number and its text (``1 != "1"``),
text and bytes (``"a" != b"a"``) or a date and its text.  NaN, None and values of other
types (tuples, lists, times of day, ...) are rejected.
"""

from __future__ import annotations

import datetime
import decimal
import numbers
from collections.abc import Sequence

import numpy as np
import pandas as pd
from pandas.api.types import infer_dtype

from .keyindex import KeyIndex

# kinds of values, kept in the key next to the value's 64 bits so kinds never collide;
# integers beyond int64 (uint64 above 2**63 - 1, big Python ints) are _BIG, keyed by a hash
# of their digits: equal to each other across column types, never to a wrapped int64.
# _TIME: tz-naive instants (ns since the epoch), _ZONED: tz-aware ones (their UTC instant:
# Python never finds a naive and an aware instant equal); _DATE: dates (their ordinal);
# _DECIMAL: decimals that no int or float equals (their normalized digits)
_INT, _FLOAT, _TEXT, _TIME, _BIG, _DURATION = 0, 1, 2, 3, 4, 5
_BYTES, _DATE, _DECIMAL, _ZONED = 6, 7, 8, 9
#: how values are keyed: a Dictionary pickled under another keying re-keys its values
_KEYING = 2
_INT64_MAX = np.iinfo(np.int64).max


def _big_int_bits(values) -> np.ndarray:
    """64-bit keys of integers beyond int64, by value (their decimal digits)."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "u":  # numpy writes the digits
        digits = values.astype(str).astype(object)
    else:
        digits = np.asarray([str(int(x)) for x in values], dtype=object)
    return pd.util.hash_array(digits, categorize=False).view(np.int64)


def _float_keys(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kind, bits) of float64 values, by value: an integral float is the same number as
    the integer (``2.0**60 == 2**60``): _INT in int64's range, _BIG beyond it; other floats
    (and NaN, inf) are _FLOAT with their bits.  Python ints only for floats beyond int64."""
    values = values.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        as_int = values.astype(np.int64)
    inside = (values >= -(2.0**63)) & (values < 2.0**63)
    integral = inside & (as_int == values)  # -0.0 -> 0
    kinds = np.where(integral, _INT, _FLOAT)
    bits = np.where(integral, as_int, values.view(np.int64))
    big = np.flatnonzero(~inside & np.isfinite(values))  # every such float is integral
    if big.size:
        kinds[big] = _BIG
        bits[big] = _big_int_bits(values[big])
    return kinds, bits


def key_array(values) -> np.ndarray:
    """``values`` (an array, or a list or tuple of values) as an array of keys: a list mixing
    types is kept as objects, since numpy would coerce it (``["a", 1]`` to the texts
    ``"a", "1"``; ``[2**53 + 1, 0.5]`` to floats that round the integer)."""
    if isinstance(values, list | tuple) and len({type(v) for v in values}) > 1:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    return np.asarray(values)


def fits_int64(values: np.ndarray) -> bool:
    """An integer or boolean column whose values all fit int64 (uint64 may not)."""
    return values.dtype.kind != "u" or not values.size or int(values.max()) <= _INT64_MAX


def factorize(
    values: np.ndarray, sort: bool = False, use_na_sentinel: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` with strings equal exactly when Python finds them equal: pandas
    hashes an array of nothing but strings as C strings, cut at their first NUL character
    (``"a"`` and ``"a\\x00"`` were one value, ranked as one by ``sort``).  Such an array
    with a NUL in it is factorized with a NULL appended: pandas then hashes Python
    objects."""
    values = np.asarray(values)
    if values.dtype.kind == "U":
        values = values.astype(object)
    if values.dtype == object and _nul_in_text(values):
        codes, uniques = pd.factorize(np.append(values, None), sort=sort)
        return codes[:-1], uniques
    return pd.factorize(values, sort=sort, use_na_sentinel=use_na_sentinel)


def _nul_in_text(values: np.ndarray) -> bool:
    """Whether an object array holds only strings and one has a NUL character (one pass
    over the text; pandas hashes an array holding anything else as Python objects)."""
    try:
        return "\x00" in "".join(values.tolist())
    except TypeError:
        return False


def factorize_rows(columns: Sequence[np.ndarray]) -> np.ndarray:
    """One code per row of aligned ``columns``, equal exactly for the rows equal in every
    column (:func:`factorize`'s equality, NULLs equal to each other), numbered in order of
    first appearance."""
    key, bound = np.zeros(len(columns[0]), dtype=np.int64), 1
    for values in columns:
        codes, uniques = factorize(values, use_na_sentinel=False)
        if bound * len(uniques) >= 2**62:
            key, kept = pd.factorize(key)
            bound = len(kept)
        key = key * len(uniques) + codes
        bound *= len(uniques)
    return pd.factorize(key)[0].astype(np.int64, copy=False)


class EncodingError(ValueError):
    """A value that cannot be encoded (NaN, None); ``position`` is its row in the column."""

    def __init__(self, message: str, position: int, value: object) -> None:
        super().__init__(message)
        self.position = position
        self.value = value


def _value_keys(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 2) int64 keys ``(kind, bits)`` for a column; also the values as stored objects."""
    n = values.shape[0]
    keys = np.empty((n, 2), dtype=np.int64)
    kind = values.dtype.kind
    if kind in "iub":
        keys[:, 0] = _INT
        keys[:, 1] = values.astype(np.int64)
        if not fits_int64(values):
            big = np.flatnonzero(values > _INT64_MAX)
            keys[big, 0] = _BIG
            keys[big, 1] = _big_int_bits(values[big])
        return keys, values
    if kind == "f":
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(bad[0])
            raise EncodingError(f"value {values[i]!r} cannot be a key", i, values[i])
        keys[:, 0], keys[:, 1] = _float_keys(values)
        return keys, values
    if kind in "mM":
        if np.isnat(values).any():
            i = int(np.flatnonzero(np.isnat(values))[0])
            raise EncodingError("missing date/time value (NaT) cannot be a key", i, values[i])
        # instants and durations are different kinds: 1 ns after the epoch is not 1 ns
        keys[:, 0] = _TIME if kind == "M" else _DURATION
        unit = "datetime64[ns]" if kind == "M" else "timedelta64[ns]"
        nanoseconds = values.astype(unit)
        wrapped = nanoseconds.astype(values.dtype) != values  # numpy casts out of range silently
        if wrapped.any():
            i = int(np.flatnonzero(wrapped)[0])
            raise EncodingError(
                f"value {values[i]!r} is outside the range of nanosecond times (1677 to 2262) "
                "that keys hold",
                i,
                values[i],
            )
        keys[:, 1] = nanoseconds.view(np.int64)
        return keys, values
    objects = values.astype(object)
    missing = pd.isna(objects)
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise EncodingError(f"missing value {objects[i]!r} cannot be a key", i, objects[i])
    inferred = infer_dtype(objects, skipna=False)
    if inferred in ("string", "bytes"):  # one C pass: no numbers
        # the same hashes as categorize=True gives text, 2-6x faster on any number of values
        keys[:, 0] = _TEXT if inferred == "string" else _BYTES
        keys[:, 1] = pd.util.hash_array(objects, categorize=False).view(np.int64)
        return keys, objects
    _object_keys(objects, keys)
    return keys, objects


def _object_kind(x: object) -> int:
    """The kind of one value of an object column (-1: a type that cannot be a key)."""
    if isinstance(x, str):
        return _TEXT
    if isinstance(x, np.timedelta64):  # numpy registers it as an Integral
        return _DURATION
    if isinstance(x, numbers.Integral | np.bool_):
        return _INT
    if isinstance(x, numbers.Real):
        return _FLOAT
    if isinstance(x, bytes):
        return _BYTES
    if isinstance(x, decimal.Decimal):
        return _DECIMAL
    if isinstance(x, datetime.datetime | np.datetime64):  # pd.Timestamp too
        return _TIME
    if isinstance(x, datetime.date):
        return _DATE
    if isinstance(x, datetime.timedelta | np.timedelta64):  # pd.Timedelta too
        return _DURATION
    return -1


def _object_keys(objects: np.ndarray, keys: np.ndarray) -> None:
    """Fill ``keys`` with the (kind, bits) of an object column's values of any types."""
    n = objects.size
    kinds = np.fromiter(map(_object_kind, objects), dtype=np.int64, count=n)
    if (kinds < 0).any():
        i = int(np.flatnonzero(kinds < 0)[0])
        raise EncodingError(
            f"value {objects[i]!r} of type {type(objects[i]).__name__} cannot be a key (keys "
            "are numbers, text, bytes, booleans, dates, timestamps and durations; a time of day "
            "is not)",
            i,
            objects[i],
        )
    keys[:, 0] = kinds
    for kind in (_TEXT, _BYTES):
        rows = np.flatnonzero(kinds == kind)
        if rows.size:
            keys[rows, 1] = pd.util.hash_array(objects[rows], categorize=False).view(np.int64)
    ints = [int(x) for x in objects[kinds == _INT]]
    int_rows = list(np.flatnonzero(kinds == _INT))
    floats = [float(x) for x in objects[kinds == _FLOAT]]
    float_rows = list(np.flatnonzero(kinds == _FLOAT))
    for i in np.flatnonzero(kinds == _DECIMAL):  # as the int or float equal to it, if any
        d = objects[i]
        if not d.is_finite():
            raise EncodingError(f"value {d!r} cannot be a key", int(i), d)
        if d == d.to_integral_value():
            ints.append(int(d))
            int_rows.append(i)
        elif decimal.Decimal(float(d)) == d:
            floats.append(float(d))
            float_rows.append(i)
        else:
            digits = np.array([str(d.normalize())], dtype=object)
            keys[i, 1] = pd.util.hash_array(digits, categorize=False).view(np.int64)[0]
    _number_keys(ints, np.asarray(int_rows, dtype=np.int64), keys)
    if floats:
        rows = np.asarray(float_rows, dtype=np.int64)
        try:
            keys[rows] = _value_keys(np.asarray(floats, dtype=np.float64))[0]
        except EncodingError as error:
            i = int(rows[error.position])
            raise EncodingError(str(error), i, objects[i]) from None
    for i in np.flatnonzero((kinds == _TIME) | (kinds == _DURATION)):
        x = objects[i]
        try:
            value = pd.Timestamp(x) if kinds[i] == _TIME else pd.Timedelta(x)
            keys[i, 1] = value.as_unit("ns").value
        except (OverflowError, ValueError):  # pandas' OutOfBounds errors are ValueErrors
            raise EncodingError(
                f"date/time value {x!r} is beyond the nanosecond range (years 1677-2262) and "
                "cannot be a key",
                int(i),
                x,
            ) from None
        if kinds[i] == _TIME and value.tzinfo is not None:
            keys[i, 0] = _ZONED
    for i in np.flatnonzero(kinds == _DATE):
        keys[i, 1] = objects[i].toordinal()


def _number_keys(ints: list[int], rows: np.ndarray, keys: np.ndarray) -> None:
    """Keys of Python ints at ``rows``: _INT in int64's range, _BIG beyond it."""
    if not ints:
        return
    fits = np.asarray([-(2**63) <= x < 2**63 for x in ints], dtype=bool)
    keys[rows, 0] = np.where(fits, _INT, _BIG)
    if fits.all():
        keys[rows, 1] = np.asarray(ints, dtype=np.int64)
        return
    values = np.asarray(ints, dtype=object)
    keys[rows[fits], 1] = values[fits].astype(np.int64)
    keys[rows[~fits], 1] = _big_int_bits(values[~fits])


def _as_objects(values: np.ndarray) -> np.ndarray:
    """Values as an object array of what a user put in: numpy turns datetime64[ns] and
    timedelta64[ns] into plain integers when cast to object, pandas into Timestamps and
    Timedeltas."""
    if values.dtype.kind in "mM":
        return pd.Series(values).to_numpy(dtype=object)
    return np.asarray(values, dtype=object)


class Dictionary:
    """The codes of one variable: ``encode`` assigns new codes, ``decode`` maps codes back."""

    def __init__(self, name: str) -> None:
        self.name = name
        # one index per kind of value (ints use direct addressing when dense), slot -> code
        self._indices: dict[int, tuple[KeyIndex, np.ndarray]] = {}
        self._size = 0
        # values by code, and their numbers, in arrays that grow in place (amortized O(1)
        # per new value: a batch adding codes must not copy what is known already)
        self._store = np.empty(0, dtype=object)
        self._numbers: np.ndarray | None = None  # int64 or float64, the first _counted codes
        self._counted = 0
        self._keying = _KEYING

    def __setstate__(self, state: dict) -> None:
        if "_values" in state:  # pickled before the values grew in place
            parts = state.pop("_values")
            state["_store"] = np.concatenate(parts) if parts else np.empty(0, dtype=object)
            state.pop("_decoded", None)
            state.pop("_numeric", None)
            state["_numbers"], state["_counted"] = None, 0
        self.__dict__.update(state)
        if state.get("_keying") != _KEYING:
            self._rekey()

    def _rekey(self) -> None:
        """Index the known values as they are keyed now (a dictionary pickled under an
        earlier keying).  Each keeps its code; a value that can no longer be a key, or the
        later of two that are now one key, is still decoded but found by no lookup."""
        keys, codes = [], []
        for code, value in enumerate(self.values):
            try:
                keys.append(_value_keys(np.array([value], dtype=object))[0][0])
            except EncodingError:
                continue
            codes.append(code)
        self._indices = {}
        if keys:
            unique, first = np.unique(np.asarray(keys), axis=0, return_index=True)
            self._index(unique, np.asarray(codes, dtype=np.int64)[first])
        self._keying = _KEYING

    def __len__(self) -> int:
        return self._size

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        codes = np.full(keys.shape[0], -1, dtype=np.int64)
        kinds = keys[:, 0]
        first = kinds[0] if kinds.size else 0
        groups = (
            [(first, None)]
            if (kinds == first).all()
            else [(k, np.flatnonzero(kinds == k)) for k in np.unique(kinds)]
        )
        for kind, rows in groups:
            if int(kind) not in self._indices:
                continue
            index, slot_code = self._indices[int(kind)]
            bits = keys[:, 1] if rows is None else keys[rows, 1]
            slots = index.lookup(bits[:, None])
            found = np.where(slots >= 0, slot_code[np.maximum(slots, 0)], -1)
            if rows is None:
                codes = found
            else:
                codes[rows] = found
        return codes

    def lookup(self, values: np.ndarray) -> np.ndarray:
        """Codes of known values, -1 for unknown ones; never assigns codes."""
        keys, _ = _value_keys(key_array(values))
        return self._lookup(keys)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Codes of ``values``, assigning fresh codes to unseen values."""
        values = np.asarray(values)
        if values.dtype.kind in "iub" and values.size and fits_int64(values):
            return self._encode_ints(values)
        keys, stored = _value_keys(values)
        codes = self._lookup(keys)
        unseen = codes < 0
        if unseen.any():
            fresh = keys[unseen]
            if (fresh[:, 0] == fresh[0, 0]).all():  # one kind: the same order, a 1-d sort
                bits, first, inverse = np.unique(
                    fresh[:, 1], return_index=True, return_inverse=True
                )
                unique_keys = np.empty((bits.size, 2), dtype=np.int64)
                unique_keys[:, 0], unique_keys[:, 1] = fresh[0, 0], bits
            else:
                unique_keys, first, inverse = np.unique(
                    fresh, axis=0, return_index=True, return_inverse=True
                )
            new_codes = np.arange(self._size, self._size + unique_keys.shape[0], dtype=np.int64)
            self._index(unique_keys, new_codes)
            positions = np.flatnonzero(unseen)[first]
            self._append(_as_objects(stored[positions]))
            codes[unseen] = new_codes[inverse.ravel()]
        return codes

    def _index(self, unique_keys: np.ndarray, codes: np.ndarray) -> None:
        """Index distinct (kind, bits) keys not indexed yet under their codes."""
        for kind in np.unique(unique_keys[:, 0]):
            rows = np.flatnonzero(unique_keys[:, 0] == kind)
            index, slot_code = self._indices.get(
                int(kind), (KeyIndex(1), np.zeros(0, dtype=np.int64))
            )
            slots, _ = index.get_or_insert(unique_keys[rows, 1][:, None])
            if index.capacity > slot_code.size:
                grown = np.full(index.capacity, -1, dtype=np.int64)
                grown[: slot_code.size] = slot_code
                slot_code = grown
            slot_code[slots] = codes[rows]
            self._indices[int(kind)] = (index, slot_code)

    def _encode_ints(self, values: np.ndarray) -> np.ndarray:
        """``encode`` of integers (or booleans) that fit int64: one lookup, and the unseen
        values get codes in increasing order, as the general path gives them."""
        ints = values.astype(np.int64, copy=False)
        index, slot_code = self._indices.get(_INT, (None, None))
        if index is None:
            index, slot_code = KeyIndex(1), np.zeros(0, dtype=np.int64)
            codes = np.full(ints.size, -1, dtype=np.int64)
        else:
            slots = index.lookup(ints[:, None])
            if slots.min() >= 0:  # all known
                return slot_code[slots]
            codes = np.where(slots >= 0, slot_code[np.maximum(slots, 0)], -1)
        unseen = np.flatnonzero(codes < 0)
        fresh, first, inverse = np.unique(ints[unseen], return_index=True, return_inverse=True)
        new_codes = np.arange(self._size, self._size + fresh.size, dtype=np.int64)
        slots, _ = index.get_or_insert(fresh[:, None])
        if index.capacity > slot_code.size:
            grown = np.full(index.capacity, -1, dtype=np.int64)
            grown[: slot_code.size] = slot_code
            slot_code = grown
        slot_code[slots] = new_codes
        self._indices[_INT] = (index, slot_code)
        self._append(_as_objects(values[unseen[first]]))
        codes[unseen] = new_codes[inverse.ravel()]
        return codes

    def _append(self, values: np.ndarray) -> None:
        """Store the values of the next codes."""
        end = self._size + values.size
        if end > self._store.size:
            grown = np.empty(max(end, 2 * self._store.size, 16), dtype=object)
            grown[: self._size] = self._store[: self._size]
            self._store = grown
        self._store[self._size : end] = values
        self._size = end

    @property
    def values(self) -> np.ndarray:
        """All known values, indexed by code (an object array; a view, do not modify)."""
        return self._store[: self._size]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Values of ``codes``."""
        return self.values[np.asarray(codes, dtype=np.int64)]

    def numeric(self, codes: np.ndarray) -> np.ndarray:
        """Values of ``codes`` as numbers (for lifting join variables): int64 while every value
        is an integer (exact beyond 2**53), else float64 with NaN where not numeric.  Only
        the values coded since the last call are converted."""
        if self._counted < self._size:
            self._count_new()
        numbers = self._numbers if self._numbers is not None else np.zeros(0, dtype=np.int64)
        return numbers[np.asarray(codes, dtype=np.int64)]  # no value yet: only no codes

    def _count_new(self) -> None:
        new = pd.to_numeric(pd.Series(self._store[self._counted : self._size]), errors="coerce")
        ints = new.dtype.kind == "i" and (self._numbers is None or self._numbers.dtype.kind == "i")
        dtype = np.int64 if ints else np.float64
        fresh = new.to_numpy(dtype=dtype) if ints else new.to_numpy(np.float64, na_value=np.nan)
        numbers = self._numbers
        if numbers is None or numbers.dtype != dtype or numbers.size < self._size:
            grown = np.empty(max(self._size, 2 * (0 if numbers is None else numbers.size)), dtype)
            if numbers is not None:
                grown[: self._counted] = numbers[: self._counted]
            numbers = grown
        numbers[self._counted : self._size] = fresh
        self._numbers, self._counted = numbers, self._size
