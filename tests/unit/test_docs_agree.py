"""The docs agree with the code (issue 32): every command and flag of the `millstream` command is
in the guide's command table, and every command in the README; what the README, the guide and
architecture.md list as "not yet" names no command, flag or public class that exists, and what
they list as working names only ones that do; user code in the docs imports the user API from
`millstream`; and the README's example runs."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys

import pytest

import millstream
from cli.main import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _section(text: str, heading: str) -> str:
    """From ``heading`` (a line) to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    nxt = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return rest[:nxt.start()] if nxt else rest


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def _command_table() -> dict[str, str]:
    """The guide's command table: the first word of each row's command cell -> the row."""
    rows = {}
    for line in _section(_read("docs/guide.md"), "## Command line").splitlines():
        m = re.match(r"\| `([a-z-]+)[^`]*` \|", line)
        if m:
            rows[m.group(1)] = line
    return rows


# Flags every client command takes, and the daemons' security flags: listed once, in the
# section's preamble and in the guide's Security section, not in every row.
COMMON = {"--masters", "--timeout", "--tls-ca", "--token", "--token-file", "--tls-cert", "--tls-key",
          "--tls-client-ca", "--worker-token", "--worker-token-file", "--injector-token",
          "--injector-token-file", "--operator-token", "--operator-token-file", "--injector-credential",
          "--injector-credential-file"}


def test_every_command_has_a_row_in_the_guides_command_table() -> None:
    rows = _command_table()
    assert set(_commands()) - set(rows) == set(), "commands missing from docs/guide.md's command table"
    assert set(rows) - set(_commands()) == set(), "rows of docs/guide.md's command table name no command"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_flag_is_in_its_commands_row(command: str) -> None:
    row = _command_table()[command]
    preamble = _section(_read("docs/guide.md"), "## Command line").split("| command |")[0]
    security = _section(_read("docs/guide.md"), "## Security")
    missing = [f for f in sorted(_flags(_commands()[command]))
               if f not in row and not (f in COMMON and f in preamble + security)]
    assert not missing, f"flags of `millstream {command}` missing from its row in docs/guide.md: {missing}"


def test_every_command_is_in_the_readme() -> None:
    readme = _read("README.md")
    missing = [c for c in _commands() if not re.search(rf"`(millstream )?{c}\b", readme)]
    assert not missing, f"commands the README never names: {missing}"


def _not_yet() -> list[tuple[str, str]]:
    """Every "not yet" item: (where, text)."""
    readme = _read("README.md")
    items = re.split(r"\n- ", readme.split("**Not yet:**", 1)[1].split("\n\n", 2)[1])
    found = [("README.md", i) for i in items if i.strip()]
    found += [("docs/guide.md", line) for line in _section(_read("docs/guide.md"), "## What works today").splitlines()
              if "**not yet**" in line]
    listed = _section(_read("docs/architecture.md"), "## Not yet").split("\n- ", 1)[1].split("\n\n")[0]
    found += [("docs/architecture.md", i) for i in listed.split("\n- ")]
    return found


