"""YAML and dict mapping of the GRPO configuration: type checks by annotation, dotted overrides."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from entrepot.grpo.config.root import GRPOConfig
from entrepot.grpo.errors import GRPOConfigError

__all__ = ["config_from_dict", "config_to_dict", "dump_yaml", "load_config"]


def config_to_dict(config: Any) -> dict[str, Any]:
    """The config tree as plain Python values (tuples become lists), ready for YAML or JSON."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    result = plain(config)
    assert isinstance(result, dict)
    return result


def dump_yaml(config: GRPOConfig, path: str | Path | None = None) -> str:
    """Render the config as YAML (and write it to `path` when given)."""
    import yaml

    text = yaml.safe_dump(config_to_dict(config), sort_keys=False)
    if path is not None:
        Path(path).write_text(text)
    return str(text)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against annotation `tp`; return it converted (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    wrong = GRPOConfigError(f"{key} ({value!r}) must be {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise GRPOConfigError(f"{key} ({value!r}) must be a mapping of the {key} section's keys")
        return _build(tp, value, key)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise wrong
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except GRPOConfigError:
                continue
        raise wrong
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise wrong
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise GRPOConfigError(f"{key} ({value!r}) must be a list of {len(args)} values")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise GRPOConfigError(f"{key} ({value!r}) must be a list")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise GRPOConfigError(f"{key} ({value!r}) must be a mapping")
        return {_coerce(k, key_tp, key): _coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads "3e-3" (no dot) as a string: YAML 1.1's float syntax
            try:
                return float(value)
            except ValueError:
                raise wrong from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise wrong
        return value
    raise GRPOConfigError(f"{key}: unsupported annotation {tp!r}")  # programmer error in this module


def _keys_of(cls: Any, prefix: str) -> list[str]:
    """Every section and key of dataclass `cls` as a dotted name (`rollout`, `rollout.max_new_tokens`)."""
    keys: list[str] = []
    for name, tp in typing.get_type_hints(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if dataclasses.is_dataclass(tp):
            keys += _keys_of(tp, f"{key}.")
    return keys


@functools.cache
def _dotted_keys() -> tuple[str, ...]:
    """Every valid dotted key of `GRPOConfig` (computed once)."""
    return tuple(_keys_of(GRPOConfig, ""))


def _did_you_mean(where: str) -> str:
    """`" (did you mean 'rollout.max_new_tokens'?)"` for the valid dotted key nearest `where`, or "".

    In order: the one key elsewhere with the same last part (`lr` -> `algorithm.lr`), the closest
    spelling in the same section (`difflib`), the closest dotted key anywhere (`algo.kl_coef`).
    """
    section, _, leaf = where.rpartition(".")
    keys = [k for k in _dotted_keys() if not where.startswith(f"{k}.")]  # not its own section
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == section]
    if len(same_leaf) == 1:
        close = same_leaf
    elif near := difflib.get_close_matches(leaf, siblings, n=1):
        close = [f"{section}.{near[0]}" if section else near[0]]
    else:
        close = difflib.get_close_matches(where, keys, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


# Keys that moved, old dotted name -> new one: refused naming the new key (YAML and overrides alike).
# A renamed key left at null, its old default, says nothing and is dropped: every config a run saved
# before the rename holds it so (`algorithm.max_staleness: null`), and resume, export and eval read them.
_RENAMED_KEYS: dict[str, str] = {"algorithm.max_staleness": "trainer.max_staleness"}


def _build(cls: Any, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    dotted = [f"{prefix}.{k}" if prefix else str(k) for k in unknown]
    said_nothing = {
        k for k, where in zip(unknown, dotted, strict=True) if where in _RENAMED_KEYS and data[k] is None
    }
    data = {k: v for k, v in data.items() if k not in said_nothing}
    unknown = [k for k in unknown if k not in said_nothing]
    dotted = [f"{prefix}.{k}" if prefix else str(k) for k in unknown]
    for where in dotted:
        if where in _RENAMED_KEYS:
            raise GRPOConfigError(f"{where} was renamed: use {_RENAMED_KEYS[where]}")
    if unknown:
        where = dotted[0]
        raise GRPOConfigError(
            f"unknown key {where!r}{_did_you_mean(where)}; allowed keys here: {', '.join(names)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
            # Partial sections merge onto the section's defaults.
            kwargs[name] = _build(tp, value, key)
        else:
            kwargs[name] = _coerce(value, tp, key)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # e.g. a section given as a scalar
        raise GRPOConfigError(f"{prefix or 'config'}: {exc}") from exc


def config_from_dict(data: Mapping[str, Any]) -> GRPOConfig:
    """Build a validated `GRPOConfig` from a nested mapping (missing keys take their defaults)."""
    if not isinstance(data, Mapping):
        raise GRPOConfigError(f"config ({type(data).__name__}) must be a mapping of sections")
    config = _build(GRPOConfig, data, "")
    assert isinstance(config, GRPOConfig)
    return config


def _apply_override(tree: dict[str, Any], override: str) -> None:
    import yaml

    if "=" not in override:
        raise GRPOConfigError(f"override {override!r} must look like section.key=value")
    dotted, raw = override.split("=", 1)
    dotted = dotted.strip()
    parts = dotted.split(".")
    if not all(parts):
        raise GRPOConfigError(f"override key {dotted!r} must be a dotted key like algorithm.kl_coef")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise GRPOConfigError(f"{dotted}: cannot parse value {raw!r}: {exc}") from exc
    node: Any = tree
    cls: Any = GRPOConfig
    for depth, part in enumerate(parts[:-1]):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints or not dataclasses.is_dataclass(hints[part]):
            where = ".".join(parts[: depth + 1])
            hint = _did_you_mean(dotted) or _did_you_mean(where)
            raise GRPOConfigError(f"unknown section {where!r} in override {override!r}{hint}")
        cls = hints[part]
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise GRPOConfigError(f"{'.'.join(parts[: depth + 1])} must be a mapping")
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> GRPOConfig:
    """Load a YAML config (or the embedded default when `path` is None) and apply dotted overrides.

    Args:
        path: YAML file whose sections map onto `GRPOConfig`; missing keys keep their defaults.
        overrides: strings like ``"algorithm.kl_coef=0.01"``; values are parsed as YAML scalars.

    Raises:
        GRPOConfigError: unknown key, wrong type, impossible value or combination (message names the
            dotted key, the value and what is allowed), or an unreadable file.
    """
    import yaml

    tree: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise GRPOConfigError(f"config file {str(file)!r} does not exist")
        try:
            loaded = yaml.safe_load(file.read_text())
        except yaml.YAMLError as exc:
            raise GRPOConfigError(f"config file {str(file)!r} is not valid YAML: {exc}") from exc
        if loaded is not None:
            if not isinstance(loaded, dict):
                raise GRPOConfigError(
                    f"config file {str(file)!r} must hold a mapping, got {type(loaded).__name__}"
                )
            tree = loaded
    for override in overrides:
        _apply_override(tree, override)
    return config_from_dict(tree)
