"""Reading specs from YAML files or dicts, writing them back, and one-sentence errors.

Any pydantic spec class goes through `load_spec` / `dump_spec`; `spec_error` turns pydantic's
ValidationError into a SpecError whose message is one sentence naming the bad value and what
would be valid.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.workload import Workload

M = TypeVar("M", bound=BaseModel)
Source = str | Path | Mapping[str, Any]


def load_deployment(source: Source) -> Deployment:
    """A Deployment from a YAML file path or a dict; SpecError for any bad input."""
    return load_spec(Deployment, source, "deployment")


def load_workload(source: Source) -> Workload:
    """A Workload from a YAML file path or a dict; SpecError for any bad input."""
    return load_spec(Workload, source, "workload")


def dump_deployment(deployment: Deployment) -> dict[str, Any]:
    """The YAML form of a deployment (keys left at their defaults omitted)."""
    return dump_spec(deployment)


def dump_workload(workload: Workload) -> dict[str, Any]:
    """The YAML form of a workload (keys left at their defaults omitted)."""
    return dump_spec(workload)


def load_spec(cls: type[M], source: Source, name: str) -> M:
    """Validate a dict, or the YAML file at a path, as `cls`; `name` labels errors from dicts."""
    if isinstance(source, str | Path):
        where = str(source)
        data: Any = read_yaml(Path(source))
    else:
        where, data = name, source
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: the top level must be a mapping of keys, not {_kind(data)}")
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        other = other_kind(cls, data)
        if other is not None:
            raise SpecError(f"{where}: is a {other} spec (keys {', '.join(map(str, data))}), "
                            f"not a {KIND_OF.get(cls, name)} spec (keys "
                            f"{', '.join(cls.model_fields)})") from None
        raise spec_error(exc, cls, where) from None


SPEC_KINDS: dict[str, type[BaseModel]] = {"deployment": Deployment, "workload": Workload}
"""The spec files a user hands the commands, by the name errors call them."""

KIND_OF = {cls: name for name, cls in SPEC_KINDS.items()}


def other_kind(cls: type[BaseModel], data: Mapping[Any, Any]) -> str | None:
    """The kind of spec `data` is when it is not a `cls` at all: none of its keys are `cls`'s
    and all are another kind's (a workload file given for a deployment, say); else None."""
    keys = {str(k) for k in data}
    if not keys or keys & set(cls.model_fields):
        return None
    return next((name for name, kind in SPEC_KINDS.items()
                 if kind is not cls and keys <= set(kind.model_fields)), None)


def read_yaml(path: Path) -> Any:
    """The parsed content of a YAML file; SpecError if it cannot be read or parsed."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: is not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # YAML is printable text: no control characters
        raise SpecError(f"{path}: invalid YAML: character #x{exc.character:04x} at position "
                        f"{exc.position} is not printable text") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_NODES:
            raise SpecError(f"{path}: expands to more than {MAX_YAML_NODES:,} YAML nodes "
                            "through its anchors and aliases (a spec has hundreds)")
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # an integer of over 4,300 digits, a date like 2001-02-30
            raise SpecError(f"{path}: invalid YAML: {str(exc).split(':')[0]}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a spec") from None
    finally:
        loader.dispose()


MAX_YAML_NODES = 1_000_000
"""Most nodes a YAML file may expand to once its aliases are followed (a spec has hundreds;
a file that expands anchors into billions would hang whatever reads it)."""


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes of `node` with every alias expanded (shared nodes counted once per use), computed
    once per node; stops counting past MAX_YAML_NODES."""
    key = id(node)
    if key not in memo:
        memo[key] = 1  # a cycle (a recursive alias) counts once
        total = 1
        children = node.value if isinstance(node.value, list) else []
        for child in children:
            parts = child if isinstance(child, tuple) else (child,)
            for part in parts:
                total += _expanded_size(part, memo)
                if total > MAX_YAML_NODES:
                    break
        memo[key] = total
    return memo[key]


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "syntax error"
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return _one_line(f"invalid YAML{at}: {problem}")


def dump_spec(spec: BaseModel) -> dict[str, Any]:
    """The plain-data form of a spec: None and unset defaults left out, union `kind` kept."""
    out: dict[str, Any] = {}
    full = spec.model_dump(mode="json")
    for name in type(spec).model_fields:
        value = getattr(spec, name)
        if value is None or (name not in spec.model_fields_set and name != "kind"):
            continue
        out[name] = dump_spec(value) if isinstance(value, BaseModel) else full[name]
    return out


