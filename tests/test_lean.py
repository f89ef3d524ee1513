"""`scripts/lean.py`: a copy of the repository without the features not kept (docs/development.md,
"A lean fork")."""

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import ROOT, run_script, tiny_run_args, write_idx_dataset

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FEATURES = PYPROJECT.get("tool", {}).get("litforge", {}).get("features", {})
EXTRAS = PYPROJECT["project"].get("optional-dependencies", {})


def _tracked() -> list[str]:
    if not (ROOT / ".git").exists():
        return []
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return listed.stdout.split()


pytestmark = pytest.mark.skipif(
    not FEATURES or not _tracked(),
    reason="needs a git checkout whose pyproject.toml lists features (a lean copy without any "
    "has none to leave out)",
)


def lean(dest: Path, *args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "lean.py"), str(dest), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def feature_paths(name: str) -> list[str]:
    return FEATURES[name]["paths"]


def extras_named(requirements: list[str]) -> set[str]:
    """The extras that `litforge[...]` requirements (the dev extra's) name."""
    named = set()
    for requirement in requirements:
        if match := re.match(r"litforge\[([^\]]*)\]", requirement):
            named.update(e.strip() for e in match.group(1).split(","))
    return named


def _outside_fences(text: str) -> list[str]:
    """Markdown lines, those of fenced code blocks blanked out."""
    lines, fence = [], None
    for line in text.splitlines():
        match = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and match.group(1).startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line)
            continue
        lines.append("")
    return lines


def anchors(markdown: Path) -> set[str]:
    """GitHub's ids for the headings of a Markdown file."""
    found, seen = set(), {}
    for line in _outside_fences(markdown.read_text()):
        if match := re.match(r"^#{1,6}\s+(.*?)\s*$", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(tree: Path) -> list[str]:
    """Relative links in the tree's Markdown whose file or heading is not there."""
    broken = []
    for markdown in sorted(tree.rglob("*.md")):
        for number, line in enumerate(_outside_fences(markdown.read_text()), 1):
            line = re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)  # not in inline code
            for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?", line):
                if "://" in target or target.startswith("mailto:"):
                    continue
                path, _, anchor = target.partition("#")
                linked = (markdown.parent / path).resolve() if path else markdown
                where = f"{markdown.relative_to(tree)}:{number}: {target}"
                if not linked.exists():
                    broken.append(where)
                elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                    broken.append(where + " (no such heading)")
    return broken


def assert_only_kept(tree: Path, kept: set[str], result: subprocess.CompletedProcess) -> None:
    """What every lean copy must be: the kept features whole, no trace of the others."""
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    for name in FEATURES:
        for path in feature_paths(name):
            assert (tree / path).exists() == (name in kept), (name, path)
    for name in set(FEATURES) - kept:
        assert f"dropped: {name}" in result.stdout

    pyproject = tomllib.loads((tree / "pyproject.toml").read_text())
    manifest = set(pyproject["tool"].get("litforge", {}).get("features", {}))
    assert manifest == (kept if "lean" in kept else set())  # lean.py gone: its manifest too
    gone_extras = {e for name in set(FEATURES) - kept for e in FEATURES[name]["extras"]}
    extras = pyproject["project"]["optional-dependencies"]
    assert set(extras) == set(EXTRAS) - gone_extras
    assert not extras_named(extras["dev"]) & gone_extras
    assert extras_named(extras["dev"]) == extras_named(EXTRAS["dev"]) - gone_extras

    assert broken_links(tree) == []
    gone_pages = [Path(p).name for n in set(FEATURES) - kept for p in feature_paths(n)]
    gone_pages = [page for page in gone_pages if page.endswith(".md")]
    suffixes = (".md", ".yaml", ".py", "")
    text_files = [p for p in tree.rglob("*") if p.is_file() and p.suffix in suffixes]
    for path in text_files:
        text = path.read_text(errors="ignore")
        if path.suffix == ".md":
            mentioned = [page for page in gone_pages if page in text]
            assert not mentioned, f"{path.relative_to(tree)} mentions {mentioned}"
        names = r"([a-z_][a-z0-9_]*(?:[ \t]+[a-z_][a-z0-9_]*)*)(?!\w)"
        marker = (r"<!--\s*feature:\s*" if path.suffix == ".md" else r"#\s*feature:\s*") + names
        markers = {name for found in re.findall(marker, text) for name in found.split()}
        assert markers <= kept, f"{path.relative_to(tree)}: markers of {markers - kept}"
    assert unimported_dependencies(tree) == []
    assert_hooks_only_of(tree, kept)


