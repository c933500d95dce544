"""The configuration reference, written from the pydantic models so that it cannot drift.

A mkdocs hook (`hooks:` in mkdocs.yml): at every build it walks the root model of each command
(`rlfleet rl` -> RLConfig, ...) and adds `reference/config.md` to the site, one table per section
with each key's type, default and `Field(description=...)`, and each model's docstring above it.
A field without a description is a build warning naming it, so `mkdocs build --strict` (what
`make test` runs) fails until it has one.

`python scripts/config_reference.py [out.md]` prints (or writes) the same page, and lists the
fields without a description on stderr.
"""

from __future__ import annotations

import html
import importlib
import inspect
import json
import logging
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = "reference/config.md"
log = logging.getLogger("mkdocs.hooks.config_reference")

# (command, root model, what the page says about it), in the order of the page
ROOTS: list[tuple[str, str, str]] = [
    ("rl", "RLConfig", "The RL run: `rlfleet rl @ cfg.toml`, the `rl/main` deployment's `config` parameter."),
    ("sft", "SFTConfig", "Supervised fine-tuning: `rlfleet sft @ cfg.toml`."),
    ("eval", "EvalJobConfig", "`rlfleet eval`: a checkpoint of a run (or the base model) on its own vLLM."),
    (
        "trainer",
        "TrainerJobConfig",
        "`rlfleet trainer`: the trainer alone (the `rl` flow writes it as `configs/trainer.toml`).",
    ),
    (
        "inference",
        "InferenceJobConfig",
        "`rlfleet inference`: vLLM replicas alone (the `rl` flow writes it as `configs/inference.toml`).",
    ),
    (
        "fleet",
        "rlfleet.config.fleet.FleetConfig",
        "`rlfleet fleet up @ fleet.toml`: a warm fleet (fleet.md).",
    ),
]

INTRO = """\
# Configuration reference

Generated from the pydantic models in `rlfleet/config/` at every docs build
(`scripts/config_reference.py`); edit a field's `Field(description=...)` or a model's
docstring, not this page.

TOML files compose left to right, and dashed CLI overrides come last:
`rlfleet rl @ examples/tiny/rl.toml @ mine.toml --orchestrator.batch-size 32`. Every model forbids
unknown keys, so a typo fails before anything starts, naming the field's dotted path. The resolved
config and the sub-configs of each process are written to `<output_dir>/configs/`.

"""


@dataclass
class Section:
    anchor: str
    title: str
    model: type[BaseModel]
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


@dataclass
class Walk:
    sections: list[Section] = field(default_factory=list)
    documented: dict[type, str] = field(default_factory=dict)  # model class -> anchor
    missing: list[str] = field(default_factory=list)  # "module.Class.field"
    labels: dict[type, str] = field(default_factory=dict)  # a union member's link text: its tag


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _union_members(tp: Any) -> list[Any]:
    tp = _strip(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(tp)]
    return [tp]


def _models(tp: Any) -> tuple[list[type[BaseModel]], bool]:
    """The models a field holds (a union's members), and whether it is a list of them."""
    tp = _strip(tp)
    is_list = typing.get_origin(tp) is list
    if is_list:
        tp = typing.get_args(tp)[0]
    found = [m for m in _union_members(tp) if inspect.isclass(m) and issubclass(m, BaseModel)]
    return found, is_list


def _tag(model: type[BaseModel]) -> str | None:
    """`type = "python"` for a member of a union picked by a one-value Literal field (its tag)."""
    for name, f in model.model_fields.items():
        tp = _strip(f.annotation)
        if typing.get_origin(tp) is Literal and len(typing.get_args(tp)) == 1:
            return f"{name} = {json.dumps(typing.get_args(tp)[0])}"
    return None


def _type_str(tp: Any, links: dict[type, str], labels: dict[type, str]) -> str:
    tp = _strip(tp)
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "none"
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_str(a, links, labels) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_str(typing.get_args(tp)[0], links, labels)}"
    if origin is tuple:
        return "[" + ", ".join(_type_str(a, links, labels) for a in typing.get_args(tp)) + "]"
    if origin is dict:
        return "table"
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        anchor, text = links.get(tp), labels.get(tp, "table")
        return f"[{text}](#{anchor})" if anchor else text
    if tp is typing.Any:
        return "any"
    return f"`{getattr(tp, '__name__', str(tp))}`"


