"""A lean fork in one command: a copy of this repository without the features you do not keep.

    python scripts/lean.py DEST                                  # the core alone
    python scripts/lean.py DEST --keep sweeps --keep deploy      # the core and two features
    python scripts/lean.py DEST --keep lean --keep sweeps        # ... able to make leaner copies
    python scripts/lean.py --list                                # the features
    make lean DEST=../myproject KEEP="lean sweeps deploy"        # the same through make

The features are listed in pyproject.toml, one `[tool.litforge.features.<name>]` table each:
`paths` (files, and folders ending in /), `extras` (in [project.optional-dependencies]), `names`
(the words that name the feature: a lean copy's src/, conf/, docs/, README and Makefile must not
contain those of a feature it left out, tests/test_lean.py checks) and a one-line
`description`. DEST gets the files git tracks, less those of each feature left out, and:

- pyproject.toml without the feature's table, its extras (and their names in `litforge[...]`
  requirements such as the dev extra's) and its modules in [tool.importlinter] (a contract left
  with nothing to check goes too);
- Markdown without the passages marked `<!-- feature: NAME -->` ... `<!-- /feature -->`, table
  rows that link to or name the feature's files, lines of shell code blocks that use them and
  entries of file trees (plain code blocks) that list them;
- requirements/*.txt (the lock) without the pins that only the dropped extras needed;
- other text files (YAML, TOML, Makefile, CI scripts) without the lines that end in
  `# feature: NAME`; the Makefile also without the targets whose recipes use the feature's files;
- Python files without what their comments mark `# feature: NAME`: on the line a statement starts
  on, the whole statement (a `class` or `def`, an `if` block, an import); alone on its line, the
  statement on the next line; elsewhere, the line (an entry of a list, one name of an import in
  parentheses: an import left with none goes too). A module left with its docstring alone goes
  as if a dropped feature listed it (its modules in [tool.importlinter], its docs' entries).

A marker may name several features, `# feature: NAME OTHER` (`<!-- feature: NAME OTHER -->`):
what it marks is kept when any of them is, and in the copy it names the kept ones only.

This script is a feature too: `lean` (scripts/lean.py, tests/test_lean.py, .ci/lean, the
`make lean` target and the docs' passages about lean copies). A copy gets it only with
`--keep lean`; without it the copy has no feature manifest either (no
`[tool.litforge.features.*]` table: nothing would read one), so a fork starts with a plain
project. Kept with `lean`, kept features keep their tables and markers, so the copy can be made
leaner again. DEST must be new or empty; the copy is written beside it and renamed, so a failure
leaves nothing behind. Standard library only (Python >= 3.11; on 3.10 it needs `pip install tomli`).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit(
            "error: scripts/lean.py reads pyproject.toml with tomllib (Python 3.11 and later); "
            "on Python 3.10: pip install tomli"
        )

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "litforge"  # rename_package.py renames this with everything else
SELF = "scripts/lean.py"  # the feature that lists it carries the manifest (see the docstring)
NAME = r"[a-z_][a-z0-9_]*"
NAMES = rf"{NAME}(?:[ \t]+{NAME})*"  # a marker's features: kept when any of them is
LINE_MARKER = re.compile(rf"#\s*feature:\s*({NAMES})(?!\w)")
MD_START = re.compile(rf"<!--\s*feature:\s*({NAMES})\s*-->")
MD_END = re.compile(r"<!--\s*/feature\s*-->")
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# What an import-linter contract is about: one of these emptied, it has nothing left to check
SUBJECTS = {"layers", "modules", "source_modules", "forbidden_modules", "importer", "imported"}
SHELL = {"bash", "sh", "shell", "console", "zsh"}  # code blocks whose commands may go
# A file tree's entry: `name   what it is`, the name a path
TREE_ENTRY = re.compile(r"^ *([\w.-]+(?:/[\w.-]+)*/?)(?: {2,}\S.*)?$")
BULLET_ONLY = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s*$")
HEADER = re.compile(r"^\[\[?\s*([^\]\s]+)\s*\]\]?\s*(?:#.*)?$")
KEY = re.compile(r"^([A-Za-z0-9_\-]+|\"[^\"]+\")\s*=")


class LeanError(Exception):
    """A problem that stops the copy: one line for the user."""


@dataclass
class Feature:
    name: str
    description: str
    paths: list[str]
    extras: list[str]
    names: list[str]

    def owns(self, path: str) -> bool:
        return any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.paths)

    def modules(self) -> list[str]:
        """The Python modules of its paths under src/: src/litforge/deploy/ -> litforge.deploy."""
        found = []
        for p in self.paths:
            parts = PurePosixPath(p).parts
            if len(parts) > 1 and parts[0] == "src":
                found.append(".".join(parts[1:]).removesuffix(".py"))
        return found

    def mentions(self) -> re.Pattern:
        """What names the feature in a command line or a recipe: its paths, its config options
        (conf/strategy/x.yaml -> strategy=x, conf/sweeps/ -> sweeps=), its modules, its extras
        in `.[...]`."""
        words = []
        for p in self.paths:
            bare = p.rstrip("/")
            if "/" in bare:
                words.append(rf"(?<![\w.-]){re.escape(bare)}(?![\w-])")
            else:  # a file at the root: predict.py, not src/.../predict.py
                words.append(rf"(?<![\w./-]){re.escape(bare)}(?![\w-])")
            parts = PurePosixPath(bare).parts
            if parts[0] == "conf" and len(parts) >= 2:
                group = "/".join(parts[1:-1]) if not p.endswith("/") else "/".join(parts[1:])
                option = PurePosixPath(bare).stem if not p.endswith("/") else ""
                if group:
                    words.append(rf"(?<![\w./]){re.escape(group)}={re.escape(option)}(?![\w])")
        words += [rf"(?<![\w.]){re.escape(m)}(?![\w])" for m in self.modules()]
        words += [rf"\.\[(?:[\w-]+,)*{re.escape(e)}(?:,[\w-]+)*\]" for e in self.extras]
        return re.compile("|".join(words))


# --- the manifest -----------------------------------------------------------------------------


def read_features(pyproject: dict, tracked: list[str]) -> dict[str, Feature]:
    table = pyproject.get("tool", {}).get(PACKAGE, {}).get("features", {})
    features = {}
    for name, entry in table.items():
        if not re.fullmatch(NAME, name):
            raise LeanError(f"pyproject.toml: feature name {name!r}: use lowercase and _")
        feature = Feature(
            name,
            str(entry.get("description", "")),
            list(entry.get("paths", [])),
            list(entry.get("extras", [])),
            list(entry.get("names", [])),
        )
        if not all(isinstance(n, str) and n.strip() for n in feature.names):
            raise LeanError(f"pyproject.toml: feature {name}: `names` are non-empty strings")
        for p in feature.paths:
            if not any(t == p or (p.endswith("/") and t.startswith(p)) for t in tracked):
                raise LeanError(
                    f"pyproject.toml: feature {name} lists {p!r}, which git does not track "
                    "(folders end in /)"
                )
        extras = pyproject["project"].get("optional-dependencies", {})
        for extra in feature.extras:
            if extra not in extras:
                raise LeanError(f"pyproject.toml: feature {name} lists extra {extra!r}, not found")
        features[name] = feature
    for path in tracked:
        owners = [f.name for f in features.values() if f.owns(path)]
        if len(owners) > 1:
            raise LeanError(f"pyproject.toml: {path} belongs to several features: {owners}")
    return features


# --- line markers: Python, YAML, Makefile, CI scripts, TOML -----------------------------------


def marker_names(names: str, known: set[str], where: str, form: str) -> list[str]:
    """A marker's features, each checked; `form` is the marker as the error names it."""
    listed = names.split()
    for name in listed:
        if name not in known:
            raise LeanError(f"{where}: `{form}`: no such feature {name}")
    return listed


