"""Registries: every swappable part of the suite, looked up by the name a config gives it.

A choice registers itself in the module that defines it (`@DECODERS.register("name")`); the factory,
config validation, `hmer models` and the study specs read the registry, nothing else names it
(docs/architecture.md, "Add a decoder in one file"). Each registry names the package whose import fills
it (`home`, relative to `hmer`), imported at the first lookup so that config validation in a fresh process
sees the built-in choices too: the registry's only dependency on a higher layer, by name, at use time.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Generic, Iterator, Mapping, Protocol, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """The named choices of one config key, `key` (`model.decoder`: transformer, rnn, convs2s)."""

    def __init__(self, key: str, home: str | None = None):
        self.key = key
        self.home = home
        self._entries: dict[str, tuple[T, dict[str, Any], str]] = {}  # name -> (choice, linked, description)
        self._home_imported = home is None

    # ---- registering ---------------------------------------------------------------------
    def register(self, name: str, obj: T | None = None, *, linked: Mapping[str, Any] | None = None,
                 description: str = "") -> Any:
        """Register `obj` as `name`; without `obj`, a decorator that registers what it decorates.

        linked: config overrides that come with this choice when a study varies `key`
            (ConvS2S brings its learned token positions); `hmer.studies.spec` applies them.
        description: one line for `hmer models`; default the first line of obj's docstring.
        """
        def add(target: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.key}={name!r} is registered already (by {_origin(self._entries[name][0])})")
            self._entries[name] = (target, dict(linked or {}),
                                   description or _first_line(getattr(target, "__doc__", None)))
            return target

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Forget `name` (tests that register a choice of their own clean up with this)."""
        self.get(name)
        del self._entries[name]

    # ---- looking up ----------------------------------------------------------------------
    def get(self, name: str) -> T:
        entries = self._filled()
        if name not in entries:
            raise ValueError(f"{self.key}={name!r} is not one of {', '.join(entries)}")
        return entries[name][0]

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order."""
        return tuple(self._filled())

    def linked(self, name: str) -> dict[str, Any]:
        """The config overrides that come with choice `name` in a study (often none)."""
        self.get(name)
        return dict(self._entries[name][1])

    def description(self, name: str) -> str:
        self.get(name)
        return self._entries[name][2]

    # A registry stands where a tuple of names stood (`choices=` of argparse, `in`, `join`).
    def __contains__(self, name: object) -> bool:
        return name in self._filled()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._filled())

    def __repr__(self) -> str:
        return f"Registry({self.key!r}: {', '.join(self._entries) or 'nothing yet'})"

    def _filled(self) -> dict[str, tuple[T, dict[str, Any], str]]:
        if not self._home_imported:
            # Set first: the home package's own import may read this registry (and must not recurse).
            self._home_imported = True
            assert self.home is not None  # a registry without a home starts imported
            try:
                importlib.import_module(self.home, package=__package__)
            except BaseException:
                self._home_imported = False
                raise
        return self._entries


def import_submodules(package: str, path: list[str]) -> None:
    """Import every module of `package` (whose `__path__` is `path`), so that each one's
    registrations are made: the pattern of fairseq's model folders. Called from the package's
    `__init__`; a new choice's module needs no import line anywhere."""
    for info in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{info.name}")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0].strip().rstrip(".")


def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


# ---- the registries of the suite ------------------------------------------------------------------
# Each names the config key that selects a choice and the package whose modules register them.

DECODERS: Registry[Callable[..., Any]] = Registry("model.decoder", home=".model")
"""Decoder classes: `cls(cfg: ModelConfig)` -> a `hmer.model.Decoder`."""

TOKEN_POSITIONS: Registry[Callable[..., Any]] = Registry("model.token_pos", home=".model")
"""Token position encodings: `make(d_model, max_len)` -> module; `module(length, start)` -> [length, d]."""

IMAGE_POSITIONS: Registry[Callable[..., Any]] = Registry("model.image_pos", home=".model")
"""Image position encodings: `make(d_model, grid)` -> module; `module(feats, mask)` -> feats + positions."""

COVERAGES: Registry[Any] = Registry("model.coverage", home=".model")
"""CoMER coverage kinds (`hmer.model.transformer.CoverageKind`): which attention maps the ARM sums."""

SEARCH_RULES: Registry[Callable[..., Any]] = Registry("train.search_rule", home=".decoding")
"""Beam search rules: `search(model, feats, mask, direction, *, beam_size, max_len, length_penalty,
sos_id, eos_id, pad_id)` -> per image, token ids left to right without sos/eos."""

class RegisteredMetric(Protocol):
    """What a metric offers (`hmer.evaluation.metrics.Metric`; the foundation imports no layer above it)."""

    @property
    def label(self) -> str: ...
    def read_right(self, distances: Any) -> Any: ...
    def verdicts(self, distances: Any, predictions: Any = None, truths: Any = None) -> Any: ...
    def rate(self, distances: Any, predictions: Any = None, truths: Any = None) -> float: ...


METRICS: Registry[RegisteredMetric] = Registry("metric", home=".evaluation")
"""Expression metrics: `metric.rate(distances, predictions, truths)` -> a rate in percent, from
per-expression token edit distances (or, for a metric that judges the tokens, from the tokens);
each is logged per test year as `test_{year}_{name}`."""

ALL: dict[str, Registry[Any]] = {r.key: r for r in (DECODERS, TOKEN_POSITIONS, IMAGE_POSITIONS, COVERAGES,
                                                   SEARCH_RULES, METRICS)}


def catalogue() -> list[tuple[str, str, str]]:
    """(key, name, description) of every registered choice, registry by registry (`hmer models`)."""
    return [(r.key, name, r.description(name)) for r in ALL.values() for name in r.names()]


def linked_overrides(key: str, value: Any) -> dict[str, Any]:
    """What comes with `key=value` when a study varies `key` (nothing for keys without a registry)."""
    registry = ALL.get(key)
    return registry.linked(value) if registry is not None else {}
