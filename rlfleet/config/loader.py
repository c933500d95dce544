"""TOML composition and CLI overrides: `@ a.toml @ b.toml --orchestrator.batch-size 32`.

Files merge left to right (tables deep-merge, scalars and arrays replace), then dashed overrides
apply. Validation errors are reported with the dotted path of the offending field.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot start: bad file, unknown key, wrong type or impossible value."""


def raise_if(problems: list[str]) -> None:
    """Every launch check's problems at once, one a line, as the CLI prints them."""
    if problems:
        raise ConfigError("cannot start:\n" + "\n".join(f"  {p}" for p in problems))


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from e


def _parse_value(raw: str) -> Any:
    """TOML literal if it parses (numbers, bools, arrays, quoted strings), else the raw string;
    `null` unsets an optional key a config file set (TOML has no null)."""
    if raw == "null":
        return None
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = [k.replace("-", "_") for k in dotted.split(".")]
    if not all(keys):
        raise ConfigError(f"bad override --{dotted}")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--{dotted}: '{k}' is not a table")
        node = child
    node[keys[-1]] = value


def parse_args(argv: Sequence[str], flags: list[str] | None = None) -> dict[str, Any]:
    """Turn `@ file ... --a.b value --flag` into one merged dict; bare `--flag`s go to `flags`."""
    merged: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "@":
            if i + 1 >= len(argv):
                raise ConfigError("'@' must be followed by a TOML file")
            merged = deep_merge(merged, load_toml(argv[i + 1]))
            i += 2
        elif arg.startswith("@") and len(arg) > 1:
            merged = deep_merge(merged, load_toml(arg[1:]))
            i += 1
        elif arg.startswith("--"):
            key, eq, inline = arg[2:].partition("=")
            if eq:
                value: Any = _parse_value(inline)
                i += 1
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and argv[i + 1] != "@":
                value = _parse_value(argv[i + 1])
                i += 2
            else:
                value = True
                i += 1
                if flags is not None:
                    flags.append(key.replace("-", "_"))
            _set_dotted(overrides, key, value)
        else:
            raise ConfigError(f"unexpected argument {arg!r}: use '@ file.toml' or '--section.key value'")
    return deep_merge(merged, overrides)


_OWN_FIELD = re.compile(r"([a-z_][a-z0-9_]*): ")


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {got!r})"
        # Cross-field validators name their own fields at the start of the message; a section's
        # names a field of its own (`port: ...`), shown under the section's path.
        loc = ".".join(str(p) for p in e["loc"])
        if loc and (own := _OWN_FIELD.match(msg)):
            loc, msg = f"{loc}.{own[1]}", msg[own.end() :]
        lines.append(f"  {loc}: {msg}{shown}" if loc else f"  {msg}{shown}")
    return "invalid config:\n" + "\n".join(lines)


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def _check_flags(model: type[BaseModel], flags: list[str]) -> None:
    """A bare `--key` means true, so it is only valid for a bool field (pydantic would cast it)."""
    for dotted in flags:
        node: Any = model
        for part in dotted.split("."):
            field = (
                node.model_fields.get(part)
                if isinstance(node, type) and issubclass(node, BaseModel)
                else None
            )
            node = field.annotation if field else None
        if node is not None and node is not bool:
            raise ConfigError(f"--{dotted} needs a value")


def load(model: type[M], argv: Sequence[str]) -> M:
    flags: list[str] = []
    data = parse_args(argv, flags)
    _check_flags(model, flags)
    return validate(model, data)


def to_toml(cfg: BaseModel) -> str:
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
