"""Typed handles for named state, and how their values become bytes."""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import re
import types
import typing
from typing import Any, Callable, Generic, Protocol, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_STATE_NAME = re.compile(r"[a-z0-9_-]{1,64}")


class Codec(Protocol[T]):
    """Turns a state value (or map key) into bytes and back.

    `decode` may raise any `Exception` for bytes it cannot read; the SDK turns it into a
    rejection of the record naming the state.
    """

    def encode(self, value: T) -> bytes:
        """The bytes stored for `value`."""
        ...

    def decode(self, data: bytes) -> T:
        """The value stored as `data`."""
        ...


_FIELDS: dict[type, tuple[str, ...]] = {}


def _json_default(value: Any) -> Any:
    """Dataclass instances (nested too) as JSON objects of their fields, in declaration order."""
    cls = type(value)
    names = _FIELDS.get(cls)
    if names is None:
        if not dataclasses.is_dataclass(value):
            raise TypeError(f"{cls.__name__} is not JSON serializable")
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(value))
    return {name: getattr(value, name) for name in names}


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_json_default)
_DECODER = json.JSONDecoder()
# What `json` writes differently from serde_json, outside strings: floats in exponent form
# (`1e+16`, `1e-05`) and non-finite floats (`NaN`, `Infinity`), which serde_json writes as null.
_NOT_SERDE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?(?:NaN|Infinity)|-?\d+(?:\.\d+)?e[+-]\d+)')


def _serde_float(match: re.Match[str]) -> str:
    """A number token of `json`'s output as serde_json (ryu) writes the same float."""
    token = match.group(1)
    if token is None:
        return match.group(0)  # a string: unchanged
    if token.endswith(("NaN", "Infinity")):
        return "null"
    sign = "-" if token.startswith("-") else ""
    mantissa, _, exponent = token.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent)  # decimal point position within `digits`
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    n = len(digits)
    # ryu's `format64`: plain notation for 1e-5 <= |x| < 1e16, else d[.ddd]e[-]x.
    if 0 <= point - n and point <= 16:
        return f"{sign}{digits}{'0' * (point - n)}.0"
    if 0 < point <= 16:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    rest = f".{digits[1:]}" if n > 1 else ""
    return f"{sign}{digits[0]}{rest}e{point - 1}"


