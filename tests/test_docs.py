"""The docs describe today's code.

Every Markdown file in docs/, examples/ (recursively), README.md and SECURITY.md is read, and
in each of them:

- **names**: a dotted ``clinograph.*`` name in inline code or a code block imports (the longest
  importable module prefix, then attributes); ``cg.*`` (``import clinograph as cg``) and
  ``sdk.*`` / ``secure.*`` are read as ``clinograph.*``; ``from clinograph... import a, b`` in a
  Python block imports ``a`` and ``b``;
- **members**: inline ``Class.member`` of a class the package defines names a member it has
  (attribute, method, pydantic or dataclass field, or an attribute its methods set);
- **calls**: a call of a Clinograph name (``cg.build_hospital(...)``, ``HospitalClient(...)``, a
  name imported in the block) passes only keywords its signature takes;
- **files**: a relative link ``[..](path)`` and a backticked path whose first folder is the
  repository's (``sdk/...``, ``examples/...``), a ``*.py`` file named from its package
  (``federation/node.py``, ``task.py``), a Markdown file or a project file (``Makefile``) exists,
  relative to the doc or the repository root; ``file.py::test_x`` also needs ``test_x`` in it;
- **commands**: ``clinograph <command> [<subcommand>] [--options]`` in a shell block or inline
  code is a command of the CLI (clinograph/cli.py, a typer app) with options it has
  (``clinograph supernode`` passes its options through to Flower and is not checked further);
- **config**: every ```toml block parses; one that configures a hospital, a simulation or the
  server (it has a section of ``SimulationConfig`` or ``ServerConfig``) uses only their keys, each
  section validates on its own, and ``[federation] strategy_options`` builds its strategy; an
  inline ``[section] key`` of those models names a key the section has.

All problems are reported at once, one line each: ``file:line: what -- the fix``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import shlex
import subprocess
import tomllib
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# References into folders a change in flight is moving, and docs it is rewriting (problems shown as
# one warning, not failed): empty -- nothing is in flight. Fill them only for the length of a move.
PENDING_MOVE: tuple[str, ...] = ()
PENDING_REWRITE: tuple[str, ...] = ()

SHELL = {"bash", "sh", "shell", "console", "zsh", ""}
PYTHON = {"python", "py", "pycon"}
NAME = re.compile(r"(?<![\w./-])(?:clinograph|cg|sdk|secure)(?:\.[A-Za-z_]\w*)+")
MEMBER = re.compile(r"^([A-Z][A-Za-z0-9]*)\.([A-Za-z_]\w*)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def doc_files() -> list[Path]:
    """Every Markdown file the docs test reads."""
    found = [REPO / "README.md", REPO / "SECURITY.md"]
    for folder in ("docs", "examples"):
        found += sorted((REPO / folder).rglob("*.md"))
    return [p for p in found if p.is_file()]


@dataclass(frozen=True)
class Snippet:
    """A piece of code in a doc: an inline span (lang ``None``) or a fenced block."""

    line: int
    text: str
    lang: str | None


@dataclass(frozen=True)
class Doc:
    """One Markdown file, cut into its code and its links."""

    path: Path
    snippets: tuple[Snippet, ...]
    links: tuple[tuple[int, str], ...]


def parse(path: Path) -> Doc:
    """Fenced blocks, inline code spans (also across wrapped lines) and link targets of ``path``."""
    snippets: list[Snippet] = []
    links: list[tuple[int, str]] = []
    para: list[tuple[int, str]] = []

    def flush() -> None:
        if not para:
            return
        text = "\n".join(t for _, t in para)
        starts = [n for n, _ in para]
        offsets = [0]
        for _, t in para:
            offsets.append(offsets[-1] + len(t) + 1)

        def line_of(pos: int) -> int:
            i = max(k for k in range(len(starts)) if offsets[k] <= pos)
            return starts[i]

        spans = list(SPAN.finditer(text))
        for m in spans:
            snippets.append(Snippet(line_of(m.start()), m.group(2).replace("\n", " ").strip(), None))
        prose = SPAN.sub(lambda m: " " * len(m.group(0)), text)
        for m in LINK.finditer(prose):
            links.append((line_of(m.start()), m.group(1)))
        para.clear()

    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            flush()
            fence, lang, start = m.group(1), m.group(2).lower(), i + 1
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            snippets.append(Snippet(start + 1, "\n".join(body), lang))
        elif lines[i].strip():
            para.append((i + 1, lines[i]))
        else:
            flush()
        i += 1
    flush()
    return Doc(path, tuple(snippets), tuple(links))


# ---- names ------------------------------------------------------------------------------


def resolve(name: str) -> str | None:
    """None if ``name`` imports (module, or module attributes); else what is wrong."""
    return _load(name)[1]


def _load(name: str) -> tuple[object, str | None]:
    """The object ``name`` names and None, or None and what is wrong."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            return None, f"importing {module} needs {exc.name!r}, which is not installed"
        except Exception as exc:  # noqa: BLE001 -- any import failure is a finding
            return None, f"importing {module} raised {type(exc).__name__}"
        for k, attr in enumerate(parts[i:], start=i):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                return None, f"{'.'.join(parts[:k])} has no attribute {attr!r}"
        return obj, None
    return None, f"no module {parts[0]!r}"


