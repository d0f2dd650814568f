"""What a config field allows, declared beside the field, and the checks that hold values to it.

Every field of `hmer.config` is declared with `allowed(default, ...)`, which says once what values it
takes, in one line per field (docs/training.md, "What each config value allows"); `Config.validate` (run
by every build and override) checks them all, then the cross-field `Rule`s of `hmer.config.RULES`. A
field declared without it fails tests/test_bad_input.py.

A value that is not allowed is a `ConfigError`: one line naming the key, the value and what the key
takes. This module knows nothing of the config's sections; `hmer.config` is the schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, get_type_hints

ALLOWED = "hmer.allowed"  # the dataclass field metadata key


class ConfigError(ValueError):
    """A config value outside what its field allows: one line naming the key, the value and what is allowed."""


@dataclass(frozen=True)
class Allowed:
    """What one field takes; see `allowed`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    one_of: Any = None  # a tuple of names, a Registry, or a function returning the names
    text: str = ""  # free text: what it is, in words
    check: Callable[[Any], bool] | None = None
    says: str = ""  # with `check`: what it accepts, in words
    bad_example: Any = None  # with `check`: a value it refuses (the tests try it)

    def choices(self) -> tuple[str, ...]:
        names = self.one_of() if callable(self.one_of) and not hasattr(self.one_of, "names") else self.one_of
        return tuple(names.names() if hasattr(names, "names") else names)

    def describe(self, typ: type) -> str:
        """What the field takes, in words: "an integer >= 1", "a number in [0, 1)", "one of a, b"."""
        if self.one_of is not None:
            return f"one of {', '.join(self.choices())}"
        if self.text:
            return f"text: {self.text}"
        if self.says:
            return self.says
        if typ is bool:
            return "true or false"
        kind = "an integer" if typ is int else "a number"
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            return f"{kind} in {low}, {high}"
        if low:
            return f"{kind} {'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{kind} {'<=' if self.le is not None else '<'} {high[:-1]}"
        return kind

    def admits(self, value: Any, typ: type) -> bool:
        """Whether `value` (already of the field's type) is allowed."""
        if self.one_of is not None:
            return value in self.choices()
        if self.check is not None:
            return bool(self.check(value))
        if typ in (int, float):
            return (math.isfinite(value)
                    and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                    and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
        return True


def allowed(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, one_of: Any = None, text: str = "", check: Callable[[Any], bool] | None = None,
            says: str = "", bad_example: Any = None) -> Any:
    """A config field with its default and what it allows (see the module docstring)."""
    if check is not None and (not says or bad_example is None):
        raise TypeError("allowed(check=...) needs says= (what it accepts) and bad_example= (a value it refuses)")
    return field(default=default, metadata={ALLOWED: Allowed(ge=ge, gt=gt, le=le, lt=lt, one_of=one_of, text=text,
                                                              check=check, says=says, bad_example=bad_example)})


@dataclass(frozen=True)
class Rule:
    """A rule between fields: `holds(*values of keys)` must be true, else `says` (words, or a
    function of the values giving them) follows the keys and their values in the error."""

    keys: tuple[str, ...]
    holds: Callable[..., bool]
    says: str | Callable[..., str]

    def check(self, values: dict[str, Any]) -> None:
        args = [values[k] for k in self.keys]
        if not self.holds(*args):
            says = self.says(*args) if callable(self.says) else self.says
            named = ", ".join(f"{k}={v!r}" for k, v in zip(self.keys, args))
            raise ConfigError(f"{named}: {says}")


def allowed_of(cls: type, name: str) -> Allowed:
    found = next(f for f in fields(cls) if f.name == name)
    try:
        return found.metadata[ALLOWED]
    except KeyError:
        raise TypeError(f"config field {cls.__name__}.{name} is declared without allowed(...): say what it takes") \
            from None


def check_section(section: Any, prefix: str, rules: Iterable[Rule] = ()) -> None:
    """Each field of `section` (a dataclass) is of its type and allowed; then the `rules` among its own
    keys ("prefix.field"). ConfigError at the first that is not."""
    hints = get_type_hints(type(section))
    for f in fields(section):
        check_value(f"{prefix}.{f.name}", getattr(section, f.name), hints[f.name], allowed_of(type(section), f.name))
    flat = {f"{prefix}.{f.name}": getattr(section, f.name) for f in fields(section)}
    for rule in rules:
        if all(k in flat for k in rule.keys):
            rule.check(flat)


def check_value(key: str, value: Any, typ: type, rule: Allowed) -> None:
    """`value` is of `typ` and allowed by `rule`; else the ConfigError that names `key`."""
    if not of_type(value, typ) or not rule.admits(value, typ):
        raise _refuse(key, value, typ, rule)


def coerce(key: str, raw: Any, typ: Any, rule: Allowed) -> Any:
    """`raw` (text from the command line or MLflow params, or a value from JSON or Optuna) as the
    field's type, checked; ConfigError naming the key, the value and what is allowed."""
    value = _as_type(raw, typ)
    if value is None:
        raise _refuse(key, raw, typ, rule)
    check_value(key, value, typ, rule)
    return value


def _refuse(key: str, value: Any, typ: type, rule: Allowed) -> ConfigError:
    if rule.one_of is not None:
        return ConfigError(f"{key}={value!r} is not one of {', '.join(rule.choices())}")
    return ConfigError(f"{key}={value!r} is not allowed: {key} takes {rule.describe(typ)}")


def of_type(value: Any, typ: type) -> bool:
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def _as_type(raw: Any, typ: Any) -> Any:
    """`raw` as `typ`, or None when it is not one."""
    if isinstance(raw, str) and typ is not str:
        text = raw.strip().lower()
        if typ is bool:
            return True if text in ("1", "true", "yes", "on") else False if text in ("0", "false", "no", "off") \
                else None
        try:
            number = float(text) if typ is float or "e" in text or "." in text else int(text)
        except ValueError:
            return None
        raw = number
    if typ is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if typ is int and isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return raw if of_type(raw, typ) else None