def dumps(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON: the bytes `serde_json::to_vec` writes for the same data
    (floats as ryu writes them, NaN and infinities as null); dataclass instances are written
    as objects of their fields. Raises `TypeError` for what JSON cannot hold."""
    text = _ENCODER.encode(value)
    if "e+" in text or "e-" in text or "NaN" in text or "Infinity" in text:
        text = _NOT_SERDE.sub(_serde_float, text)
    return text.encode()


def loads(data: bytes | str) -> Any:
    """The value of UTF-8 JSON bytes (or text). Raises `ValueError` for anything else."""
    return _DECODER.decode(data.decode() if isinstance(data, bytes) else data)


_Convert = Callable[[Any], Any]
_CONVERTERS: dict[Any, _Convert | None] = {}


def _converter(tp: Any) -> _Convert | None:
    """How to turn the JSON value of type `tp` back into `tp` (None: it already is): dataclasses
    (nested, in lists, tuples, dicts and optionals) and tuples; other types are left to `json`."""
    if tp in _CONVERTERS:
        return _CONVERTERS[tp]
    _CONVERTERS[tp] = None  # a recursive dataclass refers to itself: decode what is known
    convert: _Convert | None = None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        convert = _dataclass_converter(tp)
    elif tp is tuple:
        convert = tuple
    elif origin in (typing.Union, types.UnionType):
        options = [c for c in map(_converter, (a for a in args if a is not type(None))) if c]
        if len(options) == 1:
            only = options[0]
            convert = lambda v: None if v is None else only(v)  # noqa: E731
    elif origin in (list, collections.abc.Sequence, collections.abc.Iterable) and args:
        item = _converter(args[0])
        if item is not None:
            convert = lambda v: [item(x) for x in v]  # noqa: E731
    elif origin is tuple:
        items = [_converter(a) for a in args if a is not Ellipsis]
        if len(args) == 2 and args[1] is Ellipsis:
            one = items[0] or (lambda x: x)
            convert = lambda v: tuple(one(x) for x in v)  # noqa: E731
        else:
            each = [c or (lambda x: x) for c in items]
            convert = lambda v: tuple(c(x) for c, x in zip(each, v))  # noqa: E731
    elif origin in (dict, collections.abc.Mapping) and len(args) == 2:
        value = _converter(args[1])
        if value is not None:
            convert = lambda v: {k: value(x) for k, x in v.items()}  # noqa: E731
    _CONVERTERS[tp] = convert
    return convert


def _dataclass_converter(cls: type) -> _Convert:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    init = frozenset(f.name for f in fields if f.init)
    later = frozenset(f.name for f in fields if not f.init)
    nested = {f.name: c for f in fields if (c := _converter(hints.get(f.name, Any))) is not None}

    def convert(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object for {cls.__name__}")
        if nested:
            value = {k: nested[k](v) if k in nested and v is not None else v for k, v in value.items()}
        if init.issuperset(value):
            return cls(**value)
        made = cls(**{k: v for k, v in value.items() if k in init})
        for k in later.intersection(value):
            object.__setattr__(made, k, value[k])
        return made

    return convert


class JsonCodec(Generic[T]):
    """JSON, exactly as the Rust SDK stores state (compact, UTF-8, `serde_json`'s shape).

    A dataclass type is stored as a JSON object of its fields and read back with the fields it
    declares (unknown fields are ignored, as serde does by default; nested dataclasses, lists,
    tuples, dicts and optionals of them are rebuilt from the type hints), so a Rust operator
    and a Python operator read each other's state. Other types are stored as `json` writes them
    (a tuple is read back as a tuple when `type_` says so).
    """

    __slots__ = ("_convert",)

    def __init__(self, type_: type[T] | None = None) -> None:
        self._convert = None if type_ is None else _converter(type_)

    def encode(self, value: T) -> bytes:
        return dumps(value)

    def decode(self, data: bytes) -> T:
        value = loads(data)
        convert = self._convert
        return value if convert is None else convert(value)  # type: ignore[no-any-return]


class RawCodec:
    """Bytes stored as they are (no JSON); for operators that encode values themselves."""

    __slots__ = ()

    def encode(self, value: bytes) -> bytes:
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data


RAW = RawCodec()
"""Stores `bytes` values unchanged: `ValueState("blob", codec=weir.RAW)`."""

Upgrade = Callable[[int, Any], Any]
"""Brings a value written at an older schema version to the current one: called with that
version and the value as JSON (`loads`), returns the current version's JSON."""

_VERSIONED = 0
"""The first byte of a value stored at schema version 1 or above; no JSON text starts with it."""


class VersionedCodec(Generic[T]):
    """A state's values at schema `version` (1 and up), as the Rust SDK's `versioned` stores
    them: byte 0, the version (u32, big-endian), then `inner`'s bytes. A value without the
    header was written at version 0. Older values go through `upgrade` as they are read
    (lazily, as Kafka Streams' KIP-258) and the next write stores them at `version`; a value of
    a newer version raises (the record fails; older code never misreads it).
    """

    __slots__ = ("inner", "version", "upgrade")

    def __init__(self, inner: Codec[T], version: int, upgrade: Upgrade) -> None:
        if type(version) is not int or not 0 < version < 2**32:
            raise ValueError(f"a schema version is 1..2**32-1, not {version!r}")
        self.inner = inner
        self.version = version
        self.upgrade = upgrade

    def encode(self, value: T) -> bytes:
        return bytes([_VERSIONED]) + self.version.to_bytes(4, "big") + self.inner.encode(value)

    def decode(self, data: bytes) -> T:
        if data[:1] == bytes([_VERSIONED]):
            if len(data) < 5:
                raise ValueError("a version header cut short")
            version, payload = int.from_bytes(data[1:5], "big"), data[5:]
        else:
            version, payload = 0, data
        if version == self.version:
            return self.inner.decode(payload)
        if version > self.version:
            raise ValueError(
                f"the value is at schema version {version}; this operator reads up to {self.version}"
            )
        upgraded = self.upgrade(version, loads(payload))
        return self.inner.decode(dumps(upgraded))


def _check_name(name: str) -> str:
    if not _STATE_NAME.fullmatch(name):
        raise ValueError(f"state name {name!r} must be 1..=64 characters of [a-z0-9_-]")
    return name


def _check_ttl(ttl_ms: int | None) -> int | None:
    if ttl_ms is not None and (type(ttl_ms) is not int or not 0 < ttl_ms < 2**64):
        raise ValueError(f"ttl_ms must be a positive number of milliseconds, not {ttl_ms!r}")
    return ttl_ms


class ValueState(Generic[T]):
    """A named value state: one `T` per key, as Flink's `ValueState`.

    Declare it once at module level, list it in `Operator.states`, and use it through the
    context: `ctx.get(STATE)`, `ctx.set(STATE, value)`, `ctx.clear(STATE)`.

    `type_` is the value's type; a dataclass is stored as a JSON object of its fields, anything
    else `json` can write as itself. `ttl_ms` expires a value that many milliseconds of processing
    time after its last write (as Flink's `StateTtlConfig` with `OnCreateAndWrite`); `codec`
    replaces JSON (see `Codec`, `RAW`). `version` (1 and up) with `upgrade` declares the value's
    schema version and how older values are upgraded as they are read (see `VersionedCodec`);
    the host refuses a switch to an operator whose version of the state is lower.

    Raises `ValueError` for a name that is not 1..=64 characters of `[a-z0-9_-]`, a TTL that
    is not positive, or a version without an upgrade.
    """

    __slots__ = ("name", "ttl_ms", "codec", "version")

    kind = "value"

    def __init__(
        self,
        name: str,
        type_: type[T] | None = None,
        *,
        ttl_ms: int | None = None,
        codec: Codec[T] | None = None,
        version: int = 0,
        upgrade: Upgrade | None = None,
    ) -> None:
        self.name = _check_name(name)
        self.ttl_ms = _check_ttl(ttl_ms)
        plain: Codec[T] = codec if codec is not None else JsonCodec(type_)
        self.version = version
        self.codec: Codec[T] = _versioned(name, plain, version, upgrade)

    def __repr__(self) -> str:
        return f"ValueState({self.name!r}, ttl_ms={self.ttl_ms!r})"


class MapState(Generic[K, V]):
    """A named map state: an ordered map from `K` to `V` per key, as Flink's `MapState`.

    Use it through `ctx.map(STATE)`, a `MutableMapping` view. Keys and values are stored as
    JSON (as the Rust SDK does) and iterated in ascending order of the *encoded* key bytes:
    for strings that is the byte order of the JSON text, for integers it is not numeric order
    (`10` sorts before `9`).

    `version` and `upgrade` version the values (never the keys), as `ValueState`'s do.

    Raises `ValueError` as `ValueState` does.
    """

    __slots__ = ("name", "ttl_ms", "key_codec", "value_codec", "version")

    kind = "map"

    def __init__(
        self,
        name: str,
        key_type: type[K] | None = None,
        value_type: type[V] | None = None,
        *,
        ttl_ms: int | None = None,
        key_codec: Codec[K] | None = None,
        value_codec: Codec[V] | None = None,
        version: int = 0,
        upgrade: Upgrade | None = None,
    ) -> None:
        self.name = _check_name(name)
        self.ttl_ms = _check_ttl(ttl_ms)
        self.key_codec: Codec[K] = key_codec if key_codec is not None else JsonCodec(key_type)
        plain: Codec[V] = value_codec if value_codec is not None else JsonCodec(value_type)
        self.version = version
        self.value_codec: Codec[V] = _versioned(name, plain, version, upgrade)

    def __repr__(self) -> str:
        return f"MapState({self.name!r}, ttl_ms={self.ttl_ms!r})"


State = ValueState[Any] | MapState[Any, Any]


def _versioned(name: str, codec: Codec[T], version: int, upgrade: Upgrade | None) -> Codec[T]:
    if version == 0 and upgrade is None:
        return codec
    if upgrade is None:
        raise ValueError(f"state {name!r} at schema version {version} needs an upgrade")
    return VersionedCodec(codec, version, upgrade)