def _names(snippet: Snippet) -> set[str]:
    names = {m.group(0) for m in NAME.finditer(snippet.text)}
    if snippet.lang in PYTHON:
        try:
            tree = ast.parse(snippet.text)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "clinograph":
                names |= {f"{node.module}.{a.name}" for a in node.names if a.name != "*"}
    return {"clinograph" + n[2:] if n.startswith("cg.") else n if n.startswith("clinograph") else f"clinograph.{n}"
            for n in names}


def check_names(doc: Doc, rel: str) -> list[str]:
    problems = []
    for s in doc.snippets:
        if s.lang is not None and s.lang not in PYTHON | SHELL:
            continue  # toml, json, csv: their dotted words are data, not Python
        for name in sorted(_names(s)):
            if name.startswith(PENDING_MOVE):
                continue
            why = resolve(name)
            if why:
                problems.append(f"{rel}:{s.line}: name `{name}` does not import ({why}) -- "
                                "name what the code has today, or drop it")
    return problems


def _classes() -> dict[str, list[str]]:
    """Every class defined in the package's source: name -> the modules that define it."""
    out: dict[str, list[str]] = {}
    for folder, package in (("clinograph", "clinograph"), ("sdk", "clinograph.sdk"), ("secure", "clinograph.secure")):
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            module = ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append(module)
    return out


def _has_member(cls: type, attr: str) -> bool:
    """A class attribute, a pydantic or dataclass field, or an attribute its methods set."""
    if hasattr(cls, attr) or attr in getattr(cls, "model_fields", {}):
        return True
    for klass in cls.__mro__:
        if attr in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"self\.{re.escape(attr)}\b\s*(:[^=]*)?=(?!=)", source):
            return True
    return False


def check_members(doc: Doc, rel: str, classes: dict[str, list[str]]) -> list[str]:
    """``Class.member`` in inline code, for a class the package defines."""
    problems = []
    for s in doc.snippets:
        m = MEMBER.match(s.text) if s.lang is None else None
        if not m or m.group(1) not in classes:
            continue
        cls_name, attr = m.groups()
        found = [obj for module in classes[cls_name] if not module.startswith(PENDING_MOVE)
                 and isinstance(obj := _load(f"{module}.{cls_name}")[0], type)]
        if found and not any(_has_member(c, attr) for c in found):
            problems.append(f"{rel}:{s.line}: `{cls_name}.{attr}`: {cls_name} ({', '.join(classes[cls_name])}) has "
                            f"no member {attr!r} -- name the member it has today")
    return problems


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _calls(snippet: Snippet) -> list[tuple[str, list[str]]]:
    """Calls of Clinograph names with keyword arguments: ``(dotted name, [keywords])``; a call that
    also passes ``**mapping`` lists ``"**"`` among them."""
    try:
        tree = ast.parse(snippet.text)
    except SyntaxError:
        return []
    import clinograph

    local = {n: f"clinograph.{n}" for n in clinograph.__all__}  # the one-screen API, named bare in prose
    local["cg"] = "clinograph"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "clinograph":
            local |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (dotted := _dotted(node.func)):
            head, _, tail = dotted.partition(".")
            full = dotted if head == "clinograph" else (local[head] + (f".{tail}" if tail else "")
                                                        if head in local else None)
            kws = [k.arg or "**" for k in node.keywords]
            if full and kws:
                out.append((full, kws))
    return out