def _kept_names(text: str, span: tuple[int, int], names: list[str], dropped: set[str]) -> str:
    """The text with the marker's names at `span` cut to the kept ones (a copy that left out
    some of them names none of those)."""
    kept = [name for name in names if name not in dropped]
    return text if kept == names else text[: span[0]] + " ".join(kept) + text[span[1] :]


def drop_marked_lines(text: str, dropped: set[str], known: set[str], where: str) -> str:
    if where.endswith(".py"):
        return drop_marked_python(text, dropped, known, where)
    out = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        match = LINE_MARKER.search(line)
        if not match:
            out.append(line)
            continue
        names = marker_names(match.group(1), known, f"{where}:{number}", match.group(0))
        if not set(names) <= dropped:
            out.append(_kept_names(line, match.span(1), names, dropped))
    return "".join(out)


def _statements(tree: ast.AST) -> dict[int, tuple[int, int]]:
    """Each line a statement starts on (its decorators' or its own) -> the first and last line of
    the outermost statement that starts there."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            decorators = getattr(node, "decorator_list", [])
            first = min([node.lineno, *(d.lineno for d in decorators)])
            for line in {first, node.lineno}:
                if line not in spans or node.end_lineno > spans[line][1]:
                    spans[line] = (first, node.end_lineno)
    return spans


def drop_marked_python(text: str, dropped: set[str], known: set[str], where: str) -> str:
    """Markers in comments only. One on a line that starts a statement takes the whole statement
    (a `class` or an `if` block, an import); one alone on its line, the statement below it; one
    elsewhere (an entry of a list, a name of an import in parentheses), that line. An import left
    with no names goes too; so do the blank lines a dropped block leaves doubled. The result must
    still be Python."""
    if "feature:" not in text:
        return text
    lines = text.splitlines(keepends=True)
    markers = []  # (line, column of the comment, match)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and (match := LINE_MARKER.search(token.string)):
                markers.append((token.start[0], token.start[1], match))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError) as error:
        raise LeanError(f"{where}: cannot read it as Python: {error}") from None
    if not markers:
        return text
    statements, gone = _statements(tree), set()
    for number, column, match in markers:
        names = marker_names(match.group(1), known, f"{where}:{number}", match.group(0))
        if not set(names) <= dropped:
            span = (column + match.start(1), column + match.end(1))
            lines[number - 1] = _kept_names(lines[number - 1], span, names, dropped)
            continue
        alone = not lines[number - 1][:column].strip() and match.start() == 0
        if alone and not match.string[match.end() :].strip():  # `# feature: ...` on its own line
            if number + 1 not in statements:
                raise LeanError(
                    f"{where}:{number}: a marker alone on its line marks the statement on the "
                    "next line, and none starts there"
                )
            gone.update(range(number, statements[number + 1][1] + 1))
        else:
            first, last = statements.get(number, (number, number))
            gone.update(range(first, last + 1))
    for node in ast.walk(tree):  # an import whose names all went
        if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in gone:
            names_gone = all(alias.lineno in gone for alias in node.names)
            gone.update(range(node.lineno, node.end_lineno + 1) if names_gone else ())
    if not gone:
        return "".join(lines)
    out: list[str] = []
    number = 0
    while number < len(lines):
        if number + 1 not in gone:
            out.append(lines[number])
            number += 1
            continue
        while number < len(lines) and number + 1 in gone:
            number += 1
        if not out or not out[-1].strip():  # a blank line above: none below too
            while number < len(lines) and not lines[number].strip():
                number += 1
    while out and not out[-1].strip():  # no blank lines at the end
        out.pop()
    new = "".join(out)
    try:
        ast.parse(new)
    except SyntaxError as error:
        raise LeanError(
            f"{where}: the copy's line {error.lineno} ({error.msg}) once the lines marked "
            f"for {', '.join(sorted(dropped))} are gone: mark whole statements"
        ) from None
    return new


def emptied(text: str, new: str) -> bool:
    """A module the markers emptied: it had code, and is left with its docstring at most."""

    def code(source: str) -> list[ast.stmt]:
        body = ast.parse(source).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        return body

    return new != text and bool(code(text)) and not code(new)


# --- Makefile ---------------------------------------------------------------------------------


def lean_makefile(text: str, mentions: re.Pattern | None) -> str:
    """Drop the rules whose recipes (or prerequisites) use a dropped feature, and their names
    from .PHONY."""
    if mentions is None:
        return text
    lines = text.splitlines(keepends=True)
    rule = re.compile(r"^([A-Za-z0-9_.%/-]+(?:\s+[A-Za-z0-9_.%/-]+)*)\s*::?(?!=)")
    out, gone, i = [], set(), 0
    while i < len(lines):
        match = rule.match(lines[i])
        if match and not lines[i].startswith(".PHONY"):
            end = i + 1
            while end < len(lines) and (
                lines[end].startswith("\t") or lines[end - 1].rstrip("\n").endswith("\\")
            ):
                end += 1
            block = lines[i:end]
            used = [lines[i].split("#", 1)[0], *block[1:]]  # not the `## help` comment
            if any(mentions.search(line) for line in used):
                gone.update(match.group(1).split())
                i = end
                continue
            out += block
            i = end
            continue
        out.append(lines[i])
        i += 1
    if gone:
        for n, line in enumerate(out):
            if line.startswith(".PHONY"):
                head, _, names = line.rstrip("\n").partition(":")
                kept = [t for t in names.split() if t not in gone]
                out[n] = f"{head}: {' '.join(kept)}\n"
    return "".join(out)


# --- pyproject.toml ---------------------------------------------------------------------------


def _blocks(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The TOML file as (table name, lines) blocks; the comment lines right above a header
    belong to its block."""
    starts = [i for i, line in enumerate(lines) if HEADER.match(line)]
    firsts = []
    for k, start in enumerate(starts):
        first, floor = start, (starts[k - 1] + 1 if k else 0)
        while first > floor and lines[first - 1].lstrip().startswith("#"):
            first -= 1
        firsts.append(first)
    blocks = [(None, lines[: firsts[0]] if starts else lines)]
    for k, start in enumerate(starts):
        end = firsts[k + 1] if k + 1 < len(starts) else len(lines)
        blocks.append((HEADER.match(lines[start]).group(1), lines[firsts[k] : end]))
    return blocks


