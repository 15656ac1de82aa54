"""Stream tables partitioned by event time, windows over them, watermarks and expiry.

ViewDF (seed ``001_*``) keeps views over append-only stream tables partitioned by time; a
sliding window's expired partitions act as deletes.  Here a :class:`WindowedStream` owns
the stream tables of one or more *targets* -- a :class:`ringml.Maintainer`, a
``DistributedMaintainer``, a :class:`ringml.sql.Database` (its SQL views see the window),
a :class:`MinMaxView` -- and feeds them:

* a :class:`StreamTable` assigns every row to partition ``k = floor((t - origin) / width)``
  of its event-time column: numbers, datetimes (ISO date texts of any string dtype too) or
  durations (timedelta64), the kind fixed by the first row;
* the **watermark** is the largest event time seen minus ``lateness`` (or set further with
  :meth:`WindowedStream.advance_watermark`, a finite time); it never goes back.  A row
  behind the watermark (``t < watermark`` as it was before the batch) is *late*: rejected with
  :class:`LateEventError` (``late="reject"``, the batch changes nothing) or kept in
  :meth:`WindowedStream.dead_letters` (``late="dead_letter"``, the rest is applied);
* a :class:`Window` says which partitions a target sees: ``RANGE n`` keeps partition ``k``
  until the watermark passes its end by ``n`` (``end_k + n <= watermark`` expires it: with
  ``W = n / width`` the window is ViewDF's ``S[i-W+1 .. i]`` over the last complete
  partition ``i``, plus the partitions still filling), ``PARTITIONS a TO b`` the fixed
  partitions ``a..b``, ``UNBOUNDED`` everything;
* rows that leave the window are sent as **one delete batch per table** in the same atomic
  ``apply`` as the batch's inserts, so every view equals a from-scratch evaluation over the
  rows inside the window after every batch.  Expiry costs the expired rows: partitions are
  buffered as the frames that arrived and dropped whole.  Subscribers of the targets get
  their diffs once every target took the batch: a batch one target refuses (the others
  are undone) publishes nothing.

Non-invertible aggregates stay exact under expiry: :class:`MinMaxView` keeps, per group,
the multiset of values with their counts (sorted fixed-width keys on numpy arrays), so a
deleted maximum falls back to the next value without rescanning the window.  ViewDF's
pattern views (sequences of events per key, its View2 example) run as :class:`PatternView`:
an FSM whose state per key is carried in a helper state view from one complete partition
to the next (``Helper[i] = step(Helper[i-1], S[i])``, ``View2[i] = Helper[i]`` in the
final state).

Example: a windowed SUM per source, over the last two minutes of a stream in seconds::

    >>> import pandas as pd
    >>> from ringml import Maintainer, Query
    >>> from ringml.rings.scalar import RealRing
    >>> from ringml.windows import StreamTable, WindowedStream
    >>> view = Maintainer(Query({"S": ["ts", "src", "loss"]}, RealRing(["loss"]), free=["src"]))
    >>> stream = WindowedStream(
    ...     view, {"S": StreamTable("ts", partition=60, window="RANGE 120")}, lateness=10
    ... )
    >>> _ = stream.insert("S", pd.DataFrame({"ts": [0, 70], "src": ["a", "a"], "loss": [5.0, 9.0]}))
    >>> view.result()
    {('a',): 14.0}
    >>> _ = stream.insert("S", pd.DataFrame({"ts": [195], "src": ["a"], "loss": [1.0]}))
    >>> stream.watermark  # 195 - 10 passed the end of partition 0 (60) by 120: it expired
    185.0
    >>> view.result()
    {('a',): 10.0}
"""

from __future__ import annotations

import bisect
import datetime
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .batch import UpdateBatch, as_frame
from .delta import held_deliveries, notify
from .encoding import Dictionary, EncodingError, factorize_rows
from .errors import BatchError, InputTypeError, RingmlError, SchemaError, SubscriberError
from .rings.scalar import INT64_MAX

__all__ = [
    "LateEventError",
    "MinMaxView",
    "Pattern",
    "PatternView",
    "StreamTable",
    "Window",
    "WindowedStream",
    "parse_duration",
]

Duration = float | int | pd.Timedelta | str

_UNITS = {
    "NANOSECOND": "ns",
    "MICROSECOND": "us",
    "MILLISECOND": "ms",
    "SECOND": "s",
    "MINUTE": "min",
    "HOUR": "h",
    "DAY": "D",
    "WEEK": "W",
}


class LateEventError(BatchError):
    """Rows behind the watermark (``late="reject"``); nothing was applied."""


def parse_duration(value: Duration) -> float | pd.Timedelta:
    """A number (event-time units) or a :class:`pandas.Timedelta`, from a number, a
    Timedelta or text: ``"600"``, ``"10 MINUTES"``, ``"1 hour"``, ``"90s"``.  Infinite and
    NaN durations (``"inf"``, ``"nan"``, NaT) are refused: they would freeze a watermark or
    break partition numbers."""
    out = _read_duration(value)
    if out is pd.NaT or (not isinstance(out, pd.Timedelta) and not np.isfinite(out)):
        raise InputTypeError(f"a duration is finite, got {value!r}")
    return out


def _read_duration(value: Duration) -> Any:
    if isinstance(value, pd.Timedelta):
        return value
    if isinstance(value, np.timedelta64 | datetime.timedelta):
        return pd.Timedelta(value)
    if isinstance(value, bool) or not isinstance(value, int | float | str | np.number):
        raise InputTypeError(f"a duration is a number, a Timedelta or text, got {value!r}")
    if not isinstance(value, str):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]+?)S?", text.upper())
    if match and match.group(2) in _UNITS:
        return pd.Timedelta(float(match.group(1)), unit=_UNITS[match.group(2)])
    try:
        return pd.Timedelta(text)
    except ValueError:
        raise InputTypeError(
            f"cannot read the duration {value!r} (write e.g. 600, '10 MINUTES', '1 hour')"
        ) from None


@dataclass(frozen=True)
class Window:
    """Which partitions of a stream table a target sees.

    ``Window.range(n)``: the last ``n`` time units -- partition ``k`` expires once the
    watermark reaches ``end_k + n`` (``n`` a multiple of the partition width);
    ``Window.partitions(a, b)``: the partitions ``a..b`` (inclusive, ViewDF's ``S[a..b]``);
    ``Window.unbounded()``: every row, nothing expires.  The window slides by the
    partition width of its stream table (ViewDF's basic window).  :meth:`parse` reads
    ``"RANGE 10 MINUTES"``, ``"RANGE 600"``, ``"PARTITIONS 3 TO 5"``, ``"UNBOUNDED"``.
    """

    kind: str = "unbounded"
    length: float | pd.Timedelta | None = None
    first: int | None = None
    last: int | None = None

    @classmethod
    def range(cls, length: Duration) -> Window:
        length = parse_duration(length)
        if (length.value if isinstance(length, pd.Timedelta) else length) <= 0:
            raise InputTypeError(f"a RANGE window needs a positive length, got {length!r}")
        return cls("range", length)

    @classmethod
    def partitions(cls, first: int, last: int) -> Window:
        try:
            whole = int(first) == first and int(last) == last and first <= last
        except (TypeError, ValueError, OverflowError):  # NaN, inf, text: not integers
            whole = False
        if not whole:
            raise InputTypeError(f"PARTITIONS needs integers first <= last, got {first}, {last}")
        return cls("partitions", None, int(first), int(last))

    @classmethod
    def unbounded(cls) -> Window:
        return cls("unbounded")

    @classmethod
    def parse(cls, text: str | Window | None) -> Window:
        """A window from its text (see the class docs), a Window, or None (unbounded)."""
        if text is None:
            return cls.unbounded()
        if isinstance(text, Window):
            return text
        if not isinstance(text, str):
            raise InputTypeError(f"a window is text such as 'RANGE 10 MINUTES', got {text!r}")
        words = text.strip()
        upper = words.upper()
        if upper == "UNBOUNDED":
            return cls.unbounded()
        if upper.startswith("RANGE "):
            return cls.range(words[6:].strip())
        match = re.fullmatch(r"PARTITIONS\s+(-?\d+)\s*(?:TO|\.\.)\s*(-?\d+)", upper)
        if match:
            return cls.partitions(int(match.group(1)), int(match.group(2)))
        raise InputTypeError(
            f"cannot read the window {text!r}: write 'RANGE <n> [unit]', "
            "'PARTITIONS <a> TO <b>' or 'UNBOUNDED'"
        )

    def __str__(self) -> str:
        if self.kind == "range":
            return f"RANGE {self.length}"
        if self.kind == "partitions":
            return f"PARTITIONS {self.first} TO {self.last}"
        return "UNBOUNDED"


@dataclass
class StreamTable:
    """An append-only table partitioned by its event-time column ``time_column`` into
    partitions of width ``partition`` starting at ``origin``, seen through ``window``.

    Event times are numbers (any unit; a duration written with a unit counts seconds),
    datetimes, or durations (timedelta64: e.g. the time since a session started) -- for
    those two, widths, windows and the lateness are Timedeltas or text such as
    ``"1 MINUTE"``, and a duration clock's origin is a duration (default 0).  ``source``
    names the stream its rows come from (default: the table itself): rows appended to a
    source go to every stream table of that source, each through its own window."""

    time_column: str
    partition: Duration
    window: Window | str | None = None
    origin: float | pd.Timestamp | str = 0.0
    source: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.time_column, str) or not self.time_column:
            raise InputTypeError(f"time_column is a column name, got {self.time_column!r}")
        self.partition = parse_duration(self.partition)
        width = self.partition
        if (width.value if isinstance(width, pd.Timedelta) else width) <= 0:
            raise InputTypeError(f"the partition width must be positive, got {width!r}")
        self.window = Window.parse(self.window)
        _check_origin(self.origin)