def _outside_parentheses(text: str) -> str:
    """``text`` without its parenthesised asides (which say what does work, or where)."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


# Features the docs once called "not yet" after they were built, and what shows they exist.
BUILT = {
    r"typed (per-key )?state": lambda: hasattr(millstream, "ValueState"),
    r"event-time windows": lambda: hasattr(millstream.windows, "Tumbling"),
    r"updat\w+ (a |or )?\w* ?(submitted )?topolog": lambda: "update" in _commands(),
    r"(remov|stopp)\w+ (a )?(submitted )?topolog": lambda: "cancel" in _commands(),
    r"savepoint|backup": lambda: "savepoint" in _commands(),
    r"typed state.*state get|state get": lambda: "--state" in _flags(_commands()["state"]),
    r"--version": lambda: True,
    r"console|web page|plots?\b": lambda: True,
    r"json log|--log-format": lambda: "--log-format" in _flags(_commands()["master"]),
}


def _exists(name: str) -> bool:
    """Whether a backticked name in the docs is a command, a flag or a public name."""
    word = name.removeprefix("millstream ").split(" ")[0]
    if word in _commands() or any(word in _flags(p) for p in _commands().values()):
        return True
    if word in millstream.__all__ and word != "__version__":
        return True
    for module in (millstream.windows, millstream.testing, millstream.codecs):
        if word in module.__all__:
            return True
    return False


def test_nothing_listed_as_not_yet_exists() -> None:
    wrong = []
    for where, item in _not_yet():
        text = _outside_parentheses(item)
        for name in re.findall(r"`([^`]+)`", text):
            if _exists(name):
                wrong.append(f"{where}: `{name}` is listed as not yet, but exists: {text.strip()[:100]}")
        for phrase, built in BUILT.items():
            if re.search(phrase, text, re.I) and built():
                wrong.append(f"{where}: {phrase!r} is listed as not yet, but is built: {text.strip()[:100]}")
    assert not wrong, "\n".join(wrong)


def _works() -> list[tuple[str, str]]:
    readme = _read("README.md")
    items = readme.split("**Working today**", 1)[1].split("**Not yet:**", 1)[0]
    found = [("README.md", i) for i in re.split(r"\n- ", items)[1:]]
    found += [("docs/guide.md", line) for line in _section(_read("docs/guide.md"), "## What works today").splitlines()
              if line.startswith("| ") and "| works" in line]
    return found


def _resolves(name: str) -> bool:
    """A backticked name in a "works today" item: a command, a flag, a public class or module."""
    if _exists(name):
        return True
    word = name.removeprefix("millstream ").split(" ")[0].split("(")[0]
    if word == "py.typed":
        return os.path.isfile(os.path.join(ROOT, "millstream", "py.typed"))
    if word.startswith("ctx."):  # what user code's Context offers
        from worker.context import KeyContext
        return hasattr(millstream.Context, word[4:]) or hasattr(KeyContext, word[4:])
    if re.fullmatch(r"[a-z_]+(\.[A-Za-z_]+)+", word):  # a module, or a name in one: spark_bridge.read_state
        parts = word.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj: object = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
        return False
    if re.fullmatch(r"[A-Z][A-Za-z]+", word):  # a class: where users find it
        from injectors import Injector  # noqa: F401
        from runtime import sinks, windows
        return any(hasattr(m, word) for m in (millstream, windows, sinks))
    return True  # a value, an option, a path: not checked here


def test_everything_listed_as_working_exists() -> None:
    wrong = [f"{where}: `{name}` names nothing that exists: {text.strip()[:100]}"
             for where, text in _works() for name in re.findall(r"`([^`]+)`", text) if not _resolves(name)]
    assert not wrong, "\n".join(wrong)
    assert len(_works()) >= 20


DOCS = ["README.md", *(os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                       if f.endswith(".md") and f not in ("performance.md", "reviews.md"))]


@pytest.mark.parametrize("doc", DOCS)
def test_user_code_in_the_docs_imports_the_user_api_from_millstream(doc: str) -> None:
    wrong = []
    for module, names in re.findall(r"^\s*from (runtime|injectors|runtime\.windows|runtime\.testing|runtime\.codecs) "
                                    r"import ([^\n]+)", _read(doc), re.M):
        exported = [n.strip() for n in names.split(",") if n.strip() in millstream.__all__ or
                    n.strip() in millstream.windows.__all__ or n.strip() in millstream.testing.__all__]
        if exported:
            wrong.append(f"from {module} import {names.strip()}")
    assert not wrong, f"{doc}: import these from millstream (or millstream.windows, millstream.testing): {wrong}"


def test_the_readmes_example_counts_with_typed_state(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = _read("README.md")
    taste = readme[readme.index("## A taste of the API"):]
    code = next((m for m in re.finditer(r"```python\n(.*?)```", taste, re.S) if "jobs:Counter" in m.group(1)), None)
    assert code, "the README's example of computations"
    module = f"readme_jobs_{os.getpid()}"
    path = os.path.join(str(tmp_path), f"{module}.py")
    with open(path, "w") as f:
        f.write(code.group(1).replace('"jobs:Counter"', f'"{module}:Counter"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    jobs = importlib.import_module(module)
    try:
        topo = jobs.topo
        sink = topo.computations["sink"]
        topo.computations["sink"] = dataclasses.replace(sink, params={"path": os.path.join(str(tmp_path), "out")})
        with millstream.testing.TestRun(topo) as run:
            for i, word in enumerate("apple banana apple".split()):
                run.inject("words", word.encode(), b"", timestamp=1_700_000_000_000_000 + i)
            run.run_until_idle()
            assert run.typed_state("counter", b"apple", jobs.Counter.count) == 2
            assert run.typed_state("counter", b"banana", jobs.Counter.count) == 1
            assert sorted(r.value for r in run.output("counts")) == [b"1", b"1", b"2"]
    finally:
        sys.modules.pop(module, None)


def test_the_readmes_flow_counts_clicks_per_page_and_minute(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = _read("README.md")
    taste = readme[readme.index("## A taste of the API"):]
    code = next((m for m in re.finditer(r"```python\n(.*?)```", taste, re.S) if "Dataflow(" in m.group(1)), None)
    assert code, "the README's example of a flow"
    module = f"readme_flow_{os.getpid()}"
    with open(os.path.join(str(tmp_path), f"{module}.py"), "w") as f:
        f.write(code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    jobs = importlib.import_module(module)
    try:
        t0 = 1_700_000_000_000_000
        with millstream.testing.TestRun(jobs.flow) as run:
            for i, page in enumerate(["home", "cart", "home"]):
                run.inject("clicks", b"", json.dumps({"page": page}).encode(), timestamp=t0 + i)
            run.finish("clicks")
            run.run_until_idle()
            got = sorted((r.key, json.loads(r.value)[2]) for r in run.output("page_counts"))
            assert got == [(b"cart", 1), (b"home", 2)]
    finally:
        sys.modules.pop(module, None)


def test_the_code_map_names_every_module() -> None:
    """architecture.md's code map names every module of the project's packages under its
    package's heading (so an engineer finds each concept there, and a new module is placed on
    the map when it is made)."""
    parts = re.split(r"^\*\*`([a-z_/]+)/`\*\*", _section(_read("docs/architecture.md"), "## Code map"), flags=re.M)
    by_package = dict(zip(parts[1::2], parts[2::2], strict=True))
    missing = []
    for package in ("millstream", "runtime", "worker", "master", "injectors", "spark_bridge", "cli"):
        top = os.path.join(ROOT, package)
        for d, _, files in os.walk(top):
            rel = os.path.relpath(d, top)
            if rel.split(os.sep)[0] in ("wire", "__pycache__"):
                continue
            where = package if rel == "." else f"{package}/{rel}"
            for f in files:
                if f.endswith(".py") and (f != "__init__.py" or package == "millstream") and \
                        f"`{f}`" not in by_package.get(where, ""):
                    missing.append(f"{where}/{f}")
    assert not missing, f"docs/architecture.md's code map does not name: {', '.join(sorted(missing))}"
