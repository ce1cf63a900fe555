"""A method's own parameters as a typed, checked value.

A method declares them as a nested frozen dataclass subclassing `MethodParams`, every field with a
type and a default; `check()` adds what the types cannot say (a range, a relation). The values are
checked when a `DecodingConfig` is made, so a bad one is one line before any model loads, from
Python or the command line (`--params NAME=JSON`). A store records them with the method's results
and its tables label runs by them.

    @register_method
    class Boost(Method):
        name = "boost"

        @dataclass(frozen=True)
        class Params(MethodParams):
            factor: float = 5.0

            def check(self):
                check_number("factor", self.factor, above=0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON-like value fits a simple annotation (float, int, str, bool, list, tuple,
    dict, X | None, Any); other annotations are the method's own `check()` to enforce."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a float here, as in JSON
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint in (list, tuple) or origin in (list, tuple):  # a frozen config keeps lists as tuples
        return isinstance(value, (list, tuple))
    if hint is dict or origin is dict:
        return isinstance(value, Mapping)
    return True


@dataclasses.dataclass(frozen=True)
class MethodParams:
    """A method's own parameters (see the module docstring): subclass it as a frozen dataclass."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _matches(value, hints.get(f.name, Any)):
                raise ConfigError(f"parameter {f.name!r} must be {_hint_name(hints[f.name])}, got {brief(value)}")
        try:
            self.check()
        except ConfigError:
            raise
        except ValueError as e:  # a researcher's check may raise the plain error: it is still one line
            raise ConfigError(str(e)) from None

    def check(self) -> None:
        """Refuse values the types allow but the method does not: raise a ValueError (or a
        ConfigError) naming the parameter."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter's default; a parameter without one is a ConfigError (a run must be
        reproducible from its method's name and the values it changed)."""
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                raise ConfigError(f"{cls.__qualname__}: parameter {f.name!r} needs a default")
        return out

    @classmethod
    def of(cls, method: str, values: Mapping[str, Any]) -> "MethodParams":
        """The parameters from `values` (the rest at their defaults); an unknown name is a ConfigError."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ConfigError(f"method {method!r} has no parameter {unknown[0]!r} (its parameters: "
                              f"{', '.join(names) or 'none'})")
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"method {method!r}: {e}") from None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_params_class(method: str, params: Any) -> None:
    """A ConfigError unless `params` is a frozen dataclass subclassing `MethodParams` whose every
    field has a default."""
    # its own decorator, not one inherited from MethodParams: else its annotations would be no fields
    if not (isinstance(params, type) and issubclass(params, MethodParams) and "__dataclass_params__" in vars(params)
            and params.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise ConfigError(f"method {method!r}: its Params must be a @dataclass(frozen=True) subclassing MethodParams")
    params.defaults()


class RunSettings(Protocol):
    """What a method reads of its run's `DecodingConfig` (typed here, so that the methods need not
    import the config that names them): the shared settings, its `params`, and `parameter(name)`
    for a parameter the method may lack (the generic loop asks every method for DySCO's schedule).
    The flat names of the older config (`config.beta`) still read through, for one release, with
    a notice."""

    def parameter(self, name: str) -> Any: ...

    @property
    def method(self) -> str: ...

    @property
    def params(self) -> MethodParams | None: ...

    @property
    def options(self) -> tuple[tuple[str, Any], ...]: ...

    @property
    def warmup(self) -> int: ...

    def __getattr__(self, name: str) -> Any: ...


def legacy_params_class(owner: type, method: str, fields: Any, options: dict[str, Any],
                        flat: Mapping[str, tuple[Any, Any]],
                        check_flat: Callable[[Mapping[str, Any]], None],
                        rename: Callable[[str], str]) -> type[MethodParams]:
    """The `Params` of a method declared the older way: the flat `fields` it names (declared as
    the built-in method that owns each declares it, in `flat`, under the name `rename` gives its
    parameter there, and checked as it checks them, by `check_flat`) and its `options` (any JSON
    value, their defaults as given), checked by its `check_options`."""
    unknown = sorted(set(fields) - set(flat))
    if unknown:
        raise ConfigError(f"method {method!r} names fields that are no method's ({', '.join(unknown)}); "
                          "its own parameters go in its `options`")
    both = sorted({rename(name) for name in fields} & set(options))
    if both:
        raise ConfigError(f"method {method!r} names {both[0]!r} both in its fields and in its options")
    declared: list[tuple[str, Any, dataclasses.Field]] = [
        (rename(name), flat[name][0], dataclasses.field(default=flat[name][1])) for name in sorted(fields)]
    # a mutable default (a list, an object) is shared by no two configs: each is given it anew
    declared += [(name, Any, dataclasses.field(default_factory=functools.partial(_copied, value))) for name, value in
                 options.items()]

    def check(self) -> None:
        check_flat({name: getattr(self, rename(name)) for name in fields})
        owner.check_options({name: getattr(self, name) for name in options})  # type: ignore[attr-defined]

    made = dataclasses.make_dataclass(f"{owner.__name__}Params", declared, bases=(MethodParams,), frozen=True,
                                      namespace={"check": check, "legacy": True})
    made.__module__ = owner.__module__
    made.__qualname__ = f"{owner.__qualname__}.Params"
    return made


def _copied(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copied(v) for k, v in value.items()}
    return [_copied(v) for v in value] if isinstance(value, (list, tuple)) else value