def _entries(lines: list[str]) -> list[tuple[str | None, list[str], list[str]]]:
    """A table's lines as (key, comment lines above it, its lines); key None for the rest."""
    entries, i, comments = [], 0, []
    while i < len(lines):
        match = KEY.match(lines[i])
        if not match:
            if lines[i].lstrip().startswith("#"):
                comments.append(lines[i])
            else:
                entries.append((None, [], comments + [lines[i]]))
                comments = []
            i += 1
            continue
        end = i + 1
        while True:
            try:
                tomllib.loads("".join(lines[i:end]))
                break
            except tomllib.TOMLDecodeError:
                if end >= len(lines):
                    where = lines[i].strip()
                    raise LeanError(f"pyproject.toml: cannot read the entry {where!r}") from None
                end += 1
        entries.append((match.group(1).strip('"'), comments, lines[i:end]))
        comments, i = [], end
    if comments:
        entries.append((None, [], comments))
    return entries


def _value(entry_lines: list[str]):
    return next(iter(tomllib.loads("".join(entry_lines)).values()))


def _module_pattern(modules: list[str]) -> re.Pattern | None:
    if not modules:
        return None
    return re.compile("|".join(rf"(?<![\w.]){re.escape(m)}(?![\w])" for m in modules))


def _filter_strings(
    entry: list[str], keep
) -> tuple[list[str], int, int]:  # (new lines, items before, items after)
    items = _value(entry)
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        return entry, 0, 0
    kept = [x for x in (keep(item) for item in items) if x is not None]
    if kept == items:
        return entry, len(items), len(items)
    key = entry[0].split("=", 1)[0].rstrip()
    if len(entry) == 1:  # key = ["a", "b"]  # comment
        comment = re.search(r"\]\s*(#.*)$", entry[0].rstrip("\n"))
        line = f"{key} = [{', '.join(json.dumps(x) for x in kept)}]"
        return [line + (f"  {comment.group(1)}" if comment else "") + "\n"], len(items), len(kept)
    indent = "    "
    for line in entry[1:]:
        if line.strip().startswith('"'):
            indent = line[: len(line) - len(line.lstrip())]
            break
    if '"' in entry[0].split("=", 1)[1] or '"' in entry[-1]:  # items beside the brackets
        return (
            [f"{key} = [\n", *(f"{indent}{json.dumps(x)},\n" for x in kept), "]\n"],
            len(items),
            len(kept),
        )
    new = [entry[0]]  # key = [
    for line in entry[1:-1]:  # one item a line (comments kept with theirs)
        strings = re.findall(r'"((?:[^"\\]|\\.)*)"', line.split("#")[0])
        if len(strings) == 1:
            replaced = keep(json.loads(f'"{strings[0]}"'))
            if replaced is None:
                continue
            line = line.replace(f'"{strings[0]}"', json.dumps(replaced), 1)
        elif len(strings) > 1:
            kept_here = [x for x in (keep(json.loads(f'"{s}"')) for s in strings) if x is not None]
            if not kept_here:
                continue
            line = indent + ", ".join(json.dumps(x) for x in kept_here) + ",\n"
        new.append(line)
    new.append(entry[-1])
    return new, len(items), len(kept)