_NOT_TIMES = {"", "nan", "nat", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


def _check_origin(origin: Any) -> None:
    """An origin is a finite number, a datetime or a duration (or their text)."""
    if isinstance(origin, bool):
        bad = True
    elif isinstance(origin, str):
        bad = origin.strip().lower() in _NOT_TIMES | {"none", "null"}
    elif isinstance(origin, int | float | np.number):
        bad = not np.isfinite(origin)
    else:
        bad = origin is None or origin is pd.NaT or bool(pd.isna(origin))
    if bad:
        raise InputTypeError(
            f"the origin is a finite number, a datetime or a duration, got {origin!r}"
        )


def _as_times(table: str, column: str, values: pd.Series) -> tuple[pd.Series, str] | None:
    """A column of objects or text (object, pandas ``string``, pyarrow strings) holding
    dates, datetimes or ISO date texts as datetimes, or timedeltas as durations, with the
    kind of time; None for anything else (numbers, numeric texts).  Times mixing zones
    (or zoned and zone-less ones) and datetimes outside 1677-2262 are refused by name."""
    inferred = pd.api.types.infer_dtype(values, skipna=True)
    if not values.notna().any():  # only NULLs: nothing says which kind of time
        return None
    if inferred == "timedelta":
        try:
            return pd.to_timedelta(values), "duration"
        except (ValueError, TypeError, OverflowError):
            return None
    if inferred not in ("date", "datetime", "string"):
        return None
    if inferred == "string" and not np.isnan(_numbers(values)).any():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # mixed offsets: object dtype
            times = pd.to_datetime(values, format="ISO8601")
    except pd.errors.OutOfBoundsDatetime:
        at = _first_failure(values, lambda v: pd.Timestamp(v).as_unit("ns"))
        _out_of_range(table, column, values.iloc[at])
    except (ValueError, TypeError, OverflowError):
        try:  # times, unless only in one zone
            pd.to_datetime(values, format="ISO8601", utc=True)
        except (ValueError, TypeError, OverflowError):
            return None
        times = values
    if times.dtype == object:
        present = values[values.notna()]
        zones = present.map(lambda v: str(pd.Timestamp(v).tzinfo))
        value = present.iloc[int(np.argmax(zones.to_numpy() != zones.iloc[0]))]
        raise BatchError(
            f"stream table {table!r}, column {column!r}: event time {value!r} is in another "
            f"time zone than {present.iloc[0]!r}; give one column's times in one zone (or "
            "all without one)",
            table,
            column,
            value,
        )
    return times, "datetime"


def _first_failure(values: pd.Series, convert: Callable[[Any], Any]) -> int:
    """The row of the first value that ``convert`` raises on (error paths only)."""
    for at, value in enumerate(values):
        try:
            convert(value)
        except (ValueError, TypeError, OverflowError):
            return at
    return 0


def _out_of_range(table: str, column: str, value: Any) -> None:
    raise BatchError(
        f"stream table {table!r}, column {column!r}: event time {value!r} is outside the "
        "range of nanosecond times (1677 to 2262) that event times hold",
        table,
        column,
        value,
    )


def _time_kind(dtype: Any) -> str:
    """``datetime``, ``duration`` or ``number``: the kind of time a column's dtype holds
    (numpy, pandas and pyarrow dates, timestamps and durations)."""
    if isinstance(dtype, pd.ArrowDtype):
        kind = dtype.pyarrow_dtype
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            return "datetime"
        return "duration" if pa.types.is_duration(kind) else "number"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "datetime"
    return "duration" if pd.api.types.is_timedelta64_dtype(dtype) else "number"


def _time_array(values: pd.Series) -> np.ndarray:
    """A datetime or duration column as numpy datetime64 / timedelta64 in its own unit:
    tz-aware instants as UTC, NULLs as NaT (pyarrow dates, timestamps and durations too)."""
    if isinstance(values.dtype, pd.ArrowDtype):
        kind = values.dtype.pyarrow_dtype
        array = pa.array(values.array)
        if pa.types.is_date32(kind):  # days, as int32 only
            array, unit = array.cast(pa.int32()), "D"
        else:
            unit = "ms" if pa.types.is_date64(kind) else kind.unit
        ints = pc.fill_null(array.cast(pa.int64()), _NAT).to_numpy()
        return ints.view(f"{'m' if pa.types.is_duration(kind) else 'M'}8[{unit}]")
    if getattr(values.dtype, "tz", None) is not None:
        values = values.dt.tz_convert("UTC").dt.tz_localize(None)
    return values.to_numpy()


def _zone(dtype: Any) -> Any:
    """The time zone of a column of tz-aware datetimes (pandas, pyarrow or categorical),
    None for any other column."""
    if isinstance(dtype, pd.CategoricalDtype):
        dtype = dtype.categories.dtype
    if isinstance(dtype, pd.ArrowDtype):
        return getattr(dtype.pyarrow_dtype, "tz", None)
    return getattr(dtype, "tz", None)


_NAT = np.iinfo(np.int64).min  # NaT's int64 bits


def _nanoseconds(times: np.ndarray) -> tuple[np.ndarray, int | None]:
    """datetime64 / timedelta64 values as int64 nanoseconds, with the row of the first
    value outside their range (1677 to 2262; numpy's cast wraps it silently) or None."""
    nanoseconds = times.astype(f"{times.dtype.kind}8[ns]")
    wrapped = np.flatnonzero((nanoseconds.astype(times.dtype) != times) & ~np.isnat(times))
    return nanoseconds.view(np.int64), int(wrapped[0]) if wrapped.size else None


def _numbers(values: pd.Series) -> np.ndarray:
    """Texts or objects as float64 numbers, NaN where one is not a number (pyarrow's
    NaN and null alike)."""
    return pd.to_numeric(values, errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _check_exact_numbers(table: str, column: str, values: pd.Series) -> None:
    """Numeric event times are float64: integers beyond 2**53 would be rounded."""
    if values.dtype.kind not in "iu" or not len(values):
        return
    big = np.flatnonzero(np.abs(values.to_numpy().astype(np.float64)) > 2.0**53)
    if big.size:
        value = values.iloc[int(big[0])]
        raise BatchError(
            f"stream table {table!r}, column {column!r}: event time {value!r} is an integer "
            "beyond 2**53, which numeric event times (float64) would round; give such times "
            "(e.g. epoch nanoseconds) as datetimes",
            table,
            column,
            value,
        )


_NANOSECONDS = ("datetime", "duration")  # clocks counting int64 nanoseconds


class _Clock:
    """Event times as numbers: float64 for numeric columns, int64 nanoseconds for
    datetimes and durations (timedelta64) -- the kind fixed by the first batch with rows;
    durations and time points on the same scale (Python ints for nanoseconds, so
    partition ids and the watermark are exact)."""

    def __init__(self) -> None:
        self.kind: str | None = None  # "number", "datetime" or "duration"

    @contextmanager
    def trial(self):
        """A block whose reading of times leaves the kind of time as it was."""
        kind = self.kind
        try:
            yield
        finally:
            self.kind = kind

    def times(self, table: str, column: str, values: pd.Series) -> np.ndarray:
        if (
            isinstance(values.dtype, pd.CategoricalDtype)
            and _time_kind(values.dtype.categories.dtype) in _NANOSECONDS
        ):
            values = values.astype(values.dtype.categories.dtype)
        kind = _time_kind(values.dtype)
        read = (
            _as_times(table, column, values)
            if kind == "number" and _is_text(values.dtype)
            else None
        )
        if read is not None:  # dates, datetimes or ISO texts (a DATE column's values)
            values, kind = read
        if kind == "number" and values.dtype.kind not in "iuf":
            numbers = pd.to_numeric(values, errors="coerce")  # ints stay ints (2**53 check)
            bad = np.isnan(_numbers(values)) & values.notna().to_numpy()
            bad = pd.Series(bad, index=values.index) | values.map(lambda v: isinstance(v, bool))
            if bad.any() or values.dtype.kind == "b":
                raise BatchError(
                    f"stream table {table!r}, column {column!r}: event time "
                    f"{values[bad].iloc[0] if bad.any() else values.iloc[0]!r} is neither a "
                    "number nor a datetime nor a duration",
                    table,
                    column,
                    values[bad].iloc[0] if bad.any() else values.iloc[0],
                )
            values = numbers
        if self.kind is not None and kind != self.kind and len(values):
            raise BatchError(
                f"stream table {table!r}, column {column!r}: event times are {self.kind}s in "
                f"this stream, got {values.dtype} values",
                table,
                column,
                values.iloc[0],
            )
        if kind in _NANOSECONDS:
            times = _time_array(values)
            out, wrapped = _nanoseconds(times)
            if wrapped is not None:
                _out_of_range(table, column, values.iloc[wrapped])
            missing = np.isnat(times)
        else:
            _check_exact_numbers(table, column, values)
            out = values.to_numpy(np.float64, na_value=np.nan)
            missing = ~np.isfinite(out)
        if missing.any():
            at = int(np.flatnonzero(missing)[0])
            raise BatchError(
                f"stream table {table!r}, column {column!r}: row {at} has no event time "
                f"({values.iloc[at]!r}; event times are finite)",
                table,
                column,
                values.iloc[at],
            )
        if len(values):
            self.kind = self.kind or kind
        return out

    def span(self, duration: float | pd.Timedelta, what: str) -> float | int:
        """``duration`` on this clock's scale."""
        if self.kind in _NANOSECONDS:
            if not isinstance(duration, pd.Timedelta):
                if duration == 0:
                    return 0
                raise InputTypeError(
                    f"{what} is {duration!r}, a plain number, but the event times are "
                    f"{self.kind}s: give a duration such as '1 MINUTE'"
                )
            return int(duration.value)
        if isinstance(duration, pd.Timedelta):
            return duration.total_seconds()
        return float(duration)

    def point(self, value: Any, what: str) -> float | int:
        """A time point (watermark, origin) on this clock's scale; NaN, NaT and infinite
        points are refused (:class:`BatchError`)."""
        if isinstance(value, int | float | np.number) and not isinstance(value, bool):
            if not np.isfinite(value):
                raise BatchError(f"{what} {value!r} is not a finite time", None, None, value)
            if self.kind in _NANOSECONDS and float(value) == 0.0:
                return 0  # the default origin: the epoch, or no time elapsed
        if value is None or value is pd.NaT or _is_nat(value):
            raise BatchError(f"{what} {value!r} is not a time", None, None, value)
        if self.kind == "datetime":
            if isinstance(value, pd.Timedelta | np.timedelta64 | datetime.timedelta):
                raise InputTypeError(
                    f"{what} {value!r} is a duration, but event times are datetimes"
                )
            if isinstance(value, int | float | np.number) and not isinstance(value, bool):
                raise InputTypeError(  # pd.Timestamp(5) would be 5 ns after the epoch
                    f"{what} is {value!r}, a plain number, but the event times are datetimes: "
                    "give a datetime such as '2024-01-01 00:00'"
                )
            stamp = pd.Timestamp(value)
            if stamp is pd.NaT:
                raise BatchError(f"{what} {value!r} is not a time", None, None, value)
            if stamp.tz is not None:
                stamp = stamp.tz_convert("UTC").tz_localize(None)
            return int(stamp.value)
        if self.kind == "duration":
            if isinstance(value, str):
                value = parse_duration(value)
            if isinstance(value, pd.Timedelta | np.timedelta64 | datetime.timedelta):
                return int(pd.Timedelta(value).value)
            raise InputTypeError(
                f"{what} is {value!r}, but the event times are durations: give a duration "
                "such as '90s' or pd.Timedelta(minutes=1)"
            )
        if isinstance(value, pd.Timestamp | np.datetime64 | datetime.date | str):
            raise InputTypeError(f"{what} {value!r} is a datetime, but event times are numbers")
        if isinstance(value, pd.Timedelta | np.timedelta64 | datetime.timedelta):
            raise InputTypeError(f"{what} {value!r} is a duration, but event times are numbers")
        return float(value)

    def show(self, value: float) -> Any:
        """A time point as users see it."""
        if self.kind == "datetime" and np.isfinite(value):
            return pd.Timestamp(int(value))
        if self.kind == "duration" and np.isfinite(value):
            return pd.Timedelta(int(value))
        return value


def _is_text(dtype: Any) -> bool:
    """Object columns and every string dtype (pandas ``string``, pyarrow strings)."""
    return pd.api.types.is_string_dtype(dtype)  # True for the object dtype too


def _is_nat(value: Any) -> bool:
    return isinstance(value, np.datetime64 | np.timedelta64) and bool(np.isnat(value))


def _floor_div(a: float | int, b: float | int) -> int:
    """``floor(a / b)``, exact for Python ints (datetime clocks)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return int(np.floor(a / b))


def _counters(target: Any) -> dict[str, int]:
    """A target's progress counters as they were before a batch (a Maintainer's
    ``batches_applied`` and ``tuples_applied``)."""
    return {
        name: getattr(target, name) for name in ("batches_applied", "tuples_applied")
        if isinstance(getattr(target, name, None), int)
    }  # fmt: skip


def _relations(target: Any) -> dict[str, list[str] | None]:
    """The relations a target takes and their columns (None: any columns)."""
    query = getattr(target, "query", None)
    if query is not None and hasattr(query, "relations") and not callable(query.relations):
        return {name: list(columns) for name, columns in query.relations.items()}
    catalog = getattr(target, "catalog", None)
    if catalog is not None:
        return {name: list(catalog.table(name).columns) for name in catalog}
    relations = getattr(target, "relations", None)
    if isinstance(relations, Mapping):
        return dict(relations)
    raise InputTypeError(
        f"a stream target is a Maintainer, DistributedMaintainer, sql.Database or MinMaxView "
        f"(something with .apply and .query, .catalog or .relations), got {type(target).__name__}"
    )


class _Rows:
    """Rows as named columns (numpy arrays, or pandas extension arrays for extension
    dtypes): taken and concatenated per column, cheaper than DataFrame slicing."""

    __slots__ = ("columns", "size")

    def __init__(self, columns: dict[str, Any], size: int) -> None:
        self.columns, self.size = columns, size

    @classmethod
    def of(cls, frame: pd.DataFrame) -> _Rows:
        columns = {}
        for name in frame.columns:
            series = frame[name]
            columns[name] = (
                series.to_numpy() if isinstance(series.dtype, np.dtype) else series.array
            )
        return cls(columns, len(frame))

    def take(self, rows: np.ndarray) -> _Rows:
        return _Rows({c: a.take(rows) for c, a in self.columns.items()}, len(rows))

    @staticmethod
    def concat(parts: Sequence[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        names = list(parts[0].columns)
        size = sum(p.size for p in parts)
        if any(list(p.columns) != names for p in parts):  # batches with other columns
            return _Rows.of(pd.concat([p.frame() for p in parts], ignore_index=True))
        columns = {}
        for name in names:
            arrays = [p.columns[name] for p in parts]
            if all(isinstance(a, np.ndarray) for a in arrays):
                columns[name] = np.concatenate(arrays)
            else:
                columns[name] = pd.concat([pd.Series(a) for a in arrays], ignore_index=True).array
        return _Rows(columns, size)

    def frame(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The rows as a DataFrame (of ``columns``, default all)."""
        names = self.columns if columns is None else columns
        return pd.DataFrame(
            {c: self.columns[c] for c in names}, index=pd.RangeIndex(self.size), copy=False
        )


class _Partitions:
    """One stream table's buffered rows: per partition id the rows that arrived, and the
    ids in order (expiry takes a prefix)."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[_Rows]] = {}
        self.ids: list[int] = []  # sorted

    def add(self, parts: np.ndarray, rows: _Rows) -> None:
        """Buffer ``rows`` under their partition ids ``parts``."""
        if not rows.size:
            return
        if parts[0] == parts[-1] and (parts == parts[0]).all():
            self._append(int(parts[0]), rows)
            return
        order = np.argsort(parts, kind="stable")
        ordered = parts[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        ends = np.r_[starts[1:], len(order)]
        for s, e in zip(starts, ends, strict=True):
            self._append(int(ordered[s]), rows.take(order[s:e]))

    def _append(self, k: int, rows: _Rows) -> None:
        if k not in self.chunks:
            self.chunks[k] = []
            bisect.insort(self.ids, k)
        self.chunks[k].append(rows)

    def through(self, bound: float) -> list[int]:
        """The buffered partition ids ``<= bound``, in order."""
        return self.ids[: bisect.bisect_right(self.ids, bound)]

    def drop(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        for k in ids:
            del self.chunks[k]
        gone = set(ids)
        self.ids = [k for k in self.ids if k not in gone]

    def rows(self, ids: Iterable[int]) -> _Rows | None:
        pieces = [c for k in ids for c in self.chunks.get(k, ())]
        return _Rows.concat(pieces) if pieces else None


@dataclass
class _Plan:
    """What one batch does, computed before anything changes."""

    watermark: float
    newest: float
    stream: list[tuple[str, int, _Rows]] = field(default_factory=list)  # table, sign, rows
    inserts: dict[str, tuple[np.ndarray, _Rows]] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    late: dict[str, pd.DataFrame] = field(default_factory=dict)
    per_target: list[list[UpdateBatch]] = field(default_factory=list)
    patterns: list[tuple[PatternView, Any]] = field(default_factory=list)


class WindowedStream:
    """Stream tables feeding ``targets`` through their windows (see the module docs).

    ``targets``: one target or a list (a :class:`ringml.Maintainer`, a
    ``DistributedMaintainer``, a :class:`ringml.sql.Database`, a :class:`MinMaxView`, a
    :class:`PatternView`); ``tables``: per stream table (a relation or table of the targets)
    its :class:`StreamTable`; ``lateness``: how far behind the largest event time seen the
    watermark stays; ``late``: ``"reject"`` or ``"dead_letter"``.  Rows are sent projected
    on each target's columns of the relation (the event time may be one of them or not).
    Batches of other relations pass through :meth:`apply` unchanged (dimension tables,
    ...), in the same atomic apply.
    """

    def __init__(
        self,
        targets: Any,
        tables: Mapping[str, StreamTable],
        lateness: Duration = 0.0,
        late: str = "reject",
    ) -> None:
        if late not in ("reject", "dead_letter"):
            raise InputTypeError(f"late is 'reject' or 'dead_letter', got {late!r}")
        if not isinstance(tables, Mapping):
            raise InputTypeError("tables maps stream table names to StreamTable specs")
        listed = list(targets) if isinstance(targets, list | tuple) else [targets]
        self.patterns: list[PatternView] = [t for t in listed if isinstance(t, PatternView)]
        self.targets: list[Any] = [t for t in listed if not isinstance(t, PatternView)]
        self._columns = [_relations(t) for t in self.targets]
        for name, spec in tables.items():
            if not isinstance(spec, StreamTable):
                raise InputTypeError(f"stream table {name!r}: expected a StreamTable, got {spec!r}")
            readers = [c for c in self._columns if name in c]
            readers += [p for p in self.patterns if p.table == name]
            if not readers:
                raise SchemaError(f"stream table {name!r} is read by none of the targets")
        for pattern in self.patterns:
            if pattern.table not in tables:
                raise SchemaError(
                    f"pattern view {pattern.name!r} reads {pattern.table!r}, not a stream table "
                    f"here ({sorted(tables)})"
                )
        self.tables: dict[str, StreamTable] = dict(tables)
        self._sources: dict[str, list[str]] = {}
        for name, spec in tables.items():
            self._sources.setdefault(spec.source or name, []).append(name)
        for source, names in self._sources.items():
            columns = {self.tables[n].time_column for n in names}
            if len(columns) > 1:
                raise SchemaError(
                    f"the stream tables {names} of source {source!r} name different event-time "
                    f"columns {sorted(columns)}"
                )
        self.late = late
        self.lateness = parse_duration(lateness)
        if (self.lateness.value if isinstance(self.lateness, pd.Timedelta) else self.lateness) < 0:
            raise InputTypeError(f"the lateness cannot be negative, got {lateness!r}")
        self._clock = _Clock()
        self._buffers = {name: _Partitions() for name in tables}
        self._watermark = -np.inf
        self._newest = -np.inf
        self._dead: dict[str, list[pd.DataFrame]] = {}
        self._seen: set[str] = set()  # the sources that received rows
        self.batches_applied = 0

    def add_table(self, name: str, spec: StreamTable) -> None:
        """Add a stream table (e.g. a new window over a source), read by a target or a
        pattern view given at construction (targets' relations are read again).  A table
        of a source that has rows already would miss them, and is refused."""
        if not isinstance(spec, StreamTable):
            raise InputTypeError(f"stream table {name!r}: expected a StreamTable, got {spec!r}")
        if name in self.tables:
            raise SchemaError(f"stream table {name!r} exists already")
        source = spec.source or name
        siblings = self._sources.get(source, [])
        if source in self._seen:
            raise SchemaError(
                f"stream table {name!r}: its source {source!r} has rows already, which a new "
                "window would miss; declare windows before the first rows"
            )
        if siblings and self.tables[siblings[0]].time_column != spec.time_column:
            raise SchemaError(
                f"stream table {name!r}: source {source!r} has event time "
                f"{self.tables[siblings[0]].time_column!r}, not {spec.time_column!r}"
            )
        columns = [_relations(t) for t in self.targets]
        if not any(name in c for c in columns) and not any(p.table == name for p in self.patterns):
            raise SchemaError(f"stream table {name!r} is read by none of the targets")
        self._columns = columns
        self.tables[name] = spec
        self._sources.setdefault(source, []).append(name)
        self._buffers[name] = _Partitions()

    def _remove_table(self, name: str) -> None:
        """Take back :meth:`add_table` (its source has no rows yet): e.g. a SQL view whose
        creation failed after its window table was added."""
        spec = self.tables.pop(name)
        source = spec.source or name
        self._sources[source].remove(name)
        if not self._sources[source]:
            del self._sources[source]
        del self._buffers[name]
        self._columns = [_relations(t) for t in self.targets]

    # ---------------------------------------------------------------- reading
    @property
    def watermark(self) -> Any:
        """The current watermark (a number or a Timestamp; ``-inf`` before any event)."""
        return self._clock.show(self._watermark)

    def partition_of(self, table: str, times) -> np.ndarray:
        """The partition ids of event times ``times`` in ``table`` (a question: before the
        first rows it does not fix the stream's kind of event time)."""
        spec = self._spec(table)
        with self._clock.trial():
            times = self._clock.times(table, spec.time_column, pd.Series(times))
            return self._parts(table, times)

    def partitions(self, table: str) -> list[int]:
        """The ids of ``table``'s partitions holding rows inside its window, in order."""
        self._spec(table)
        return [k for k in self._buffers[table].ids if self._live(table, k, self._watermark)]

    def window_rows(self, table: str) -> pd.DataFrame:
        """The rows of ``table`` inside its window now (what the targets hold).  An
        UNBOUNDED window expires nothing, so the stream keeps none of its rows: read them
        from the target."""
        if self._spec(table).window.kind == "unbounded":
            raise SchemaError(
                f"stream table {table!r} has an UNBOUNDED window, whose rows the stream does "
                "not keep (nothing expires); read them from the target"
            )
        rows = self._buffers[table].rows(self.partitions(table))
        return rows.frame() if rows is not None else pd.DataFrame()

    def dead_letters(self, source: str, clear: bool = False) -> pd.DataFrame:
        """The late rows appended to ``source`` (a stream table or the source of several)
        kept with ``late="dead_letter"``, with the watermark they missed (``_watermark``);
        ``clear=True`` hands them over and forgets them."""
        if source not in self._sources:
            raise SchemaError(f"unknown stream {source!r}; the streams are {sorted(self._sources)}")
        pieces = self._dead.pop(source, []) if clear else self._dead.get(source, [])
        return pd.concat(pieces, ignore_index=True) if pieces else pd.DataFrame()

    # ---------------------------------------------------------------- changes
    def insert(self, table: str, rows) -> Any:
        """Append ``rows`` to the stream table (or source) ``table`` (see :meth:`apply`)."""
        return self.apply([UpdateBatch.inserts(table, as_frame(rows, table))])

    def advance_watermark(self, time: Any) -> Any:
        """Move the watermark to ``time``, expiring what left the windows and completing
        partitions for the pattern views; a time behind the watermark is an error."""
        if self._clock.kind is None:
            raise RingmlError("the first event sets the kind of event time; insert rows first")
        point = self._clock.point(time, "the watermark")  # NaN, NaT and inf refused
        if point < self._watermark:
            raise BatchError(
                f"the watermark is {self.watermark!r}; it does not go back to {time!r}",
                None,
                None,
                time,
            )
        return self._run([], point)

    def apply(self, batches: Sequence[UpdateBatch] | UpdateBatch) -> Any:
        """Append rows to stream tables and apply batches of other relations, atomically:
        late rows are rejected (nothing changes) or dead-lettered; the watermark advances;
        the rows that left a window are deleted in the same apply of every target.
        Returns what the first target's apply returned (e.g. a ResultDelta)."""
        if isinstance(batches, UpdateBatch):
            batches = [batches]
        if isinstance(batches, str | bytes | pd.DataFrame | Mapping) or not isinstance(
            batches, Iterable
        ):
            raise InputTypeError(
                f"apply takes an UpdateBatch or a list of them, got {type(batches).__name__}"
            )
        return self._run(list(batches), None)

    # ---------------------------------------------------------------- internals
    def _refreshed(self, relation: str) -> list[dict[str, list[str] | None]]:
        """The targets' relations, read again when ``relation`` is not among them (a table
        created in a target database after the stream)."""
        if not any(relation in c for c in self._columns):
            self._columns = [_relations(t) for t in self.targets]
        return self._columns

    def _read_columns(self, source: str) -> list[str]:
        """The columns the targets read of the stream tables of ``source`` (a batch
        appended to it must have them; pattern views check their own)."""
        names = self._sources[source]
        out: dict[str, None] = {}
        for columns in self._columns:
            for name in names:
                out.update(dict.fromkeys(columns.get(name) or ()))
        return list(out)

    def _spec(self, table: str) -> StreamTable:
        if table not in self.tables:
            raise SchemaError(
                f"unknown stream table {table!r}; the stream tables are {sorted(self.tables)}"
            )
        return self.tables[table]

    def _geometry(self, table: str) -> tuple[float, float]:
        spec = self.tables[table]
        width = self._clock.span(spec.partition, f"the partition width of {table!r}")
        return self._clock.point(spec.origin, f"the origin of {table!r}"), width

    def _parts(self, table: str, times: np.ndarray) -> np.ndarray:
        if not len(times):  # e.g. an empty first batch: the kind of time is not known yet
            return np.zeros(0, dtype=np.int64)
        spec = self.tables[table]
        width = self._clock.span(spec.partition, f"the partition width of {table!r}")
        origin = self._clock.point(spec.origin, f"the origin of {table!r}")
        if isinstance(width, int) and isinstance(origin, int):  # nanoseconds: exact
            return (times - origin) // width
        with np.errstate(all="ignore"):
            parts = np.floor((times - origin) / width)
        beyond = ~(np.abs(parts) < 2.0**62)
        if beyond.any():
            at = int(np.flatnonzero(beyond)[0])
            raise BatchError(
                f"stream table {spec.source or table!r}, column {spec.time_column!r}: event "
                f"time {float(times[at])!r} lies {float(parts[at])!r} partitions of width "
                f"{width!r} from the origin, beyond int64 partition numbers",
                spec.source or table,
                spec.time_column,
                float(times[at]),
            )
        return parts.astype(np.int64)

    def _expired_through(self, table: str, watermark: float | int) -> float | int:
        """The largest partition id a RANGE window has expired at ``watermark`` (partition
        ``k`` is live while ``origin + (k + 1) * width + length > watermark``); -inf when
        nothing expires."""
        window = self.tables[table].window
        if window.kind != "range" or not np.isfinite(watermark):
            return -np.inf
        origin, width = self._geometry(table)
        length = self._clock.span(window.length, f"the window of {table!r}")
        return _floor_div(watermark - length - origin, width) - 1

    def _live(self, table: str, k: np.ndarray | int, watermark: float) -> Any:
        """Whether partitions ``k`` of ``table`` are inside its window at ``watermark``."""
        window = self.tables[table].window
        if window.kind == "partitions":
            return (window.first <= k) & (k <= window.last)
        if window.kind == "range":
            return k > self._expired_through(table, watermark)
        return np.ones_like(k, dtype=bool) if isinstance(k, np.ndarray) else True

    def _complete_through(self, table: str, watermark: float | int) -> float | int:
        """The largest partition id whose end is at or behind ``watermark``."""
        if not np.isfinite(watermark):
            return -np.inf
        origin, width = self._geometry(table)
        return _floor_div(watermark - origin, width) - 1

    def _run(self, batches: list[UpdateBatch], explicit: float | None) -> Any:
        kind = self._clock.kind  # a rejected first batch does not fix the kind of time
        try:
            plan = self._plan(batches, explicit)
            results, held, failed = self._apply_targets(plan)
        except BaseException:
            self._clock.kind = kind
            raise
        self._commit(plan)
        try:
            notify(held)  # the batch happened: now the subscribers get its diffs
        except SubscriberError as error:  # applied everywhere; a subscriber raised
            failed = failed or error
        if failed is not None:
            raise failed
        return results[0] if results else None

    def _accept(self, batch: UpdateBatch, late: dict[str, list[pd.DataFrame]]):
        """A stream batch's accepted rows (times, rows); late rows raise or go to ``late``."""
        spec = self.tables[self._sources[batch.relation][0]]
        signs = batch.signs()
        if (signs != 1).any():
            at = int(np.flatnonzero(signs != 1)[0])
            raise BatchError(
                f"stream table {batch.relation!r} is append-only: row {at} has multiplicity "
                f"{int(signs[at])}; rows leave it when its window expires them",
                batch.relation,
                "multiplicity",
                int(signs[at]),
            )
        frame = batch.rows
        if spec.time_column not in frame.columns:
            raise BatchError(
                f"stream table {batch.relation!r}: the batch has no event-time column "
                f"{spec.time_column!r} (columns {list(frame.columns)})",
                batch.relation,
                spec.time_column,
            )
        read = self._read_columns(batch.relation)
        missing = [c for c in read if c not in frame.columns]
        if missing:
            extra = [c for c in frame.columns if c not in read and c != spec.time_column]
            raise BatchError(
                f"stream table {batch.relation!r}: its targets read columns {read}; the batch "
                f"lacks {missing}" + (f" and has extra {extra}" if extra else ""),
                batch.relation,
                missing[0],
            )
        times = self._clock.times(batch.relation, spec.time_column, frame[spec.time_column])
        dtype = frame[spec.time_column].dtype
        if self._clock.kind in _NANOSECONDS and (
            _is_text(dtype) or isinstance(dtype, pd.ArrowDtype | pd.CategoricalDtype)
        ):
            # dates, ISO texts, timedeltas, pyarrow or categorical times: kept as the numpy
            # datetimes (durations) they are, so that the rows of several batches stack as
            # one column of one type
            unit = "datetime64[ns]" if self._clock.kind == "datetime" else "timedelta64[ns]"
            column = pd.Series(times.view(unit), index=frame.index)
            if _zone(dtype) is not None:
                column = column.dt.tz_localize("UTC").dt.tz_convert(_zone(dtype))
            frame = frame.assign(**{spec.time_column: column})
        is_late = times < self._watermark
        if is_late.any():
            at = int(np.flatnonzero(is_late)[0])
            value = frame[spec.time_column].iloc[at]
            if self.late == "reject":
                raise LateEventError(
                    f"stream table {batch.relation!r}, column {spec.time_column!r}: event time "
                    f"{value!r} is behind the watermark {self.watermark!r} "
                    f"({int(is_late.sum())} late row(s)); the batch was rejected",
                    batch.relation,
                    spec.time_column,
                    value,
                )
            dead = frame[is_late].reset_index(drop=True)
            dead["_watermark"] = self.watermark
            late.setdefault(batch.relation, []).append(dead)
            return times[~is_late], _Rows.of(frame).take(np.flatnonzero(~is_late))
        return times, _Rows.of(frame)

    def _plan(self, batches: list[UpdateBatch], explicit: float | None) -> _Plan:
        accepted: dict[str, list[tuple[np.ndarray, _Rows]]] = {}
        passing: list[UpdateBatch] = []
        late: dict[str, list[pd.DataFrame]] = {}
        for batch in batches:
            if not isinstance(batch, UpdateBatch):
                raise InputTypeError(f"apply takes UpdateBatches, got {type(batch).__name__}")
            if batch.relation in self._sources:
                accepted.setdefault(batch.relation, []).append(self._accept(batch, late))
            elif batch.relation in self.tables:
                raise BatchError(
                    f"stream table {batch.relation!r} is fed by its source "
                    f"{self.tables[batch.relation].source!r}",
                    batch.relation,
                )
            elif not any(batch.relation in c for c in self._refreshed(batch.relation)):
                raise BatchError(
                    f"relation {batch.relation!r} is neither a stream table nor a relation of "
                    "the targets",
                    batch.relation,
                )
            else:
                passing.append(batch)
        newest = self._newest
        for pieces in accepted.values():
            for times, _ in pieces:
                if len(times):
                    newest = max(newest, times.max().item())
        watermark = self._watermark
        if np.isfinite(newest):
            watermark = max(watermark, newest - self._clock.span(self.lateness, "the lateness"))
        if explicit is not None:
            watermark = max(watermark, explicit)
        plan = _Plan(watermark, newest)
        plan.late = {t: pd.concat(p, ignore_index=True) for t, p in late.items()}
        plan.sources = set(accepted)
        for source, pieces in accepted.items():
            rows = _Rows.concat([r for _, r in pieces])
            times = np.concatenate([t for t, _ in pieces])
            for table in self._sources[source]:
                plan.inserts[table] = (self._parts(table, times), rows)
        for table in self.tables:
            self._plan_table(table, plan)
        for pattern in self.patterns:
            plan.patterns.append((pattern, self._plan_pattern(pattern, plan)))
        for columns in self._columns:
            plan.per_target.append(
                [b for b in passing if b.relation in columns]
                + [
                    UpdateBatch(
                        table,
                        rows.frame(columns[table]),
                        None if sign > 0 else np.full(rows.size, -1, dtype=np.int64),
                    )
                    for table, sign, rows in plan.stream
                    if table in columns
                ]
            )
        return plan

    def _plan_table(self, table: str, plan: _Plan) -> None:
        """``table``'s expiry deletes (the partitions live before, not after) and inserts
        (the rows inside the window after the batch)."""
        buffer = self._buffers[table]
        before = self._expired_through(table, self._watermark)
        after = self._expired_through(table, plan.watermark)
        if after > before:  # the buffer holds live partitions only
            rows = buffer.rows(buffer.through(after))
            if rows is not None:
                plan.stream.append((table, -1, rows))
        if table in plan.inserts:
            parts, rows = plan.inserts[table]
            live = self._live(table, parts, plan.watermark)
            if live.any():
                plan.stream.append(
                    (table, 1, rows if live.all() else rows.take(np.flatnonzero(live)))
                )

    def _plan_pattern(self, pattern: PatternView, plan: _Plan) -> Any:
        parts, rows = plan.inserts.get(pattern.table, (np.zeros(0, np.int64), None))
        frame = None if rows is None else rows.frame()
        return pattern._advance(parts, frame, self._complete_through(pattern.table, plan.watermark))

    def _apply_targets(self, plan: _Plan) -> tuple[list[Any], list, SubscriberError | None]:
        """Every target's apply (undone on all if one fails), its subscribers' deliveries
        held back (handed over once every target took the batch, dropped with the undo: no
        subscriber sees a batch that did not happen); a target whose own subscriber raised
        anyway has applied: the others go on, and the first such error is returned."""
        done: list[tuple[Any, list[UpdateBatch], dict[str, int]]] = []
        results = []
        failed = None
        with held_deliveries() as held:
            try:
                for target, batches in zip(self.targets, plan.per_target, strict=True):
                    counters = _counters(target)
                    try:
                        results.append(target.apply(batches) if batches else None)
                    except SubscriberError as error:
                        failed = failed or error
                        results.append(None)
                    done.append((target, batches, counters))
            except BaseException:  # a rejection, a bug or an interrupt: the targets stay equal
                for target, batches, counters in reversed(done):  # undo: the inverse batches
                    if batches:
                        target.apply(
                            [UpdateBatch(b.relation, b.rows, -b.signs()) for b in reversed(batches)]
                        )
                        vars(target).update(counters)  # the batch and its undo did not happen
                raise
        return results, held, failed

    def _commit(self, plan: _Plan) -> None:
        for table, (parts, rows) in plan.inserts.items():
            if self.tables[table].window.kind == "unbounded":
                continue  # nothing will expire: no rows to keep
            live = self._live(table, parts, plan.watermark)
            if live.all():
                self._buffers[table].add(parts, rows)
            elif live.any():
                self._buffers[table].add(parts[live], rows.take(np.flatnonzero(live)))
        for table, rows in plan.late.items():
            self._dead.setdefault(table, []).append(rows)
        self._watermark, self._newest = plan.watermark, plan.newest
        self._seen |= plan.sources
        for pattern, state in plan.patterns:
            pattern._commit(state)
        for table, buffer in self._buffers.items():
            # a partition leaves the buffer with its window (pattern views keep their own)
            if self.tables[table].window.kind == "range":
                buffer.drop(buffer.through(self._expired_through(table, self._watermark)))
        self.batches_applied += 1


# ------------------------------------------------------------------------------ MIN / MAX
_TOP = np.uint64(1 << 63)


def _sortable(values: np.ndarray, kind: str) -> np.ndarray:
    """uint64 keys ordered as ``values`` (int64, or float64 with -0.0 read as 0.0)."""
    if kind == "float":
        bits = (values.astype(np.float64) + 0.0).view(np.uint64)
        return np.where(bits & _TOP, ~bits, bits | _TOP)
    return values.astype(np.int64).view(np.uint64) ^ _TOP


def _range_sums(counts: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``counts[low[i]:high[i]].sum()`` for every ``i`` (no Python loop)."""
    lengths = high - low
    total = int(lengths.sum())
    if not total:
        return np.zeros(len(low), np.int64)
    starts = np.repeat(low - (np.cumsum(lengths) - lengths), lengths)
    picked = counts[np.arange(total) + starts]
    owner = np.repeat(np.arange(len(low)), lengths)
    return np.bincount(owner, weights=picked, minlength=len(low)).astype(np.int64)


def _unsortable(keys: np.ndarray, kind: str) -> np.ndarray:
    if kind == "float":
        return np.where(keys & _TOP, keys & ~_TOP, ~keys).view(np.float64)
    return (keys ^ _TOP).view(np.int64)


class MinMaxView:
    """Exact ``MIN`` and ``MAX`` (and ``COUNT(*)``) of ``values`` per group of ``by`` over
    a relation's rows under inserts and deletes -- a window's expiry included.

    Per value column it keeps the multiset of ``(group, value)`` with counts as one sorted
    array of fixed-width keys (group codes, then the value's order-preserving bits): a batch
    is merged in with binary searches, a group's MIN is the first key of its run and its
    MAX the last, so deleting a maximum exposes the next value without rescanning
    anything.  Values are numbers or datetimes (NULLs ignored, as SQL does); a delete of a
    value the group does not hold is rejected and changes nothing.
    """

    def __init__(
        self, relation: str, values: Sequence[str], by: Sequence[str] = (), name: str = ""
    ) -> None:
        if isinstance(values, str) or isinstance(by, str):
            raise InputTypeError("values and by are lists of column names")
        if not values:
            raise InputTypeError("MinMaxView needs at least one value column")
        self.relation, self.values, self.by = relation, list(values), list(by)
        self.name = name or f"minmax({relation})"
        self.relations = {relation: list(dict.fromkeys(self.by + self.values))}
        self._codes = {c: Dictionary(c) for c in self.by}
        self._kinds: dict[str, str] = {}  # value column -> "int" / "float" / "datetime"
        self._zones: dict[str, Any] = {}  # datetime value column -> its time zone (or None)
        width = 8 * (len(self.by) + 1)
        self._dtype = np.dtype(f"S{width}")
        self._keys = {v: np.zeros(0, self._dtype) for v in self.values}
        self._counts = {v: np.zeros(0, np.int64) for v in self.values}
        self._rows_keys = np.zeros(0, np.dtype(f"S{max(8 * len(self.by), 1)}"))
        self._rows = np.zeros(0, np.int64)  # COUNT(*) per group, groups sorted like the keys

    # ------------------------------------------------------------------ updates
    def apply(self, batches: Sequence[UpdateBatch] | UpdateBatch) -> None:
        """Apply update batches of :attr:`relation` atomically (all or none)."""
        if isinstance(batches, UpdateBatch):
            batches = [batches]
        group_parts, sign_parts = [], []
        value_parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
            v: [] for v in self.values
        }
        kinds: dict[str, set[str | None]] = {v: set() for v in self.values}
        zones: dict[str, dict[str, Any]] = {v: {} for v in self.values}
        null_deletes: dict[str, list[np.ndarray]] = {v: [] for v in self.values}
        for batch in batches:
            if batch.relation != self.relation:
                raise BatchError(
                    f"{self.name}: unknown relation {batch.relation!r} (it reads "
                    f"{self.relation!r})",
                    batch.relation,
                )
            frame, signs = batch.rows, batch.signs()
            missing = [c for c in self.relations[self.relation] if c not in frame.columns]
            if missing:
                raise BatchError(
                    f"{self.name}: relation {self.relation!r} batch lacks columns {missing}",
                    self.relation,
                    missing[0],
                )
            groups = self._group_bytes(frame)
            group_parts.append(groups)
            sign_parts.append(signs)
            for v in self.values:
                data, present, kind = self._value_data(frame[v], v)
                kinds[v].add(kind)
                if kind == "datetime":
                    zones[v].setdefault(str(_zone(frame[v].dtype)), _zone(frame[v].dtype))
                value_parts[v].append((groups[present], data[present], signs[present]))
                null_deletes[v].append(groups[~present & (signs < 0)])
        if not group_parts:
            return
        staged = {v: self._kind_of(v, kinds[v]) for v in self.values}
        staged_zones = {v: self._zone_of(v, zones[v]) for v in self.values if zones[v]}
        rows = self._merge(
            self._rows_keys,
            self._rows,
            np.concatenate(group_parts),
            np.concatenate(sign_parts),
            "COUNT(*)",
        )
        merged = {}
        for v in self.values:
            groups = np.concatenate([g for g, _, _ in value_parts[v]])
            data = np.concatenate([d for _, d, _ in value_parts[v]])
            signs = np.concatenate([s for _, _, s in value_parts[v]])
            keys = self._join(groups, _sortable(data, "float" if staged[v] == "float" else "int"))
            old_keys, old_counts = self._keys[v], self._counts[v]
            if staged[v] == "float" and self._kinds.get(v) == "int":
                old_keys, old_counts = self._as_floats(old_keys, old_counts)
            merged[v] = self._merge(old_keys, old_counts, keys, signs, v)
            self._check_null_deletes(v, np.concatenate(null_deletes[v]), rows, merged[v])
        self._kinds.update({v: kind for v, kind in staged.items() if kind is not None})
        self._zones.update(staged_zones)
        self._rows_keys, self._rows = rows
        for v, (keys, counts) in merged.items():
            self._keys[v], self._counts[v] = keys, counts

    def _group_bytes(self, frame: pd.DataFrame) -> np.ndarray:
        n = len(frame)
        if not self.by:
            return np.zeros(n, self._rows_keys.dtype)
        codes = np.empty((n, len(self.by)), dtype=">u8")
        for j, c in enumerate(self.by):
            try:
                codes[:, j] = self._codes[c].encode(frame[c].to_numpy())
            except EncodingError as error:
                raise BatchError(
                    f"{self.name}: relation {self.relation!r}, group column {c!r}, row "
                    f"{error.position}: {error}",
                    self.relation,
                    c,
                    error.value,
                ) from None
        return np.ascontiguousarray(codes).view(self._rows_keys.dtype).ravel()

    def _value_data(
        self, column: pd.Series, name: str
    ) -> tuple[np.ndarray, np.ndarray, str | None]:
        """A value column's numbers (int64 or float64; datetimes as nanoseconds, tz-aware
        ones of UTC), which rows are not NULL, and the kind: ``int``, ``float`` or
        ``datetime`` -- None for a number column of NULLs only (pandas types it float),
        which holds no value and so must not turn stored integers into floats."""
        present = column.notna().to_numpy()
        if not present.any() and _time_kind(column.dtype) != "datetime":
            return np.zeros(len(column), np.int64), present, None
        if column.dtype == object and pd.api.types.infer_dtype(column, skipna=True) == "integer":
            column = self._exact_integers(column, present, name)
        if _time_kind(column.dtype) == "datetime":
            data, wrapped = _nanoseconds(_time_array(column))
            if wrapped is not None:
                value = column.iloc[wrapped]
                raise BatchError(
                    f"{self.name}: relation {self.relation!r}, column {name!r}: value "
                    f"{value!r} is outside the range of nanosecond times (1677 to 2262) that "
                    "MIN/MAX hold",
                    self.relation,
                    name,
                    value,
                )
            return data, present, "datetime"
        if column.dtype.kind in "iu":  # nullable Int64 too: its NULLs read as 0, not float
            data = column.to_numpy(dtype=column.dtype.kind + "8", na_value=0)
            if data.dtype.kind == "u" and data.size and int(data.max()) > INT64_MAX:
                value = int(data.max())
                raise self._value_error(name, value, "does not fit int64")
            return data.astype(np.int64, copy=False), present, "int"
        if column.dtype.kind == "f" or column.dtype == object:
            numbers = pd.to_numeric(column, errors="coerce").to_numpy(np.float64)
            bad = present & ~np.isfinite(numbers)
            if bad.any():
                value = column[bad].iloc[0]
                raise self._value_error(name, value, "is not a finite number")
            return np.where(present, numbers, 0.0), present, "float"
        raise BatchError(
            f"{self.name}: relation {self.relation!r}, column {name!r} holds {column.dtype} "
            "values; MIN/MAX take numbers or datetimes",
            self.relation,
            name,
        )

    def _value_error(self, name: str, value: Any, what: str) -> BatchError:
        """The error of a value of column ``name`` that this view cannot take."""
        return BatchError(
            f"{self.name}: relation {self.relation!r}, column {name!r}: value {value!r} {what}",
            self.relation,
            name,
            value,
        )

    def _exact_integers(self, column: pd.Series, present: np.ndarray, name: str) -> pd.Series:
        """An object column of Python integers (and NULLs) as nullable Int64, exactly."""
        try:
            return pd.Series(pd.array(column.where(present, None).tolist(), dtype="Int64"))
        except (OverflowError, TypeError, ValueError):
            value = max(column[present].tolist(), key=abs)
            raise self._value_error(name, value, "does not fit int64") from None

    def _kind_of(self, name: str, seen: set[str | None]) -> str | None:
        """The kind of a value column after a batch: integers turn float with the first
        float (the stored values are converted), datetimes do not mix with numbers; None
        while the column has held no value."""
        kinds = (seen - {None}) | ({self._kinds[name]} if name in self._kinds else set())
        if not kinds:
            return None
        if len(kinds) == 1:
            return next(iter(kinds))
        if kinds == {"int", "float"}:
            return "float"
        raise BatchError(
            f"{self.name}: relation {self.relation!r}, column {name!r} mixes datetimes and numbers",
            self.relation,
            name,
        )

    def _zone_of(self, name: str, seen: dict[str, Any]) -> Any:
        """The time zone of a datetime column after a batch (None: zone-less); one column's
        datetimes are all in one zone, so MIN/MAX come back in it."""
        if name in self._zones:
            seen = {str(self._zones[name]): self._zones[name], **seen}
        if len(seen) > 1:
            raise BatchError(
                f"{self.name}: relation {self.relation!r}, column {name!r} mixes datetimes "
                f"of time zones {sorted(seen)} (None: no zone); convert them to one zone",
                self.relation,
                name,
            )
        return next(iter(seen.values()))

    def _as_floats(self, keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integer-valued keys re-encoded as floats (order kept; integers beyond 2**53 that
        meet on one float are merged)."""
        if not len(keys):
            return keys, counts
        g = len(self.by)
        words = keys.view(">u8").reshape(len(keys), g + 1).copy()
        numbers = _unsortable(words[:, g].astype(np.uint64), "int").astype(np.float64)
        words[:, g] = _sortable(numbers, "float")
        floats = np.ascontiguousarray(words).view(self._dtype).ravel()
        unique, inverse = np.unique(floats, return_inverse=True)
        return unique, np.bincount(inverse.ravel(), weights=counts).astype(np.int64)

    def _join(self, groups: np.ndarray, bits: np.ndarray) -> np.ndarray:
        n, g = len(groups), len(self.by)
        out = np.empty((n, g + 1), dtype=">u8")
        if g:
            out[:, :g] = groups.view(">u8").reshape(n, g)
        out[:, g] = bits
        return np.ascontiguousarray(out).view(self._dtype).ravel()

    def _merge(self, keys, counts, new_keys, signs, column: str):
        """``keys``/``counts`` (sorted, counts > 0) plus the signed ``new_keys``: new arrays,
        or a BatchError if a count would go below zero."""
        if not len(new_keys):
            return keys, counts
        batch, inverse = np.unique(new_keys, return_inverse=True)
        delta = np.bincount(inverse.ravel(), weights=signs, minlength=len(batch)).astype(np.int64)
        at = np.searchsorted(keys, batch)
        found = at < len(keys)
        found[found] = keys[at[found]] == batch[found]
        counts = counts.copy()
        np.add.at(counts, at[found], delta[found])
        fresh = ~found & (delta != 0)
        negative = np.flatnonzero(counts < 0)
        if negative.size or (delta[fresh] < 0).any():
            key = keys[negative[0]] if negative.size else batch[fresh][delta[fresh] < 0][0]
            raise BatchError(
                f"{self.name}: relation {self.relation!r}: a delete of a row the view does "
                f"not hold (column {column!r}, group {self._describe(key)}); nothing changed",
                self.relation,
                column,
            )
        keys = np.insert(keys, at[fresh], batch[fresh])
        counts = np.insert(counts, at[fresh], delta[fresh])
        keep = counts != 0
        if not keep.all():
            keys, counts = keys[keep], counts[keep]
        return keys, counts

    def _check_null_deletes(self, column: str, groups: np.ndarray, rows, values) -> None:
        """NULLs are not in a column's multiset, so a delete of a row whose ``column`` is
        NULL is checked here: after the batch, each group deleting one must still hold at
        least as many rows as non-NULL values of ``column`` (``rows``, ``values``: the
        merged COUNT(*) and value keys with their counts)."""
        if not len(groups):
            return
        groups = np.unique(groups)
        row_keys, row_counts = rows
        at = np.searchsorted(row_keys, groups)
        found = at < len(row_keys)
        found[found] = row_keys[at[found]] == groups[found]
        held = np.zeros(len(groups), np.int64)
        held[found] = row_counts[at[found]]
        keys, counts = values
        n = len(groups)
        low = np.searchsorted(keys, self._join(groups, np.zeros(n, np.uint64)), "left")
        high = np.searchsorted(keys, self._join(groups, np.full(n, ~np.uint64(0))), "right")
        bad = np.flatnonzero(_range_sums(counts, low, high) > held)
        if bad.size:
            raise BatchError(
                f"{self.name}: relation {self.relation!r}: a delete of a row the view does "
                f"not hold (column {column!r} NULL, group {self._describe(groups[bad[0]])}); "
                "nothing changed",
                self.relation,
                column,
                None,
            )

    def _describe(self, key: bytes) -> str:
        words = np.frombuffer(key.ljust(8 * (len(self.by) + 1), b"\0"), dtype=">u8")
        values = [
            self._codes[c].decode(np.array([int(words[j])]))[0] for j, c in enumerate(self.by)
        ]
        return str(tuple(values))

    # ------------------------------------------------------------------ reading
    def result(self) -> pd.DataFrame:
        """One row per group holding rows: ``by`` columns, ``count`` (rows) and per value
        column ``min_<v>`` / ``max_<v>`` (NaN or NaT where the group has only NULLs)."""
        g = len(self.by)
        n = len(self._rows_keys)
        groups = self._rows_keys.view(">u8").reshape(n, g) if n and g else None
        out: dict[str, Any] = {}
        for j, c in enumerate(self.by):
            out[c] = self._codes[c].decode(groups[:, j].astype(np.int64)) if n else []
        out["count"] = self._rows
        for v in self.values:
            low, high = self._extremes(v)
            if self._zones.get(v) is not None:  # tz-aware datetimes: back in their zone
                low, high = (
                    pd.DatetimeIndex(x).tz_localize("UTC").tz_convert(self._zones[v])
                    for x in (low, high)
                )
            out[f"min_{v}"], out[f"max_{v}"] = low, high
        return pd.DataFrame(out)

    def _extremes(self, v: str) -> tuple[np.ndarray, np.ndarray]:
        """Per group (in :attr:`_rows_keys` order) the MIN and MAX of ``v``."""
        keys, g, n = self._keys[v], len(self.by), len(self._rows_keys)
        kind = self._kinds.get(v, "float")
        empty = np.full(n, np.nan) if kind != "datetime" else np.full(n, np.datetime64("NaT", "ns"))
        low, high = empty.copy(), empty.copy()
        if not len(keys):
            return low, high
        words = keys.view(">u8").reshape(len(keys), g + 1)
        prefix = (
            np.ascontiguousarray(words[:, :g]).view(self._rows_keys.dtype).ravel()
            if g
            else (np.zeros(len(keys), self._rows_keys.dtype))
        )
        first = np.flatnonzero(np.r_[True, prefix[1:] != prefix[:-1]])
        last = np.r_[first[1:] - 1, len(keys) - 1]
        slot = np.searchsorted(self._rows_keys, prefix[first])
        decoded = _unsortable(words[:, g].astype(np.uint64), "float" if kind == "float" else "int")
        if kind == "datetime":
            decoded = decoded.view("datetime64[ns]")
        elif kind == "int":
            low, high = low.astype(object), high.astype(object)
        low[slot], high[slot] = decoded[first], decoded[last]
        if kind == "int" and not np.isnan(np.asarray(low, dtype=float)).any():
            low, high = low.astype(np.int64), high.astype(np.int64)
        return low, high


# ------------------------------------------------------------------------------ patterns
Predicate = Callable[[pd.DataFrame, pd.DataFrame], Any]


@dataclass(frozen=True)
class Pattern:
    """A sequence of event variables, ``x`` once or ``x+`` one or more times, with the
    predicates its transitions test (ViewDF's ``PATTERN (a, b, c, d+) WHERE ...``).

    ``where`` maps ``"x"`` to the predicate of entering ``x`` (its first occurrence, ViewDF's
    ``x`` or ``x[1]``) and, for a Kleene variable, ``"x[i]"`` to the predicate of each later
    occurrence; a missing predicate always holds.  A predicate is ``f(new, prev)`` on
    whole frames, returning one boolean per row: ``new`` holds the candidate events, ``prev``
    the key's helper row -- the previous matched event's columns, ``state``, the match's
    ``count`` and ``sum_<c>``, and over the occurrences of the current variable so far
    ``var_count``, ``var_sum_<c>`` and ``var_first_<c>`` (NaN and 0 for a fresh run; ``c``
    ranges over the view's ``sums``).  E.g. View2's
    ``{"a": red, "b": red, "c": red, "d": red, "d[i]": red}`` with
    ``red = lambda new, prev: new.loss > 10``, or ``b[i].loss > b[i-1].loss`` as
    ``{"b[i]": lambda new, prev: new.loss > prev.loss}``, ``d[i].loss > avg(d[..i-1].loss)``
    as ``new.loss > prev.var_sum_loss / prev.var_count``, ``d[i].loss > d[1].loss`` as
    ``new.loss > prev.var_first_loss``.  The sums are plain additions: a NULL value in a
    ``sums`` column makes the run's sums NaN from then on (they do not skip it as SQL's
    SUM would, which would leave them out of step with the counts); a predicate whose
    result is NULL does not hold.
    """

    variables: tuple[str, ...]
    kleene: tuple[bool, ...]
    where: Mapping[str, Predicate] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | Sequence[str], where: Mapping[str, Predicate] | None = None):
        """``"a b c d+"`` (or ``"(a, b, c, d+)"``, or a list of names) with its predicates."""
        names = re.split(r"[\s,]+", text.strip(" ()")) if isinstance(text, str) else list(text)
        names = [n for n in names if n]
        if not names:
            raise SchemaError("a pattern needs at least one variable")
        variables = tuple(n.rstrip("+") for n in names)
        bad = [n for n in variables if not re.fullmatch(r"[A-Za-z_]\w*", n)]
        if bad or len(set(variables)) != len(variables):
            raise SchemaError(f"pattern variables must be distinct names, got {names}")
        kleene = tuple(n.endswith("+") for n in names)
        where = dict(where or {})
        known = set(variables) | {f"{v}[i]" for v, k in zip(variables, kleene, strict=True) if k}
        unknown = sorted(set(where) - known)
        if unknown:
            raise SchemaError(
                f"pattern predicates {unknown} name no transition; the pattern has {sorted(known)}"
            )
        for key, predicate in where.items():
            if not callable(predicate):
                raise InputTypeError(f"pattern predicate {key!r} is not callable: {predicate!r}")
        return cls(variables, kleene, where)

    @property
    def states(self) -> int:
        """The number of states after the begin state (the last one is final)."""
        return len(self.variables)


@dataclass
class _PatternState:
    helper: pd.DataFrame | None
    done: int | None  # the last partition stepped through
    next: int | None
    result: pd.DataFrame | None
    pending: dict[int, list[pd.DataFrame]]


class PatternView:
    """ViewDF's pattern-matching view over one stream table, by keys ``by``.

    A helper state view holds, per key whose run is alive, its FSM state, the match's
    ``count``, ``sum_<c>`` for the columns ``sums``, the current variable's ``var_count``,
    ``var_sum_<c>``, ``var_first_<c>`` and the last matched event;
    ``Helper[i] = step(Helper[i-1], S[i])`` runs once partition ``i`` is complete (the
    watermark passed its end), in partition order, with ViewDF's CASE transitions (a
    Kleene state first tries to stay, then to proceed; a failed transition re-tests the
    first variable and may start a new run).  A key without an event in partition ``i``
    drops out (per-key contiguity over partitions); one event per key per partition (a
    second one is rejected with the batch).  :meth:`result` is the view as of the last
    complete partition: the helper rows in the final state (the event's columns,
    ``partition``, ``count`` and the sums), View2 in the thesis' example.
    """

    def __init__(
        self,
        table: str,
        by: Sequence[str],
        pattern: Pattern | str,
        where: Mapping[str, Predicate] | None = None,
        sums: Sequence[str] = (),
        name: str = "",
    ) -> None:
        if isinstance(by, str) or isinstance(sums, str):
            raise InputTypeError("by and sums are lists of column names")
        if not by:
            raise InputTypeError("a pattern view needs key columns (by)")
        if isinstance(pattern, Pattern):
            if where:
                raise InputTypeError("give the predicates with the Pattern or here, not both")
        else:
            pattern = Pattern.parse(pattern, where)
        self.table, self.by, self.pattern = table, list(by), pattern
        self.sums = list(sums)
        self.name = name or f"pattern({table})"
        self._state = _PatternState(None, None, None, None, {})

    def helper(self) -> pd.DataFrame:
        """The helper state view after the last complete partition."""
        return self._empty() if self._state.helper is None else self._state.helper.copy()

    def result(self) -> pd.DataFrame:
        """The matches as of the last complete partition (see the class docs)."""
        if self._state.result is None:
            return pd.DataFrame(
                columns=self.by + ["partition", "count", *(f"sum_{c}" for c in self.sums)]
            )
        return self._state.result.copy()

    @property
    def partition(self) -> int | None:
        """The last complete partition the view has stepped through."""
        return self._state.done

    def _empty(self) -> pd.DataFrame:
        return pd.DataFrame(columns=self.by + ["partition", *self._helper_columns()])

    # ---------------------------------------------------------------- stepping
    def _advance(self, parts: np.ndarray, frame: pd.DataFrame | None, through: float) -> Any:
        """The state after adding ``frame`` (partition ids ``parts``) and stepping through
        the partitions complete at ``through`` (no change to self)."""
        state = self._state
        pending = {k: list(v) for k, v in state.pending.items()}
        if frame is not None and len(frame):
            self._check_columns(frame)
            order = np.argsort(parts, kind="stable")
            ordered = parts[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
            for s, e in zip(starts, np.r_[starts[1:], len(order)], strict=True):
                k = int(ordered[s])
                piece = frame.iloc[order[s:e]][self._columns(frame)].reset_index(drop=True)
                pending.setdefault(k, []).append(piece)
                self._check_unique(k, pending[k])
        nxt = state.next
        if pending:
            first = min(pending)
            nxt = first if nxt is None else min(nxt, first) if state.done is None else nxt
        helper, done, result = state.helper, state.done, state.result
        if nxt is not None and through >= nxt:
            ready = sorted(k for k in pending if k <= through)
            for k in ready:
                if done is not None and k != done + 1:
                    helper = None  # a partition without events ended every run
                rows = pd.concat(pending.pop(k), ignore_index=True)
                helper = self._step(helper, rows, k)
                done = k
            last = int(through)
            if done is None or last > done:
                helper = None
                done = last
            final = helper[helper["state"] == self.pattern.states] if helper is not None else None
            hidden = ["state", *(c for c in self._helper_columns() if c.startswith("var_"))]
            result = None if final is None else final.drop(columns=hidden).reset_index(drop=True)
            nxt = done + 1
        return _PatternState(helper, done, nxt, result, pending)

    def _commit(self, state: _PatternState) -> None:
        self._state = state

    def _columns(self, frame: pd.DataFrame) -> list[str]:
        return list(frame.columns)

    def _check_columns(self, frame: pd.DataFrame) -> None:
        missing = [c for c in self.by + self.sums if c not in frame.columns]
        if missing:
            raise BatchError(
                f"{self.name}: stream table {self.table!r} has no column {missing[0]!r}",
                self.table,
                missing[0],
            )
        clash = [c for c in ("partition", *self._helper_columns()) if c in frame.columns]
        if clash:
            raise BatchError(
                f"{self.name}: stream table {self.table!r} has a column {clash[0]!r}, a name "
                "of the helper state view",
                self.table,
                clash[0],
            )

    def _helper_columns(self) -> list[str]:
        """The helper's columns besides the event's: the FSM state, the match's count and
        sums, and the current variable's count, sums and first values."""
        out = ["state", "count", *(f"sum_{c}" for c in self.sums), "var_count"]
        return out + [f"var_{a}_{c}" for c in self.sums for a in ("sum", "first")]

    def _key_codes(self, frames: Sequence[pd.DataFrame]) -> np.ndarray:
        """One int64 code per row of ``frames`` (concatenated) for its ``by`` key: equal
        keys, equal codes."""
        columns = [np.concatenate([f[c].to_numpy() for f in frames]) for c in self.by]
        return factorize_rows(columns)  # NULL: a key too

    def _check_unique(self, k: int, pieces: list[pd.DataFrame]) -> None:
        codes = self._key_codes(pieces)
        if len(np.unique(codes)) < len(codes):
            keys = pd.concat([p[self.by] for p in pieces], ignore_index=True)
            key = tuple(keys[keys.duplicated()].iloc[0])
            raise BatchError(
                f"{self.name}: key {key} has two events in partition {k} of stream table "
                f"{self.table!r}; a pattern view reads one event per key per partition",
                self.table,
                self.by[0],
                key,
            )

    def _test(self, key: str, new: pd.DataFrame, prev: pd.DataFrame, k: int) -> np.ndarray:
        predicate = self.pattern.where.get(key)
        if predicate is None or not len(new):
            return np.ones(len(new), dtype=bool)
        try:
            out = np.asarray(predicate(new, prev))
        except RingmlError:
            raise
        except Exception as error:  # a user predicate: say which one failed, change nothing
            raise BatchError(
                f"{self.name}: predicate {key!r} failed on partition {k} of {self.table!r}: "
                f"{type(error).__name__}: {error}",
                self.table,
            ) from error
        if out.shape != (len(new),):
            raise BatchError(
                f"{self.name}: predicate {key!r} returned shape {out.shape}, not one boolean per "
                f"event ({len(new)})",
                self.table,
            )
        missing = pd.isna(out)  # NULL (NaN, None, pd.NA of nullable dtypes): not satisfied
        return (np.where(missing, False, out) if missing.any() else out).astype(bool)

    def _step(self, helper: pd.DataFrame | None, rows: pd.DataFrame, k: int) -> pd.DataFrame:
        """``Helper[k]`` from ``Helper[k-1]`` (None: no live runs) and ``S[k]``, with
        ViewDF's CASE arms: the first variable's predicate runs once on the whole partition,
        each state's predicates once on the events of the keys in that state."""
        n = len(rows)
        aggregates = self._helper_columns()
        fresh = self._fresh(rows)
        at = self._lookup(helper, rows)
        prev = self._previous(helper, rows, at, aggregates) if (at >= 0).any() else fresh
        was = prev["state"].to_numpy(np.int64)
        names, kleene, last = self.pattern.variables, self.pattern.kleene, self.pattern.states
        starts = self._test(names[0], rows, fresh, k)
        state = np.zeros(n, dtype=np.int64)
        carried = np.zeros(n, dtype=bool)
        stayed = np.zeros(n, dtype=bool)
        for s in range(1, last + 1):
            here = np.flatnonzero(was == s)
            if not here.size:
                continue
            # the keys in state s have a live run: their predicates see its helper row as
            # stored (exact integers, booleans), not the NaN-padded frame of every key
            new, old = (
                rows.iloc[here],
                self._previous(helper, rows.iloc[here], at[here], aggregates),
            )
            stay = (
                here[self._test(f"{names[s - 1]}[i]", new, old, k)] if kleene[s - 1] else here[:0]
            )
            state[stay] = s
            stayed[stay] = True
            if s < last:
                proceed = here[self._test(names[s], new, old, k)]
                proceed = proceed[~stayed[proceed]]
                state[proceed] = s + 1
                carried[proceed] = True
        carried |= stayed
        state[~carried & starts] = 1
        keep = np.flatnonzero(state > 0)
        out = {c: rows[c].to_numpy()[keep] for c in rows.columns}
        out["partition"] = np.full(len(keep), k, dtype=np.int64)
        out["state"] = state[keep]
        carried, stayed = carried[keep], stayed[keep]
        count = prev["count"].to_numpy(np.int64)[keep]
        out["count"] = np.where(carried, count + 1, 1)
        var_count = prev["var_count"].to_numpy(np.int64)[keep]
        out["var_count"] = np.where(stayed, var_count + 1, 1)
        for c in self.sums:
            value = rows[c].to_numpy(np.float64)[keep]
            before = {a: prev[f"{a}_{c}"].to_numpy(np.float64)[keep] for a in ("sum", "var_sum")}
            out[f"sum_{c}"] = np.where(carried, before["sum"] + value, value)
            out[f"var_sum_{c}"] = np.where(stayed, before["var_sum"] + value, value)
            first = prev[f"var_first_{c}"].to_numpy(np.float64)[keep]
            out[f"var_first_{c}"] = np.where(stayed, first, value)
        return pd.DataFrame(out, columns=[*rows.columns, "partition", *aggregates])

    def _fresh(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The helper row of keys without a live run: the key, NaN event columns and zero
        aggregates."""
        n = len(rows)
        out: dict[str, Any] = {}
        for c in rows.columns:
            out[c] = rows[c].to_numpy() if c in self.by else np.full(n, np.nan)
        for c in self._helper_columns():
            out[c] = np.zeros(n, dtype=np.int64 if c in ("state", "count", "var_count") else float)
        return pd.DataFrame(out, index=rows.index)

    def _lookup(self, helper: pd.DataFrame | None, rows: pd.DataFrame) -> np.ndarray:
        """Per row of ``rows`` the helper row of its key, -1 where the key has no live run."""
        if helper is None or not len(helper):
            return np.full(len(rows), -1, dtype=np.int64)
        codes = self._key_codes([helper, rows])
        return pd.Index(codes[: len(helper)]).get_indexer(codes[len(helper) :])

    def _previous(
        self, helper: pd.DataFrame, rows: pd.DataFrame, at: np.ndarray, aggregates: list[str]
    ) -> pd.DataFrame:
        """The helper rows ``at`` of the keys of ``rows`` (aligned with it), fresh where a
        key has no live run (``at`` -1: NaN event columns, zero aggregates); where every key
        has one, the event columns keep their stored values and dtypes."""
        found = at >= 0
        take = np.where(found, at, 0)
        out: dict[str, Any] = {}
        for c in rows.columns:
            if c in self.by:
                out[c] = rows[c].to_numpy()
            elif c in helper.columns:
                values = helper[c].to_numpy().take(take)
                if found.all():
                    out[c] = values
                elif values.dtype.kind in "iufb":
                    out[c] = np.where(found, values, np.nan)
                else:
                    out[c] = pd.Series(values).where(found).to_numpy()
            else:
                out[c] = np.full(len(rows), np.nan)
        for c in aggregates:
            values = helper[c].to_numpy().take(take)
            out[c] = np.where(found, values, 0).astype(values.dtype)
        return pd.DataFrame(out, index=rows.index)