def _toml(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "`[" + ", ".join("{" + (_tag(type(v)) or "") + "}" for v in value) + "]`"
    return f"`{json.dumps(value)}`"


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        try:
            value = f.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "computed"
        return _toml(value)
    return _toml(f.default) if f.default is not PydanticUndefined else "required"


def _cell(text: str) -> str:
    """Markdown table cell: pipes escaped, HTML escaped outside `code`, one line."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = html.escape(parts[i], quote=False)
    return "`".join(parts).replace("|", "\\|")


def _doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")
    return inspect.cleandoc(own) if own else ""


def _owner(model: type[BaseModel], name: str) -> str:
    """The class that declares the field (a base's field is missing once, not in every root)."""
    for klass in model.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return f"{klass.__module__}.{klass.__qualname__}.{name}"
    return f"{model.__module__}.{model.__qualname__}.{name}"


def _description(model: type[BaseModel], name: str, f: FieldInfo, found: list[type[BaseModel]]) -> str | None:
    """The field's own description; a table's may come from its model's docstring, and a union
    member's `type` needs none (its section's title says it)."""
    if f.description:
        return f.description
    if len(found) == 1 and (doc := _doc(found[0])):
        return doc.split("\n\n")[0]
    if (tag := _tag(model)) and tag.startswith(f"{name} = "):
        return f"Picks this table: `{tag}`."
    return None


def walk(model: type[BaseModel], path: str, title: str, anchor: str, w: Walk, tag: str = "") -> None:
    """One section for `model` at `path`, then one per table below it not documented yet. `tag`
    (a union member's type) goes into the sub-sections' titles and anchors."""
    section = Section(anchor, title, model)
    w.sections.append(section)
    w.documented[model] = anchor
    children: list[tuple[type[BaseModel], str, str, str, str]] = []
    for name, f in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        found, is_list = _models(f.annotation)
        for m in found:
            if m in w.documented:
                continue
            member = _tag(m) if len(found) > 1 else None
            if member:
                w.labels[m] = member
            sub_title = f"[[{dotted}]]" if is_list else f"[{dotted}]"
            sub_anchor = dotted
            if member:
                sub_title += f" {member}"
                sub_anchor += "-" + json.loads(member.split(" = ", 1)[1])
            elif tag:
                sub_title += f" ({tag})"
                sub_anchor += "-" + json.loads(tag.split(" = ", 1)[1])
            sub_anchor = sub_anchor.replace(".", "-").replace("_", "-")
            w.documented[m] = sub_anchor  # the row below links to it before it is written
            children.append((m, dotted, sub_title, sub_anchor, member or tag))
        desc = _description(model, name, f, found)
        if desc is None:
            w.missing.append(_owner(model, name))
        section.rows.append(
            (
                name,
                _type_str(f.annotation, w.documented, w.labels),
                _default(f),
                _cell(desc or "**(no description)**"),
            )
        )
    for m, dotted, sub_title, sub_anchor, sub_tag in children:
        walk(m, dotted, sub_title, sub_anchor, w, sub_tag)


def render() -> tuple[str, list[str]]:
    from rlfleet.config import models

    w = Walk()
    out = [INTRO]
    for command, cls_name, about in ROOTS:
        module, _, name = cls_name.rpartition(".")
        root = getattr(importlib.import_module(module) if module else models, name)
        start = len(w.sections)
        walk(root, "", f"`rlfleet {command}`", f"rlfleet-{command}", w)
        for i, s in enumerate(w.sections[start:]):
            level = "##" if i == 0 else "###"
            out.append(f"{level} {s.title} {{ #{s.anchor} }}\n")
            if i == 0:
                out.append(f"{about} Root model: `{root.__module__}.{root.__qualname__}`.\n")
            if doc := _doc(s.model):
                out.append(doc + "\n")
            out.append("| key | type | default | description |\n|---|---|---|---|")
            out.extend(f"| `{n}` | {t} | {d} | {desc} |" for n, t, d, desc in s.rows)
            out.append("")
    return "\n".join(out), sorted(set(w.missing))


# --- the mkdocs hook --------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    text, missing = render()
    for name in missing:
        log.warning(f"config field without Field(description=...): {name}")
    files.append(File.generated(config, PAGE, content=text))
    return files


if __name__ == "__main__":
    text, missing = render()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        print(text)
    for name in missing:
        print(f"no description: {name}", file=sys.stderr)
    sys.exit(1 if missing else 0)