def lean_pyproject(
    text: str, features: dict[str, Feature], dropped: set[str], also_gone: list[str] | None = None
) -> str:
    """`also_gone`: modules that go besides the features' (those the markers emptied)."""
    if not dropped:
        return text
    gone_extras = {e for name in dropped for e in features[name].extras}
    modules = [m for name in dropped for m in features[name].modules()]
    gone_modules = _module_pattern(modules + (also_gone or []))
    self_reference = re.compile(rf"^{re.escape(PACKAGE)}\[([^\]]*)\](.*)$")

    def without_gone_extras(requirement: str) -> str | None:
        match = self_reference.match(requirement)
        if not match:
            return requirement
        extras = [e.strip() for e in match.group(1).split(",") if e.strip() not in gone_extras]
        return f"{PACKAGE}[{','.join(extras)}]{match.group(2)}" if extras else None

    def gone_module(name: str, containers: list[str]) -> bool:
        """A dropped module, named absolutely or, in a contract with containers, relative to
        one of them (layers)."""
        names = [name.strip().strip("()").strip()]
        names += [f"{c}.{names[0]}" for c in containers]
        return any(gone_modules.fullmatch(n) or gone_modules.match(n + ".") for n in names)

    def without_gone_modules(containers: list[str]):
        def keep(item: str) -> str | None:
            if gone_modules is None:
                return item
            if "->" in item:  # ignore_imports: "a -> b"
                return None if any(gone_module(m, []) for m in item.split("->")) else item
            separator = "|" if "|" in item else ":" if ":" in item else None
            if separator is None:  # a module
                return None if gone_module(item, containers) else item
            # a layer of siblings: "a | b" (independent) or "a : b"
            parts = [p.strip() for p in item.split(separator)]
            kept = [p for p in parts if not gone_module(p, containers)]
            return f" {separator} ".join(kept) if kept else None

        return keep

    manifest_gone = any(features[name].owns(SELF) for name in dropped)  # `lean` left out
    out = []
    for name, block in _blocks(text.splitlines(keepends=True)):
        if name and name.startswith(f"tool.{PACKAGE}.features."):
            if manifest_gone or name.split(".")[3] in dropped:
                continue
        elif name == "project.optional-dependencies":
            new = []
            for key, comments, entry in _entries(block):
                if key in gone_extras:
                    continue
                if key is not None:
                    entry = _filter_strings(entry, without_gone_extras)[0]
                new += comments + entry
            block = new
        elif name and name.startswith("tool.importlinter"):
            new, entries = [], _entries(block)
            containers = next((_value(e) for k, _, e in entries if k == "containers"), [])
            keep = without_gone_modules(containers)
            pointless = gone_modules is not None and any(gone_module(c, []) for c in containers)
            for key, comments, entry in entries:
                if key is not None and key != "containers":
                    entry, before, after = _filter_strings(entry, keep)
                    if (
                        key in SUBJECTS
                        and before
                        and (after == 0 or key == "modules" and after < 2)
                    ):
                        pointless = True  # a contract left with nothing to check
                new += comments + entry
            if pointless and name == "tool.importlinter.contracts":
                continue
            block = new
        out += block
    return "".join(out)


