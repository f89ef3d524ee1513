"""JSON Schemas of conf/'s option files, made from the constructors their `_target_`s name (the
annotations `settings.check_targets` checks a run's values against), for editors that read YAML
through yaml-language-server (VS Code's YAML extension, Neovim's yamlls, Helix, Zed): keys
completed, each one's type, bounds, default and comment on hover, a wrong value marked as you type.
Each option file's first line points the editor at its schema (`# yaml-language-server: $schema=`).

    python -m litforge.schemas          # write conf/.schemas/ and the option files' first lines
    python -m litforge.schemas --check  # exit 1 when any is stale (tests/schemas runs this)

Run it again after adding an option file (`conf/model/my_net.yaml`) or a constructor argument.
Option files that name no class (experiments, overlays, defaults lists) get none.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from annotated_types import DocInfo
from omegaconf import OmegaConf

from litforge.checks import OTHERS
from litforge.settings import parameters, unpacked

ROOT = Path.cwd()
SCHEMAS = Path("conf/.schemas")
MODELINE = re.compile(r"^#\s*yaml-language-server:")
# A value may be an interpolation of another (`${trainer.max_epochs}`) wherever a value goes.
INTERPOLATION = {"type": "string", "pattern": r"^\$\{.*\}$"}
BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def schema_of(annotation: Any) -> dict:
    """The JSON Schema of values a parameter annotated `annotation` takes ({}: any)."""
    annotation, origin, args, constraints = unpacked(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [schema_of(arg) for arg in args]
        schema = {} if {} in parts else {"anyOf": parts}
    elif origin is Literal:
        schema = {"enum": list(args)}
    elif annotation is type(None):
        schema = {"type": "null"}
    elif annotation in (bool, int, float, str):
        schema = {
            "type": {bool: "boolean", int: "integer", float: "number", str: "string"}[annotation]
        }
    elif origin in (list, tuple, Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [schema_of(arg) for arg in args]
            schema = {"type": "array", "prefixItems": items, "minItems": len(items)}
            schema["maxItems"] = len(items)
        else:
            schema = {"type": "array", **({"items": schema_of(args[0])} if args else {})}
    else:
        schema = {}
    for constraint in constraints:
        for name, keyword in BOUNDS.items():
            if getattr(constraint, name, None) is not None:
                schema[keyword] = getattr(constraint, name)
        if getattr(constraint, "min_length", None) is not None:
            schema["minItems"] = constraint.min_length
        if getattr(constraint, "max_length", None) is not None:
            schema["maxItems"] = constraint.max_length
    return schema


def comments(path: Path) -> dict[str, str]:
    """The comment beside each key of a YAML file (`key: value  # comment`), by its dotted
    path (`net.hidden_sizes`)."""
    found, parents = {}, []  # parents: (indent, key) of the keys above this line
    for line in path.read_text().splitlines():
        if not (match := re.match(r"^(\s*)(\w+):([^#]*)(?:#\s*(.+))?$", line)):
            continue
        indent = len(match[1])
        parents = [(i, k) for i, k in parents if i < indent]
        if match[4]:
            found[".".join([*(k for _, k in parents), match[2]])] = match[4]
        parents.append((indent, match[2]))
    return found


def node_schema(node: dict, key: str, notes: dict[str, str], prefix: str = "") -> dict:
    """The schema of config node `key` that names a class, and of the nodes inside it that do.
    Its keys: the constructor's arguments, typed as annotated (or as `checks.OTHERS` types the
    settings of classes not ours), Hydra's `_..._` keys, and any other key the file itself has
    (one the pipeline reads, as `trainer.float32_matmul_precision`)."""
    named, open_ended = parameters(node["_target_"])
    properties: dict[str, dict] = {"_target_": {"type": "string", "default": node["_target_"]}}
    typed = [k.removeprefix(f"{key}.") for k in OTHERS if k.rpartition(".")[0] == key]
    for name in dict.fromkeys([*named, *typed, *node]):
        value, here = node.get(name), f"{key}.{name}"
        if isinstance(value, dict) and "_target_" in value:
            properties[name] = node_schema(value, here, notes, f"{prefix}{name}.")
            continue
        if name in named:
            schema = schema_of(OTHERS.get(here, named[name].annotation))
            default = named[name].default
            if isinstance(default, (bool, int, float, str, type(None))):
                schema["default"] = default
        else:
            schema = schema_of(OTHERS[here]) if here in OTHERS else {}
        annotation = named[name].annotation if name in named else None
        docs = [c for c in unpacked(annotation)[3] if isinstance(c, DocInfo)]
        if f"{prefix}{name}" in notes or docs:
            schema["description"] = notes.get(f"{prefix}{name}") or docs[0].documentation
        properties[name] = {"anyOf": [schema, INTERPOLATION]} if schema else schema
    schema = {"type": "object", "properties": properties, "patternProperties": {"^_.*_$": {}}}
    if not open_ended:
        schema["additionalProperties"] = False
    return schema


def named_nodes(node: object) -> bool:
    """Whether a file's top level names a class (`_target_`), or each of its entries does
    (callbacks, loggers: `early_stopping: {_target_: ...}`)."""
    if not isinstance(node, dict) or not node:
        return False
    if isinstance(node.get("_target_"), str):
        return True
    entries = [value for key, value in node.items() if key != "defaults"]
    return bool(entries) and all(isinstance(v, dict) and "_target_" in v for v in entries)


def file_schema(node: dict, group: str, notes: dict[str, str]) -> dict:
    if "_target_" in node:
        schema = node_schema(node, group, notes)
    else:
        entries = {
            name: node_schema(value, f"{group}.{name}", notes, f"{name}.")
            for name, value in node.items()
            if name != "defaults"
        }
        schema = {"type": "object", "properties": entries}
    schema["properties"]["defaults"] = {"type": "array"}  # Hydra's defaults list
    return schema


def with_modeline(text: str, schema: str) -> str:
    """The option file's text with, on its first line, the comment that points
    yaml-language-server at its schema (in place of an earlier one)."""
    lines = text.splitlines(keepends=True)
    if lines and MODELINE.match(lines[0]) and f"$schema={schema} " in lines[0] + " ":
        return text  # (whatever follows, as a feature marker, may differ)
    lines = [line for line in lines if not MODELINE.match(line)]
    return f"# yaml-language-server: $schema={schema}  # feature: schemas\n" + "".join(lines)


def generated(root: Path) -> dict[Path, str]:
    """Each file this command writes (relative to `root`) and what it holds: a schema per option
    file that names a class, and that file with its modeline."""
    files: dict[Path, str] = {}
    for path in sorted((root / "conf").glob("*/*.yaml")):
        text = path.read_text()
        node = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
        if not named_nodes(node):
            continue
        relative = path.relative_to(root / "conf")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"conf/{relative.as_posix()}",
            **file_schema(node, relative.parts[0], comments(path)),
        }
        out = SCHEMAS / relative.with_suffix(".json")
        files[out] = json.dumps(schema, indent=1, default=str) + "\n"
        files[path.relative_to(root)] = with_modeline(
            text, f"../.schemas/{out.relative_to(SCHEMAS).as_posix()}"
        )
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the files are stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project (default: here)")
    args = parser.parse_args(argv)
    files = generated(args.root)
    stale = [
        p
        for p, text in files.items()
        if not (args.root / p).is_file() or (args.root / p).read_text() != text
    ]
    kept = {args.root / p for p in files}
    extra = [p for p in (args.root / SCHEMAS).rglob("*.json") if p not in kept]
    if args.check:
        for path in [*stale, *extra]:
            print(f"stale: {path} (run python -m litforge.schemas)")
        return 1 if stale or extra else 0
    for path in extra:
        path.unlink()
    for path in stale:
        (args.root / path).parent.mkdir(parents=True, exist_ok=True)
        (args.root / path).write_text(files[path])
    print(f"{len(files) // 2} schemas in {SCHEMAS}/; {len(stale)} files written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