# --- ValidationError -> one sentence ---------------------------------------------------------

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "int_parsing_size": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "string_too_short": "a non-empty string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
           "less_than_equal": "<="}


def spec_error(exc: ValidationError, cls: type[BaseModel], where: str) -> SpecError:
    """One SpecError sentence for the first error pydantic found validating `cls`."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if err["type"] == "missing" and unknown:
        err = unknown[0]  # a misspelt required key: name the typo, not the key it stood for
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    path, ann = _resolve(cls, loc)
    dotted = ".".join(path)
    what = f"{dotted}={_show(value)}"

    if kind == "extra_forbidden":
        parent_path, parent = _resolve(cls, loc[:-1])
        key = str(loc[-1])
        valid = list(parent.model_fields) if _is_model(parent) else []
        inside = f" in {'.'.join(parent_path)}" if parent_path else ""
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        msg = f"unknown key {key!r}{inside}{hint}; valid keys: {', '.join(valid)}"
    elif kind == "missing":
        inside = f" in {'.'.join(path[:-1])}" if len(path) > 1 else ""
        msg = f"missing required key {str(loc[-1])!r}{inside}"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ", ".join(_tags(ann)) or str(ctx.get("expected_tags", ""))
        if kind == "union_tag_invalid":
            msg = f"{dotted}.kind={_show(ctx.get('tag'))} is not one of {tags}"
        else:
            msg = f"{dotted} needs a kind, one of {tags}"
    elif kind == "literal_error":
        choices = ", ".join(str(c) for c in _literal_choices(ann)) or str(ctx.get("expected"))
        msg = f"{what} is not one of {choices}"
    elif kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        msg = f"{what} must be {_BOUNDS[kind]} {bound}"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        keys = _keys_hint(ann)
        msg = f"{what} must be a mapping{keys}"
    elif kind in ("value_error", "assertion_error"):
        reason = str(ctx.get("error", err["msg"]))
        msg = f"{dotted}: {reason}" if dotted else reason
    elif kind in _EXPECTED:
        msg = f"{what} must be {_EXPECTED[kind]}"
    else:
        text = err["msg"]
        msg = f"{what} is invalid: {text[:1].lower()}{text[1:]}"
    return SpecError(_one_line(f"{where}: {msg}"))


def _resolve(cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], Any]:
    """The display path of a pydantic error location (union tags dropped) and its annotation."""
    ann: Any = cls
    path: list[str] = []
    for item in loc:
        ann = _strip_none(ann)
        members = _tagged_members(ann)
        if isinstance(item, str) and item in members:
            ann = members[item]
        elif _is_model(ann) and item in ann.model_fields:
            ann = ann.model_fields[item].annotation
            path.append(str(item))
        elif isinstance(item, int) and path:
            args = get_args(ann)
            ann = args[0] if args else None
            path[-1] += f"[{item}]"
        else:
            ann = None
            path.append(str(item))
    return path, _strip_none(ann)


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _union_args(ann: Any) -> tuple[Any, ...]:
    return get_args(ann) if get_origin(ann) in (Union, types.UnionType) else ()


def _strip_none(ann: Any) -> Any:
    args = [a for a in _union_args(ann) if a is not type(None)]
    if len(args) == 1:
        return args[0]
    return ann


def _tagged_members(ann: Any) -> dict[str, type[BaseModel]]:
    """{kind: model} of a union of models told apart by a Literal `kind` field."""
    out: dict[str, type[BaseModel]] = {}
    for member in _union_args(ann):
        field = member.model_fields.get("kind") if _is_model(member) else None
        if field is not None:
            for tag in _literal_choices(field.annotation):
                out[str(tag)] = member
    return out


def _tags(ann: Any) -> list[str]:
    return list(_tagged_members(ann))


def _literal_choices(ann: Any) -> list[Any]:
    ann = _strip_none(ann)
    return list(get_args(ann)) if get_origin(ann) is Literal else []


def _keys_hint(ann: Any) -> str:
    if _is_model(ann):
        return f" with keys {', '.join(ann.model_fields)}"
    tags = _tags(ann)
    return f" with a kind, one of {', '.join(tags)}" if tags else ""


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _yamlish(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _yamlish(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _kind(value: Any) -> str:
    if value is None:
        return "an empty document"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({_show(value)})"


def _one_line(text: str) -> str:
    return " ".join(text.split())