# --- Markdown ---------------------------------------------------------------------------------


def _code_mask(text: str) -> tuple[str, list[bool]]:
    """The text with code (fenced blocks, inline spans) blanked out, and for each line whether
    it is inside a fenced block (fences included)."""
    lines = text.splitlines(keepends=True)
    masked, in_fence, fence = [], [], None
    for line in lines:
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            in_fence.append(True)
            masked.append(re.sub(r"[^\n]", " ", line))
        elif fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            in_fence.append(True)
            masked.append(re.sub(r"[^\n]", " ", line))
        else:
            in_fence.append(False)
            masked.append(re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line))
    return "".join(masked), in_fence


def _apply_markers(text: str, dropped: set[str], known: set[str], where: str) -> str:
    masked, _ = _code_mask(text)
    tokens = sorted(
        [(m.start(), m.end(), m) for m in MD_START.finditer(masked)]
        + [(m.start(), m.end(), None) for m in MD_END.finditer(masked)]
    )
    pairs, open_at = [], None
    for start, end, match in tokens:
        line = text.count("\n", 0, start) + 1
        if match is not None:
            names = marker_names(match.group(1), known, f"{where}:{line}", match.group(0))
            if open_at is not None:
                raise LeanError(f"{where}:{line}: a feature marker inside another one")
            open_at = (start, end, match, names)
        else:
            if open_at is None:
                raise LeanError(f"{where}:{line}: <!-- /feature --> without its start")
            pairs.append((open_at[0], end, open_at[2], open_at[3]))
            open_at = None
    if open_at is not None:
        line = text.count("\n", 0, open_at[0]) + 1
        raise LeanError(f"{where}:{line}: {open_at[2].group(0)} is never closed")

    for start, end, match, names in reversed(pairs):
        if not set(names) <= dropped:  # kept: its marker names the kept features only
            text = _kept_names(text, match.span(1), names, dropped)
            continue
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        before, after = text[line_start:start], text[end:line_end]
        if not before.strip() and not after.strip():  # whole lines
            text = text[:line_start] + text[min(line_end + 1, len(text)) :]
            # no double blank line where a paragraph was
            above = text[text.rfind("\n", 0, line_start - 1) + 1 : line_start - 1]
            below_end = text.find("\n", line_start)
            blank_below = below_end >= 0 and not text[line_start:below_end].strip()
            if line_start and not above.strip() and blank_below:
                text = text[:line_start] + text[below_end + 1 :]
            continue
        if not before.strip():  # begins a line: what follows moves up to its start
            end += len(after) - len(after.lstrip(" "))
        elif not after.strip():
            start -= len(before) - len(before.rstrip(" "))
        text = text[:start] + text[end:]
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        if BULLET_ONLY.match(text[line_start:line_end]) or not text[line_start:line_end].strip():
            text = text[:line_start] + text[min(line_end + 1, len(text)) :]
    return text