def check_keywords(doc: Doc, rel: str) -> list[str]:
    problems = []
    for s in doc.snippets:
        if s.lang is not None and s.lang not in PYTHON:
            continue
        for name, kws in _calls(s):
            if name.startswith(PENDING_MOVE):
                continue
            obj, why = _load(name)
            if why or not callable(obj):
                continue  # a missing name is check_names' finding
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            bad = [k for k in kws if k not in params and k != "**"]
            if bad:
                problems.append(f"{rel}:{s.line}: call `{name}({', '.join(k + '=' for k in bad)}...)`: no "
                                f"parameter {', '.join(bad)} (it takes: {', '.join(params) or 'none'}) -- show "
                                "today's signature")
            # a fenced block is code to copy: a required keyword-only argument it leaves out is a TypeError
            # (inline prose may abbreviate a call)
            missing = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
                       and n not in kws]
            if s.lang in PYTHON and missing and "**" not in kws:
                problems.append(f"{rel}:{s.line}: call `{name}(...)` leaves out its required argument(s) "
                                f"{', '.join(m + '=' for m in missing)} -- copied as shown it raises TypeError")
    return problems


# ---- files ------------------------------------------------------------------------------

#: the repository's own top-level entries (tracked by git): not `runs/`, `build/` or a venv a local run left
_TOP = {line.split("/")[0] for line in subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                                      check=True).stdout.splitlines()}
LABEL = re.compile(r"clinograph/v\d+/")
PROJECT_FILES = {"Makefile", "Dockerfile", "pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "noxfile.py",
                 "requirements.txt", "MANIFEST.in", "LICENSE", "CHANGELOG.md", "CONTRIBUTING.md"}
_SKIP_CHARS = ("<", ">", "*", "{", "}", "…", "...", "$", "%", "=")


def _as_path(token: str, doc_dir: Path) -> str | None:
    """``token`` as a repository path to check, or None if it does not cite a repository file."""
    token = token.strip("\"'()[],;").rstrip(":.")
    if not token or "://" in token or token.startswith(("/", "~", "-")) or any(c in token for c in _SKIP_CHARS):
        return None
    if LABEL.match(token):
        return None  # a purpose label (clinograph/v1/...), not a file
    bare = token.split("::")[0]
    if "/" in token:
        first = token.removeprefix("./").split("/")[0]
        if first in _TOP or first == ".." or (first and (doc_dir / first).exists() and doc_dir != REPO):
            return token
        return token if bare.endswith(".py") else None  # a source file named from its package folder
    if bare in PROJECT_FILES or re.fullmatch(r"[\w.-]+\.(md|py)", bare):
        return token
    return None


def _repo_files() -> list[str]:
    skip = {".git", ".venv", "node_modules", "__pycache__"}
    return [p.relative_to(REPO).as_posix() for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(REPO).parts)]


_FILES: list[str] = []


def _candidates(target: str, doc_dir: Path) -> list[Path]:
    """Where ``target`` may be: from the doc's folder, the repository root, and for a source file
    named from inside its package (``federation/node.py``, ``task.py``) any repository file
    or installed module file it ends."""
    found = [(doc_dir / target).resolve(), (REPO / target).resolve()]
    first = target.removeprefix("./").split("/")[0]
    if target.endswith(".py") and first not in _TOP and first != "..":
        if not _FILES:
            _FILES.extend(_repo_files())
        found += [REPO / f for f in _FILES if f == target or f.endswith("/" + target)]
        spec = importlib.util.find_spec(first) if "/" in target and first.isidentifier() else None
        if spec is not None and spec.submodule_search_locations:
            found += [Path(loc).parent / target for loc in spec.submodule_search_locations]
    return found


def _missing(target: str, doc_dir: Path) -> str | None:
    """None if ``target`` (a path, maybe ``#anchor``, ``:line`` or ``::test``) exists; else why not."""
    target = target.split("#")[0]
    if not target:
        return None
    target, _, test = target.partition("::")
    target = re.sub(r":\d+(-\d+)?$", "", target)
    for p in _candidates(target, doc_dir):
        if p.exists():
            test = test.split("::")[-1].split("[")[0]
            if test and not re.search(rf"^\s*(async\s+)?def {re.escape(test)}\b|^class {re.escape(test)}\b",
                                      p.read_text(encoding="utf-8"), re.M):
                return f"{target} has no `{test}`"
            return None
    return f"{target} does not exist"