def unimported_dependencies(tree: Path) -> list[str]:
    """The dependencies in the tree's pyproject.toml that no module of its src/ imports (through
    the installed distributions: `pillow` is imported as PIL)."""
    modules = set()
    for path in (tree / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    distributions = packages_distributions()

    def normalized(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    imported = {normalized(d) for m in modules for d in distributions.get(m, [])}
    dependencies = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [normalized(re.match(r"[A-Za-z0-9._-]+", d).group()) for d in dependencies]
    return [name for name in names if name not in imported]


def _hooks(tree: Path) -> list[str]:
    """The extension points in the tree's src/litforge/hooks.py (a lean copy may have none)."""
    path = tree / "src" / "litforge" / "hooks.py"
    body = ast.parse(path.read_text()).body if path.is_file() else []
    return [node.name for node in body if isinstance(node, ast.ClassDef)]


def _implementers(hook: str) -> set[str]:
    """The features with a class that subclasses the hook."""
    found = set()
    for name in FEATURES:
        for top in feature_paths(name):
            files = [ROOT / top] if top.endswith(".py") else (ROOT / top).rglob("*.py")
            for path in files:
                if top.startswith("src/") and path.is_file():
                    text = path.read_text()
                    if re.search(rf"^class \w+\([^)]*\b{hook}\b", text, flags=re.M):
                        found.add(name)
    return found


IMPLEMENTERS = {hook: _implementers(hook) for hook in _hooks(ROOT)}


def assert_hooks_only_of(tree: Path, kept: set[str]) -> None:
    """A hook of the core (its class, the pipeline's call, the docs) is in a copy only with a
    feature that implements it: no extension point that nothing in the copy uses."""
    classes = _hooks(tree)
    for hook, features in IMPLEMENTERS.items():
        wanted = bool(features & kept)
        assert (hook in classes) == wanted, (hook, kept)
        if not wanted:
            found = feature_words_in(tree, [hook])
            assert not found, f"{hook}, which no kept feature implements:\n" + "\n".join(found)
    hooks = tree / "src" / "litforge" / "hooks.py"
    assert hooks.is_file() == bool(classes), "a hooks.py with no hook in it"


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """The copy without any feature."""
    tree = tmp_path_factory.mktemp("lean") / "core"
    return SimpleNamespace(tree=tree, result=lean(tree))


# Where a lean copy must not name a feature it left out (its tests and benchmarks may: a test
# that checks a feature is absent names it)
SEARCHED = ["src", "conf", "docs", "README.md", "Makefile", ".ci", "pyproject.toml"]


def feature_words(tree: Path, dropped: set[str]) -> list[str]:
    """`file:line: word` for each word of a dropped feature's `names` in the searched files."""
    words = sorted({(w, name) for name in dropped for w in FEATURES[name].get("names", [])})
    return feature_words_in(tree, [word for word, _ in words], dict(words))


def feature_words_in(
    tree: Path, words: list[str], whose: dict[str, str] | None = None
) -> list[str]:
    """`file:line: word` for each of the words in the searched files (`(feature)` after it)."""
    found = []
    for top in SEARCHED:
        files = sorted((tree / top).rglob("*")) if (tree / top).is_dir() else [tree / top]
        for path in files:
            if not path.is_file() or path.suffix in (".png", ".jpg", ".pyc"):
                continue
            lines = path.read_text(errors="ignore").splitlines()
            for number, line in enumerate(lines, 1):
                for word in words:
                    if word in line:
                        owner = f" ({whose[word]})" if whose else ""
                        found.append(f"{path.relative_to(tree)}:{number}: {word}{owner}")
    return found


def test_every_feature_has_names():
    """Each feature lists the words that name it, and each word is in use (its own files, the
    README, pyproject.toml or the docs): a misspelt one would find nothing."""
    shared = [(ROOT / t).read_text() for t in ("README.md", "pyproject.toml")]
    shared += [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    for name, feature in FEATURES.items():
        assert feature.get("names"), f"[tool.litforge.features.{name}] lists no names"
        own = [ROOT / p for p in feature_paths(name)]
        files = [p for p in own if p.is_file()] + [
            f for d in own if d.is_dir() for f in d.rglob("*")
        ]
        texts = shared + [f.read_text(errors="ignore") for f in files if f.is_file()]
        for word in feature["names"]:
            assert any(word in text for text in texts), f"{name}: {word!r} is used nowhere"


def test_the_core_copy_names_no_feature(core):
    """No word of a left-out feature (its `names` in the manifest) in the copy's code, configs,
    docs, README, Makefile or CI: a mention left behind is marked or reworded."""
    assert core.result.returncode == 0, core.result.stderr
    found = feature_words(core.tree, set(FEATURES))
    assert not found, "words of features the copy left out:\n" + "\n".join(found)


def test_the_core_copys_make_targets_use_files_it_has(core):
    """`make help` lists the copy's targets, and every file a recipe names is in the copy."""
    makefile = (core.tree / "Makefile").read_text()
    listed = subprocess.run(["make", "-s", "help"], cwd=core.tree, capture_output=True, text=True)
    if listed.returncode == 0:  # (no make on this machine: the rules alone)
        targets = re.findall(r"^([a-z][a-z-]*):.*## ", makefile, flags=re.M)
        assert [line.split()[1] for line in listed.stdout.splitlines()] == targets
    for rule in re.split(r"\n(?=[^\t\n#])", makefile):
        recipe = [line for line in rule.splitlines()[1:] if line.startswith("\t")]
        for path in re.findall(r"(?<![\w./$-])((?:[\w-]+/)+[\w.-]+\.\w+)", "\n".join(recipe)):
            assert (core.tree / path).exists(), f"Makefile: {rule.splitlines()[0]} uses {path}"


def test_the_core_copy_has_no_feature(core):
    assert_only_kept(core.tree, set(), core.result)
    assert (core.tree / "src" / "litforge" / "pipeline.py").is_file()
    for path in ("scripts/lean.py", "tests/test_lean.py", ".ci/lean"):  # lean.py itself: gone
        assert not (core.tree / path).exists(), path
    assert "\nlean:" not in (core.tree / "Makefile").read_text()
    assert "tool.litforge" not in (core.tree / "pyproject.toml").read_text()
    assert not (core.tree / "src" / "hydra_plugins").exists()
    makefile = (core.tree / "Makefile").read_text()
    assert "bench-pipeline" not in makefile and "benchmarks/inference.py" not in makefile
    assert "bench-data" in makefile and "\ntest-fast:" in makefile
    config = (core.tree / "conf" / "train.yaml").read_text()
    assert "optional sweeps" not in config and "hparams_search" not in config
    assert "restarts" not in (core.tree / "conf" / "callbacks" / "default.yaml").read_text()
    pipeline = (core.tree / "src" / "litforge" / "pipeline.py").read_text()
    assert "def build_model" in pipeline and "ChecksFit" not in pipeline  # a Python statement


def test_the_copy_does_not_give_the_whole_suites_time_as_its_own(core):
    """The time the docs quote for `make test` is that of the repository with every feature:
    true in a lean copy too only if it says so."""
    for name in ("README.md", "docs/development.md"):
        for line in (core.tree / name).read_text().splitlines():
            if line.startswith("make test ") and "minutes" in line:
                assert "with every feature" in line, f"{name}: {line}"


def test_the_copy_imports_its_own_src(core):
    """With the copy's src/ first on the path, its litforge is imported (the installed one may
    have every feature): what the training test and CI rely on."""
    code = "import importlib.util, litforge; print(litforge.__file__)\n"
    code += "print(importlib.util.find_spec('litforge.model_parallel'))"
    found = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(core.tree / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert found.stdout.split("\n")[:2] == [str(core.tree / "src/litforge/__init__.py"), "None"]


def test_the_summary_says_what_was_done(core):
    out = core.result.stdout
    assert re.search(r"files: +\d+ written \(\d+ of them edited\), \d+ left out", out), out
    lines = int(re.search(r"Python: +([\d,]+) lines in src/", out).group(1).replace(",", ""))
    assert lines == sum(len(p.read_bytes().splitlines()) for p in (core.tree / "src").rglob("*.py"))


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_each_feature_kept_alone(tmp_path, name):
    """Its files whole, the others gone, no broken link, and no word of another feature in it:
    its passages are marked right."""
    result = lean(tmp_path / "copy", "--keep", name)
    assert_only_kept(tmp_path / "copy", {name}, result)
    found = feature_words(tmp_path / "copy", set(FEATURES) - {name})
    assert not found, "words of features the copy left out:\n" + "\n".join(found)


def test_keep_model_parallel_keeps_exactly_it(tmp_path):
    tree = tmp_path / "copy"
    result = lean(tree, "--keep", "model_parallel")
    assert_only_kept(tree, {"model_parallel"}, result)
    assert "kept:    model_parallel" in result.stdout
    assert "bench-pipeline" in (tree / "Makefile").read_text()
    assert "docs/model_parallel.md" in (tree / "README.md").read_text()
    assert "strategy=model_parallel" in (tree / "docs" / "strategies.md").read_text()
    assert "parameter_server" not in (tree / "docs" / "strategies.md").read_text()


def test_the_core_copy_has_no_hook(core):
    """No feature of the core copy implements a hook of the core: hooks.py goes, with its entry in
    the import contracts and in the docs' file tree, the pipeline's calls and the docs' passages."""
    assert core.result.returncode == 0, core.result.stderr
    assert not (core.tree / "src" / "litforge" / "hooks.py").exists()
    assert feature_words_in(core.tree, ["hooks.py", "litforge.hooks", "prepare_run"]) == []
    pyproject = tomllib.loads((core.tree / "pyproject.toml").read_text())
    layers = pyproject["tool"]["importlinter"]["contracts"][0]["layers"]
    assert "hooks" not in re.split(r"[\s:|]+", " ".join(layers))
    code = (core.tree / "src" / "litforge" / "pipeline.py").read_text()
    assert "def start(" in code and "def finish(" in code and "def _target_class(" in code


def test_the_core_copy_has_no_matplotlib(core):
    """Nothing in the core copy draws: no dependency on matplotlib, no pin of it in the lock."""
    assert core.result.returncode == 0, core.result.stderr
    pyproject = tomllib.loads((core.tree / "pyproject.toml").read_text())
    assert not [d for d in pyproject["project"]["dependencies"] if d.startswith("matplotlib")]
    for lock in ("requirements/runtime.txt", "requirements/dev.txt"):
        assert not re.search(r"^matplotlib==", (core.tree / lock).read_text(), re.M), lock


@pytest.mark.skipif("tracking" not in FEATURES, reason="a lean copy without tracking")
def test_a_copy_keeps_the_hook_its_feature_implements(tmp_path):
    """With tracking, LogsRunFiles alone: its class, its import and call in the pipeline, the
    marker naming tracking only."""
    implementers = {
        "PreparesRun": {"backbones", "model_parallel", "parameter_server", "elastic", "tuning"},
        "ChecksFit": {"model_parallel"},
        "LogsRunFiles": {"tracking"},
        "KeepsTestIndices": {"streaming"},
    }
    assert implementers == IMPLEMENTERS
    tree = tmp_path / "copy"
    assert_only_kept(tree, {"tracking"}, lean(tree, "--keep", "tracking"))
    assert _hooks(tree) == ["LogsRunFiles"]
    pipeline = (tree / "src" / "litforge" / "pipeline.py").read_text()
    assert f"LogsRunFiles,  {MARK} tracking\n" in pipeline
    assert "logger.log_run_files(" in pipeline and "prepare_run" not in pipeline
    hooks = (tree / "src" / "litforge" / "hooks.py").read_text()
    assert f"from pathlib import Path  {MARK} tracking\n" in hooks and "Any" not in hooks


def test_every_feature_kept_is_the_repository(tmp_path):
    tree = tmp_path / "copy"
    result = lean(tree, *[arg for name in FEATURES for arg in ("--keep", name)])
    assert_only_kept(tree, set(FEATURES), result)
    for name in _tracked():
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            assert (tree / name).read_bytes() == (ROOT / name).read_bytes(), name


def test_a_folder_in_the_way_is_refused_in_one_line(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    result = lean(tmp_path / "taken")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "exists and is not an empty folder" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]


def test_an_empty_folder_is_filled(tmp_path):
    (tmp_path / "copy").mkdir()
    result = lean(tmp_path / "copy", "--keep", "sweeps")
    assert_only_kept(tmp_path / "copy", {"sweeps"}, result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no temporary folder left
    assert (tmp_path / "copy").stat().st_mode & 0o755 == 0o755  # not mkdtemp's private mode


def test_an_unknown_feature_is_refused(tmp_path):
    result = lean(tmp_path / "copy", "--keep", "model_paralel")
    assert result.returncode == 1
    assert "no feature model_paralel: the features are lean, model_parallel," in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failure_leaves_nothing_behind(tmp_path):
    """An unclosed marker stops the copy half-way: neither DEST nor its temporary folder stays."""
    repo = tmp_path / "repo"
    for name in _tracked():
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + "\n<!-- feature: sweeps -->\nnever closed\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)

    out = tmp_path / "out"
    out.mkdir()
    result = lean(out / "copy", root=repo)
    assert result.returncode == 1
    assert "README.md:" in result.stderr and "is never closed" in result.stderr
    assert list(out.iterdir()) == []


MARK = "# feature:"  # markers in this file's strings are made of it: the file marks nothing
KNOWN = {"alpha", "beta", "gamma"}
MARKED_PYTHON = f'''"""A module."""

import os  {MARK} alpha
from typing import (
    Any,  {MARK} beta gamma
)

LIST = [
    "a",
    "b",  {MARK} beta
]


class Kept:  {MARK} alpha beta
    """Kept when either is."""

    def method(self) -> None:
        if os.sep:  {MARK} beta
            print("beta")
        else:
            print("no beta")
        print("always")


{MARK} gamma
def gone(value: Any) -> Any:
    return value


def last() -> None:
    pass
'''


@pytest.mark.parametrize(
    ("dropped", "expected"),
    [
        (set(), MARKED_PYTHON),
        (
            {"beta", "gamma"},  # the if block whole, the import with its one name, the def
            f'''"""A module."""

import os  {MARK} alpha

LIST = [
    "a",
]


class Kept:  {MARK} alpha
    """Kept when either is."""

    def method(self) -> None:
        print("always")


def last() -> None:
    pass
''',
        ),
        (
            {"alpha", "beta"},  # the class: neither of its features kept
            f'''"""A module."""

from typing import (
    Any,  {MARK} gamma
)

LIST = [
    "a",
]


{MARK} gamma
def gone(value: Any) -> Any:
    return value


def last() -> None:
    pass
''',
        ),
    ],
    ids=["none", "beta gamma", "alpha beta"],
)
def test_a_python_marker_takes_its_statement_and_names_several_features(dropped, expected):
    lean = lean_module()
    assert lean.drop_marked_python(MARKED_PYTHON, dropped, KNOWN, "m.py") == expected


def test_a_python_marker_that_would_break_the_code_is_refused():
    lean = lean_module()
    with pytest.raises(lean.LeanError, match="no such feature delta"):
        lean.drop_marked_python(f"x = 1  {MARK} alpha delta\n", set(), KNOWN, "m.py")
    broken = f"def f():\n    return 1  {MARK} alpha\n"  # an empty block
    with pytest.raises(lean.LeanError, match=r"m.py: the copy's line \d .*mark whole statements"):
        lean.drop_marked_python(broken, {"alpha"}, KNOWN, "m.py")
    with pytest.raises(lean.LeanError, match="m.py:1: a marker alone on its line"):
        lean.drop_marked_python(f"{MARK} alpha\n# a comment\nx = 1\n", {"alpha"}, KNOWN, "m.py")
    string = f'text = """\n{MARK} alpha\n"""\n'  # in a string: no marker
    assert lean.drop_marked_python(string, {"alpha"}, KNOWN, "m.py") == string


def test_a_module_left_with_its_docstring_is_emptied():
    lean = lean_module()
    new = lean.drop_marked_python(MARKED_PYTHON, KNOWN, KNOWN, "m.py")
    assert "LIST" in new and not lean.emptied(MARKED_PYTHON, new)
    only = f'"""Hooks."""\n\n\nclass A:  {MARK} alpha\n    pass\n'
    assert lean.drop_marked_python(only, {"alpha"}, KNOWN, "m.py") == '"""Hooks."""\n'
    assert lean.emptied(only, '"""Hooks."""\n') and not lean.emptied(only, only)
    assert not lean.emptied('"""Nothing."""\n', '"""Nothing."""\n')


def test_a_markdown_marker_names_several_features():
    lean = lean_module()
    text = "a<!-- feature: alpha beta -->b<!-- /feature -->c\n"
    assert lean._apply_markers(text, set(), KNOWN, "x.md") == text
    kept = "a<!-- feature: beta -->b<!-- /feature -->c\n"
    assert lean._apply_markers(text, {"alpha", "gamma"}, KNOWN, "x.md") == kept
    assert lean._apply_markers(text, {"alpha", "beta"}, KNOWN, "x.md") == "ac\n"
    rows = (
        "| a | b |\n|---|---|\n| kept | 1 |<!-- feature: alpha -->\n"
        "| alpha's | 2 |<!-- /feature -->\n| kept too | 3 |\n"
    )
    assert lean._apply_markers(rows, {"alpha"}, KNOWN, "x.md") == (
        "| a | b |\n|---|---|\n| kept | 1 |\n| kept too | 3 |\n"
    )


def test_a_file_tree_loses_the_entries_the_copy_leaves_out():
    lean = lean_module()
    tree = [
        "conf/          configs\n",
        "src/pkg/       the package\n",
        "  gone.py      what it was,\n",
        "               on two lines\n",
        "  kept.py      what it is\n",
        "  gone/        a folder\n",
        "    inner.py   in it\n",
        "train.py, eval.py   entry points\n",
    ]

    def is_gone(path: str) -> bool:
        return path in ("src/pkg/gone.py", "src/pkg/gone") or path.startswith("src/pkg/gone/")

    assert lean._tree_without(tree, is_gone) == [tree[0], tree[1], tree[4], tree[7]]


# As in pyproject.toml's import-linter contracts (layers relative to a container, siblings split
# by | or :), plus the other kinds of contract and entry a fork may add.
IMPORT_CONTRACTS = """
[tool.importlinter]
root_packages = ["litforge", "hydra_plugins"]

[[tool.importlinter.contracts]]
name = "Feature folders import the core; the core imports none of them"
type = "layers"
containers = ["litforge"]
layers = [
    "model_parallel | parameter_server | elastic | deploy | streaming",
    "pipeline : strategies : callbacks : models : data : errors",
]
exhaustive = true

[[tool.importlinter.contracts]]
name = "The core imports no Hydra plugin"
type = "forbidden"
source_modules = ["litforge"]
forbidden_modules = ["hydra_plugins"]

[[tool.importlinter.contracts]]
name = "Features are independent"
type = "independence"
modules = ["litforge.model_parallel", "litforge.parameter_server", "litforge.deploy"]
ignore_imports = ["litforge.deploy.serve -> litforge.model_parallel.stages"]

[[tool.importlinter.contracts]]
name = "deploy's layers"
type = "layers"
containers = ["litforge.deploy"]
layers = ["serve", "inference"]
"""


def lean_module():
    spec = importlib.util.spec_from_file_location("lean", ROOT / "scripts" / "lean.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lean"] = module  # for its dataclass
    spec.loader.exec_module(module)
    return module


LAYERS = "Feature folders import the core; the core imports none of them"
CORE_LAYER = "pipeline : strategies : callbacks : models : data : errors"
KEPT_CONTRACTS = {  # features kept: (root_packages, {contract: its list of modules})
    (): (["litforge"], {LAYERS: [CORE_LAYER]}),
    ("deploy", "model_parallel"): (
        ["litforge"],
        {
            LAYERS: ["model_parallel | deploy", CORE_LAYER],
            "Features are independent": ["litforge.model_parallel", "litforge.deploy"],
            "deploy's layers": ["serve", "inference"],
        },
    ),
    ("deploy", "parameter_server"): (
        ["litforge"],
        {
            LAYERS: ["parameter_server | deploy", CORE_LAYER],
            "Features are independent": ["litforge.parameter_server", "litforge.deploy"],
            "deploy's layers": ["serve", "inference"],
        },
    ),
    ("sweeps",): (
        ["litforge", "hydra_plugins"],
        {LAYERS: [CORE_LAYER], "The core imports no Hydra plugin": ["hydra_plugins"]},
    ),
}


@pytest.mark.parametrize("kept", KEPT_CONTRACTS)
def test_import_contracts_lose_the_features_left_out(kept):
    lean = lean_module()
    text = (ROOT / "pyproject.toml").read_text().split("\n[tool.importlinter]")[0]
    text = text.split("\n[[tool.importlinter")[0] + IMPORT_CONTRACTS
    features = lean.read_features(tomllib.loads(text), _tracked())
    out = tomllib.loads(lean.lean_pyproject(text, features, set(features) - set(kept)))
    linter = out["tool"]["importlinter"]
    found = {}
    for contract in linter.get("contracts", []):
        lists = [contract[k] for k in ("layers", "forbidden_modules", "modules") if k in contract]
        found[contract["name"]] = lists[0]
        if contract["name"] == "Features are independent":  # an ignore goes with its module
            ignored = ["litforge.deploy.serve -> litforge.model_parallel.stages"]
            assert contract["ignore_imports"] == (ignored if "model_parallel" in kept else [])
    assert (linter["root_packages"], found) == KEPT_CONTRACTS[kept]


@pytest.mark.skipif(
    "importlinter" not in PYPROJECT.get("tool", {}) or not shutil.which("lint-imports"),
    reason="no import-linter contracts in pyproject.toml, or lint-imports not installed",
)
def test_the_core_copy_keeps_its_import_contracts(core):
    result = subprocess.run(
        ["lint-imports"],
        cwd=core.tree,
        env={**__import__("os").environ, "PYTHONPATH": "src"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_the_core_copy_trains(core, tmp_path):
    """`python train.py` in the copy, on the copy's own src/ (not the installed package)."""
    data_dir = write_idx_dataset(
        tmp_path / "data" / "MNIST" / "raw", n_train=200, n_test=50
    ).parents[1]
    run = run_script(
        "train.py",
        *tiny_run_args(data_dir, tmp_path / "run"),
        cwd=core.tree,
        env={"PYTHONPATH": str(core.tree / "src")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.json").is_file()