def _tree_without(lines: list[str], is_gone) -> list[str]:
    """A plain code block as a file tree (`name   what it is`, a folder's entries indented below
    it, a description's further lines indented past the name) without the entries the copy
    leaves out, their further lines with them. (A block of anything else loses a line only if
    its first word is a path the copy leaves out.)"""
    out, folders, below = [], [], None  # below: the indent past which a gone entry's lines go on
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if below is not None and line.strip() and indent > below:
            continue
        below = None
        if match := TREE_ENTRY.match(line.rstrip("\n")):
            while folders and folders[-1][0] >= indent:
                folders.pop()
            path = (folders[-1][1] if folders else "") + match.group(1)
            if path.endswith("/"):
                folders.append((indent, path))
            if is_gone(path.rstrip("/")):
                below = indent + len(match.group(1))
                continue
        out.append(line)
    return out


def _links(line: str) -> list[str]:
    return [t for t in MD_LINK.findall(line) if "://" not in t and not t.startswith("mailto:")]


def _link_target(md_path: str, target: str) -> str | None:
    """The repository path a relative link points at (without its #anchor)."""
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = os.path.normpath(os.path.join(os.path.dirname(md_path), path))
    return joined.replace(os.sep, "/")


def lean_markdown(
    text: str,
    path: str,
    dropped: set[str],
    known: set[str],
    is_gone,
    mentions: re.Pattern | None,
    gone_paths: list[str],
) -> str:
    text = _apply_markers(text, dropped, known, path)
    if not dropped:
        return text
    _, in_fence = _code_mask(text)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if in_fence[i] and FENCE.match(line):  # a fenced block: in shell ones, drop the commands
            end = i + 1  # that use a dropped feature, a command with its continuation lines
            while end < len(lines) and not (in_fence[end] and FENCE.match(lines[end])):
                end += 1
            body, kept, group = lines[i + 1 : end], [], []
            language = line.strip().lstrip("`~").strip().split(" ")[0]
            shell = language in SHELL
            for body_line in body if shell else []:
                group.append(body_line)
                if body_line.rstrip("\n").endswith("\\"):
                    continue
                if not (mentions and any(mentions.search(g) for g in group)):
                    kept += group
                group = []
            if shell:
                kept += group
            else:
                kept = _tree_without(body, is_gone) if language in ("", "text") else body
            while kept and not kept[0].strip():
                kept.pop(0)
            while kept and not kept[-1].strip():
                kept.pop()
            if kept or not body:
                out += [line, *kept, *lines[end : end + 1]]
            elif out and not out[-1].strip() and not "".join(lines[end + 1 : end + 2]).strip():
                end += 1  # the block's blank line
            i = end + 1
            continue
        if not in_fence[i] and line.lstrip().startswith("|"):
            targets = [_link_target(path, t) for t in _links(line)]
            names_gone = any(re.search(rf"(?<![\w/.-]){re.escape(p)}", line) for p in gone_paths)
            if names_gone or any(t and is_gone(t) for t in targets):
                i += 1
                continue
        out.append(line)
        i += 1
    # tables left with a header only
    text, result = "".join(out), []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if (
            lines[i].lstrip().startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1])
            and (i + 2 >= len(lines) or not lines[i + 2].lstrip().startswith("|"))
            and (i == 0 or not lines[i - 1].lstrip().startswith("|"))
        ):
            i += 2
            if result and not result[-1].strip() and i < len(lines) and not lines[i].strip():
                i += 1
            continue
        result.append(lines[i])
        i += 1
    text = "".join(result)
    return text.rstrip("\n") + "\n" if text.strip() else text  # no blank lines at the end