def _pending(target: str, doc_dir: Path) -> bool:
    for base in (doc_dir, REPO):
        p = (base / target.split("#")[0]).resolve()
        try:
            rel = p.relative_to(REPO).as_posix()
        except ValueError:
            continue
        if rel.startswith(PENDING_MOVE) or rel + "/" in PENDING_MOVE:
            return True
    return False


def check_files(doc: Doc, rel: str) -> list[str]:
    problems = []
    doc_dir = doc.path.parent
    cited: list[tuple[int, str]] = []
    for line, target in doc.links:
        if not re.match(r"^[a-z][a-z+.-]*:", target) and not target.startswith("#"):
            cited.append((line, target))
    for s in doc.snippets:
        if s.lang is None or s.lang in SHELL:
            for k, text in enumerate(s.text.splitlines() if s.lang is not None else [s.text]):
                line = s.line + k if s.lang is not None else s.line
                for token in text.split():
                    if token.startswith("#"):
                        break  # a shell comment
                    path = _as_path(token, doc_dir)
                    if path:
                        cited.append((line, path))
    for line, target in cited:
        if _pending(target, doc_dir):
            continue
        why = _missing(target, doc_dir)
        if why:
            problems.append(f"{rel}:{line}: file `{target}`: {why} -- cite the file that holds it today")
    return problems


# ---- command line -----------------------------------------------------------------------


def _cli():
    import typer.main

    from clinograph.cli import app

    return typer.main.get_command(app)


def _commands(text: str) -> list[list[str]]:
    """Each ``clinograph ...`` invocation in shell text, as its words after ``clinograph``."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for raw in text.splitlines():
        raw = re.sub(r"^\s*\$\s+", "", raw)
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:
            words = raw.split()
        for i, w in enumerate(words):
            starts = i == 0 or words[i - 1] in {"&&", "||", ";", "|", "then", "do", "time", "exec"} \
                or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[i - 1]) is not None
            if w in {"clinograph", ".venv/bin/clinograph"} and starts:
                rest = []
                for x in words[i + 1:]:
                    if x in {"&&", "||", ";", "|", ">", "2>", ">>", "...", "…"}:
                        break
                    rest.append(x)
                out.append(rest)
    return out


def _check_invocation(cli, words: list[str]) -> str | None:
    import click

    cmd, path = cli, ["clinograph"]
    k = 0
    while isinstance(cmd, click.Group):
        if k >= len(words) or words[k].startswith("-"):
            return None  # a group's own options (--help), or its name in prose
        sub = cmd.commands.get(words[k])
        if sub is None:
            return (f"`{' '.join(path)}` has no command {words[k]!r} (it has: {', '.join(sorted(cmd.commands))})")
        cmd, path, k = sub, [*path, words[k]], k + 1
    if cmd.context_settings.get("ignore_unknown_options"):
        return None  # passes its options through (clinograph supernode)
    known = {"--help"}
    for p in cmd.params:
        known |= set(p.opts) | set(p.secondary_opts)
    bad = [w.split("=")[0] for w in words[k:] if w.startswith("-") and w != "-" and w.split("=")[0] not in known]
    if bad:
        return f"`{' '.join(path)}` has no option {', '.join(bad)} (it has: {', '.join(sorted(known))})"
    return None


def check_cli(doc: Doc, rel: str, cli) -> list[str]:
    problems = []
    for s in doc.snippets:
        if s.lang is None:
            if not re.match(r"clinograph [a-z]", s.text):
                continue
        elif s.lang not in SHELL:
            continue
        for words in _commands(s.text):
            why = _check_invocation(cli, words)
            if why:
                problems.append(f"{rel}:{s.line}: command `clinograph {' '.join(words)}`: {why} -- "
                                "show a command the CLI has (clinograph --help)")
    return problems


# ---- TOML -------------------------------------------------------------------------------


def _model_of(annotation):
    """The pydantic model a field holds (directly, optional, or as a tuple/list of), else None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _unknown_keys(data: dict, models: list, where: str) -> list[str]:
    out = []
    for key, value in data.items():
        fields = {}
        for model in models:
            for name, info in model.model_fields.items():
                fields.setdefault(info.alias or name, []).append(info)
        if key not in fields:
            out.append(f"{where}{key}")
            continue
        sub = [m for info in fields[key] if (m := _model_of(info.annotation)) is not None]
        if not sub:
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                out += _unknown_keys(item, sub, f"{where}{key}.")
    return out