def dangling_links(text: str, path: str, is_gone) -> list[str]:
    """Links into what the copy leaves out: passages that want a marker."""
    masked, _ = _code_mask(text)
    found = []
    for number, line in enumerate(masked.splitlines(), 1):
        for target in _links(line):
            resolved = _link_target(path, target)
            if resolved and is_gone(resolved):
                found.append(f"{path}:{number}: links {target}")
    return found


# --- the copy ---------------------------------------------------------------------------------


def tracked_files(root: Path) -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise LeanError(f"{root} is not a git checkout (git ls-files: {error})") from None
    return sorted(name for name in listed.split("\0") if name)


def python_lines(folder: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in folder.rglob("*.py") if p.is_file())


def build(root: Path, dest: Path, keep: list[str]) -> dict:
    """Write the copy into `dest` (which must not exist); what was done, for the summary."""
    tracked = tracked_files(root)
    pyproject_text = (root / "pyproject.toml").read_text()
    features = read_features(tomllib.loads(pyproject_text), tracked)
    unknown = [k for k in keep if k not in features]
    if unknown:
        listed = ", ".join(features) or "none"
        raise LeanError(f"no feature {', '.join(unknown)}: the features are {listed}")
    dropped = {name for name in features if name not in keep}
    known = set(features)
    gone = [features[name] for name in features if name in dropped]

    def is_gone(path: str) -> bool:
        if re.fullmatch(r"conf/\.schemas/.+\.json", path) and is_gone(  # (with its option file)
            f"conf/{path.removeprefix('conf/.schemas/').removesuffix('.json')}.yaml"
        ):
            return True
        return any(f.owns(path) or f.owns(path + "/") for f in gone)

    python = {}  # the kept Python files' new text; a module the markers emptied goes too
    for name in tracked:
        source = root / name
        plain = source.is_file() and not source.is_symlink()
        if name.endswith(".py") and plain and not is_gone(name):
            text = source.read_text(encoding="utf-8")
            python[name] = (text, drop_marked_lines(text, dropped, known, name))
    empty = Feature(
        "(emptied)",
        "modules left with their docstring alone",
        sorted(
            name
            for name, (text, new) in python.items()
            if PurePosixPath(name).name != "__init__.py" and emptied(text, new)
        ),
        [],
        [],
    )
    if empty.paths:  # as a feature's files: their links, rows, commands and modules go
        gone.append(empty)

    patterns = [f.mentions().pattern for f in gone]
    mentions = re.compile("|".join(patterns)) if patterns else None
    gone_paths = [p.rstrip("/") for f in gone for p in f.paths if "/" in p.rstrip("/")]

    written, left_out, edited, warnings = 0, 0, [], []
    for name in tracked:
        source = root / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        if is_gone(name):
            left_out += 1
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
            written += 1
            continue
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            new = text
            if name in python:
                new = python[name][1]
            elif name.endswith(".md"):
                new = lean_markdown(text, name, dropped, known, is_gone, mentions, gone_paths)
                warnings += dangling_links(new, name, is_gone)
            else:
                new = drop_marked_lines(text, dropped, known, name)
                if name == "pyproject.toml":
                    new = lean_pyproject(new, features, dropped, empty.modules())
                elif PurePosixPath(name).name in ("Makefile", "GNUmakefile", "makefile"):
                    new = lean_makefile(new, mentions)
            if new != text:
                target.write_text(new, encoding="utf-8")
                shutil.copymode(source, target)
                edited.append(name)
                written += 1
                continue
        shutil.copy2(source, target)
        written += 1
    if (dest / "scripts" / "lock.py").is_file() and (dest / "requirements").is_dir():
        # The lock without the pins only the dropped extras needed (offline: uv's `# via` notes)
        prune = [sys.executable, "scripts/lock.py", "--prune"]
        done = subprocess.run(prune, cwd=dest, capture_output=True, text=True)
        if done.returncode:
            raise LeanError(f"scripts/lock.py --prune failed: {done.stderr.strip()}")
        edited += [str(p.relative_to(dest)) for p in sorted((dest / "requirements").glob("*.txt"))]
    return {
        "features": features,
        "kept": [n for n in features if n not in dropped],
        "dropped": [n for n in features if n in dropped],
        "written": written,
        "left_out": left_out,
        "edited": edited,
        "warnings": warnings,
        "python_lines": python_lines(dest / "src") if (dest / "src").is_dir() else 0,
        "python_lines_all": python_lines(root / "src") if (root / "src").is_dir() else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/lean.py",
        description=__doc__.split("\n\n")[0],
        epilog="Details: docs/development.md (A lean fork).",
    )
    parser.add_argument("dest", nargs="?", type=Path, help="a new (or empty) folder")
    parser.add_argument(
        "--keep", action="append", default=[], metavar="FEATURE", help="a feature to keep"
    )
    parser.add_argument("--list", action="store_true", help="list the features and stop")
    args = parser.parse_args(argv)
    keep = [name for entry in args.keep for name in entry.replace(",", " ").split()]
    try:
        if args.list:
            pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
            for name, feature in read_features(pyproject, tracked_files(ROOT)).items():
                print(f"{name:18} {feature.description}")
            return 0
        if args.dest is None:
            parser.error("give DEST, the folder to write the lean copy into")
        dest = args.dest.resolve()
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise LeanError(f"{args.dest} exists and is not an empty folder: give a new one")
        if not dest.parent.is_dir():
            raise LeanError(f"{dest.parent} does not exist: create it first")
        work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.lean-", dir=dest.parent))
        try:
            done = build(ROOT, work, keep)
            umask = os.umask(0)
            os.umask(umask)
            work.chmod(0o777 & ~umask)  # as a folder made by mkdir (mkdtemp's is private)
            if dest.exists():
                dest.rmdir()  # empty, checked above
            os.replace(work, dest)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    except LeanError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    features = done["features"]
    print(f"A lean copy of {ROOT.name} in {args.dest}")
    for name in done["kept"]:
        print(f"  kept:    {name:18} {features[name].description}")
    for name in done["dropped"]:
        print(f"  dropped: {name:18} {features[name].description}")
    if not features:
        print("  (pyproject.toml lists no features: a plain copy)")
    print(
        f"  files:   {done['written']} written ({len(done['edited'])} of them edited), "
        f"{done['left_out']} left out"
    )
    print(
        f"  Python:  {done['python_lines']:,} lines in src/ "
        f"(against {done['python_lines_all']:,} with every feature)"
    )
    for warning in done["warnings"]:
        print(f"warning: {warning}, which the copy leaves out (mark the passage)", file=sys.stderr)
    print(f"Next: cd {args.dest} && git init && bash scripts/install.sh && make test-fast")
    return 0


if __name__ == "__main__":
    sys.exit(main())