SETTING = re.compile(r"\[([a-z_]+)\]\s+([a-z_]+)\b")


def check_toml(doc: Doc, rel: str) -> list[str]:
    from clinograph.sdk.config import SimulationConfig
    from clinograph.secure.runtime.config import ServerConfig

    roots = [SimulationConfig, ServerConfig]
    sections = {name for m in roots for name, info in m.model_fields.items() if _model_of(info.annotation)}
    problems = []
    for s in doc.snippets:
        if s.lang is None and (m := SETTING.match(s.text)) and m.group(1) in sections:
            for key in _unknown_keys({m.group(1): {m.group(2): None}}, roots, ""):
                problems.append(f"{rel}:{s.line}: setting `{s.text}`: `{key}` is not a config key -- use the "
                                "key sdk/config.py (or secure/runtime/config.py) defines")
        if s.lang != "toml":
            continue
        try:
            data = tomllib.loads(s.text)
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{rel}:{s.line}: ```toml block does not parse ({exc}) -- make it valid TOML "
                            "(or mark it ```text)")
            continue
        if not sections & set(data):
            continue  # a site schema, a dictionary, a Flower config: not a Clinograph config
        unknown = _unknown_keys(data, roots, "")
        for key in unknown:
            problems.append(f"{rel}:{s.line}: config key `{key}` is not in HospitalConfig, SimulationConfig or "
                            "ServerConfig -- use the key sdk/config.py (or secure/runtime/config.py) defines")
        problems += [f"{rel}:{s.line}: {why} -- show a value the config accepts"
                     for why in _bad_values(data, roots, skip={k.split(".")[0] for k in unknown})]
    return problems


def _bad_values(data: dict, roots: list, *, skip: set[str]) -> list[str]:
    """Each config section of ``data`` validated on its own (every section's keys have defaults),
    and ``[federation] strategy_options`` against the strategy that takes them."""
    from clinograph.secure.strategies import create_strategy
    from pydantic import ValidationError

    from clinograph.core.errors import ClinographError, ConfigValidationError

    out = []
    for key, value in data.items():
        info = next((m.model_fields[key] for m in roots if key in m.model_fields), None)
        section = _model_of(info.annotation) if info is not None else None
        if key in skip or section is None or not isinstance(value, dict):
            continue
        try:
            validated = section.model_validate(value)
        except (ValidationError, ConfigValidationError) as exc:
            out += [f"[{key}] {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
            continue
        if key == "federation" and "strategy_options" in value:
            try:
                create_strategy(validated.strategy, **validated.strategy_options)
            except ClinographError as exc:
                out.append(f"[federation] strategy_options: {exc}")
    return out


# ---- the tests ---------------------------------------------------------------------------


def problems_in(paths: list[Path]) -> list[str]:
    """Every problem in the Markdown files ``paths``."""
    cli, classes = _cli(), _classes()
    found = []
    for path in paths:
        doc = parse(path)
        try:
            rel = path.relative_to(REPO).as_posix()
        except ValueError:
            rel = path.name
        found += check_names(doc, rel) + check_members(doc, rel, classes) + check_keywords(doc, rel) + check_files(doc, rel) + check_cli(doc, rel, cli) + check_toml(doc, rel)
    return found


def test_docs_describe_todays_code() -> None:
    problems = problems_in(doc_files())
    pending = [p for p in problems if p.startswith(PENDING_REWRITE)]
    if pending:
        warnings.warn(f"{len(pending)} problems in docs being rewritten (PENDING_REWRITE):\n" + "\n".join(pending),
                      stacklevel=1)
    problems = [p for p in problems if p not in pending]
    assert not problems, f"{len(problems)} problems in the docs:\n" + "\n".join(problems)


def test_the_docs_test_catches_what_is_gone(tmp_path: Path) -> None:
    doc = tmp_path / "bogus.md"
    doc.write_text(
        "Use `clinograph.sdk.quality.quality_evaluator` and `cg.no_such_name`, or see\n"
        "[the loop](../sdk/federation/no_such_file.py) and `secure/strategies/gone.py`; tested by\n"
        "`tests/test_docs.py::test_no_such_test` and `research/no_such_study.py`. Run `clinograph frobnicate`. Pass\n"
        "`HospitalClient(evaluate=f)`; set `[release] no_such_setting = 1`. Read `DQWeighted.no_such_member`\n"
        "and `secure.strategies.dq.NoSuchThing`.\n\n"
        "```python\nfrom clinograph.sdk.config import HospitalConfig, NoSuchConfig\n```\n\n"
        "```python\nfrom clinograph.sdk.ingest.meds import read_meds\nread_meds('m', dictionary=d, site='s', "
        "labels=None)\n```\n\n"
        "```bash\nclinograph audit verify runs/x --no-such-flag\n```\n\n"
        "```toml\n[federation]\nrounds = 3\nno_such_key = 1\n[privacy]\nenabled = true\n```\n\n"
        "```toml\n[split]\ntest_fraction = 1.5\n[federation]\nstrategy = \"fedprox\"\n"
        "strategy_options = { mu = 0.1, no_such_option = 2 }\n```\n\n"
        "Still fine: `clinograph.sdk.config.HospitalConfig`, `sdk/tasks.py`, `runs/demo/report.html`,\n"
        "`clinograph audit verify`, `[release] metrics`,\n"
        "`[columns] x` (a site schema's), `cg.simulate_from_config(config)`, `DQWeighted.history`,\n"
        "`DQWeighted.observe`, `HospitalConfig.privacy`, `ServerApp.main` (not ours).\n",
        encoding="utf-8")
    problems = problems_in([doc])
    expected = ["clinograph.sdk.quality.quality_evaluator", "clinograph.no_such_name", "NoSuchConfig",
                "sdk/federation/no_such_file.py", "secure/strategies/gone.py", "test_no_such_test",
                "frobnicate", "--no-such-flag", "federation.no_such_key", "evaluate=", "release.no_such_setting",
                "no_such_member", "clinograph.secure.strategies.dq.NoSuchThing",
                "[split] test_fraction", "no_such_option", "research/no_such_study.py", "lookback_hours="]
    for what in expected:
        assert any(what in p for p in problems), f"{what!r} not reported in:\n" + "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)
    assert all(p.startswith("bogus.md:") for p in problems)


@pytest.mark.parametrize("token", ["runs/demo/report.html", "OUT/audit", "https://flower.ai/docs", "a/<b>.py"])
def test_paths_outside_the_repository_are_not_cited_files(token: str) -> None:
    assert _as_path(token, REPO / "docs") is None


DEPLOYMENT_DOCS = ("docs/deployment.md", "examples/flower_deployment/README.md")
SETS_MODE = re.compile(r'secure_mode = \\?"(\w+)\\?"')


def opt_in_gaps(text: str, rel: str) -> list[str]:
    """Paragraphs (or list items) of a deployment doc that run a federation under a secure mode a
    hospital joins only if its hospital.toml lists it, without saying so (`[release] secure_modes`)."""
    from clinograph.sdk.config import ReleaseSection
    from clinograph.secure.aggregation import create_mode, unknown_mode

    default = set(ReleaseSection().secure_modes)
    found, line = [], 1
    for block in re.split(r"\n(?=\s*\n|\* )", text):
        for mode in dict.fromkeys(SETS_MODE.findall(block)):
            if (mode not in default and unknown_mode(mode) is None and not create_mode(mode).insecure
                    and "secure_modes" not in block):
                found.append(f"{rel}:{line + block[: block.find(mode)].count(chr(10))}: secure_mode = {mode!r} "
                             f"without `[release] secure_modes` -- every hospital.toml must list {mode!r} to join")
        line += block.count("\n") + 1
    return found


def test_deployment_docs_say_that_every_hospital_lists_a_non_default_secure_mode() -> None:
    """[release] secure_modes (default ["masked"]) made a ckks deployment that followed the example's
    "set secure_mode = "ckks" in server.toml" a federation every hospital refused."""
    problems = [p for rel in DEPLOYMENT_DOCS for p in opt_in_gaps((REPO / rel).read_text(encoding="utf-8"), rel)]
    assert not problems, "\n".join(problems)
    bogus = ('intro\n\n* `ckks` works: set `secure_mode = "ckks"` in server.toml.\n* masked: `secure_mode = '
             '"masked"` is the default.\n\nWith `secure_mode = "ckks_threshold"`, add `secure_modes = '
             '["ckks_threshold"]` to each hospital.toml.\n')
    assert opt_in_gaps(bogus, "bogus.md") == [
        "bogus.md:3: secure_mode = 'ckks' without `[release] secure_modes` -- every hospital.toml must list 'ckks' "
        "to join"]


APP_DIR = REPO / "examples" / "flower_deployment" / "app"
RUN_CONFIG = re.compile(r"--run-config\s*\\?\s*\"([^\"]*)\"")  # inline code may wrap the quoted value
READS_RUN_CONFIG = re.compile(r"run_config(?:, |\.get\()\"([a-z][a-z-]*)\"")


def run_config_gaps(text: str, rel: str, declared: list[str]) -> list[str]:
    """`--run-config "k=v ..."` of a doc (or an app's comments) naming a key the app does not
    declare: Flower 1.41 refuses such a run as 'Invalid run configuration.', naming no key."""
    from flwr.common.config import parse_config_args

    found = []
    for m in RUN_CONFIG.finditer(text):
        keys = parse_config_args([" ".join(m.group(1).split())])
        found += [f"{rel}:{text[: m.start()].count(chr(10)) + 1}: --run-config key {k!r} is not declared in "
                  "examples/flower_deployment/app/pyproject.toml [tool.flwr.app.config] -- declare it there or "
                  "fix the doc" for k in keys if k not in declared]
    return found


def test_every_run_config_key_the_docs_and_the_serverapp_use_is_declared_by_the_app() -> None:
    """docs/fednsl.md and docs/deployment.md passed `--run-config "server-extension=..."`, which the
    ServerApp reads but the app did not declare, and the app's own comment `audit-dir=...`, which
    nothing reads: Flower refused both runs with 'Invalid run configuration.' (found following the
    docs on a loopback SuperLink, session 50)."""
    from clinograph.commands.run import app_config_keys

    declared = app_config_keys(str(APP_DIR))
    assert declared and "server-config" in declared
    read = {k for f in (REPO / "secure" / "transport" / "flower").glob("*.py")
            for k in READS_RUN_CONFIG.findall(f.read_text(encoding="utf-8"))}
    assert {"server-config", "server-extension", "relay-timeout"} <= read  # the pattern still finds them
    problems = [f"secure/transport/flower reads run config {k!r}, which the app does not declare -- a run "
                "that sets it is refused by Flower" for k in sorted(read - set(declared))]
    for path in [*(REPO / p for p in DEPLOYMENT_DOCS), REPO / "docs" / "fednsl.md", APP_DIR / "pyproject.toml",
                 REPO / "README.md"]:
        problems += run_config_gaps(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)), declared)
    assert not problems, "\n".join(problems)
    assert run_config_gaps('x\n`--run-config\n  "rounds=3 audit-dir=\'/a\'"`', "bogus.md", declared) == [
        "bogus.md:2: --run-config key 'audit-dir' is not declared in examples/flower_deployment/app/pyproject.toml "
        "[tool.flwr.app.config] -- declare it there or fix the doc"]


#: names a quickstart block leaves to the reader on purpose (said in the block: "your own ...")
READERS_OWN = {"my_baseline"}


def unbound_names(source: str) -> list[str]:
    """Names a Python block loads that nothing in it binds (import, assignment, def, argument) and
    that are not builtins: a NameError for an integrator who pastes the block."""
    import builtins

    tree = ast.parse(source)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                   and n.id not in bound})


def test_the_quickstarts_python_blocks_bind_every_name_they_use() -> None:
    """Section 7's block ingested a CSV with `schema=schema`, a name it never set: pasted as the
    page invites, it stopped at a NameError (session 50's run of every quickstart block)."""
    problems = []
    for rel in ("docs/quickstart.md", "README.md"):
        for s in parse(REPO / rel).snippets:
            if s.lang in PYTHON:
                missing = [n for n in unbound_names(s.text) if n not in READERS_OWN]
                if missing:
                    problems.append(f"{rel}:{s.line}: the block uses {missing} without defining or importing them")
    assert not problems, "\n".join(problems)
    assert unbound_names("import clinograph as cg\nt = cg.ingest(x, schema=schema)\ndef f(a):\n    return a\n") == [
        "schema", "x"]
