"""The README as a front page and the reference under docs/: the README stays short and keeps the two commands a
newcomer starts with, every relative link of the README and of docs/*.md reaches a file, every `trainmem …` command
of their fenced code blocks is one the real parser takes (a documented flag that does not exist fails here), and the
MkDocs site builds with --strict (a link to a missing page or anchor fails it). benchmarks/doc_commands.py runs every
documented command as written and records each one's exit and time in benchmarks/results/doc_commands.md; here every
documented command must be in that table and have passed there, and the quick ones run again. The examples/
commands themselves are run by tests/test_examples.py."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200

# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
# a block of these languages shows what a command prints or a program, not commands to run
NOT_SHELL = {"text", "python", "json", "toml", "yaml"}
# what stands for a value the reader fills in: <version>, NAME…, MODEL …
PLACEHOLDER = re.compile(r"<[^>\s]+>|…")


def _relative_links(document: Path) -> list[str]:
    """The links of a document outside its code (fenced blocks and `code spans`), less URLs and in-page anchors."""
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def documented_commands() -> list[tuple[str, str]]:
    """(where, the command line) for each line of a shell code block that starts with `trainmem `, its
    continuation lines (a trailing backslash) joined."""
    found = []
    for document in DOCUMENTS:
        shell, fenced, pending, start = False, False, None, 0
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced, pending = not fenced, None
                shell = fenced and line.strip().removeprefix("```").strip() not in NOT_SHELL
                continue
            if not shell or (pending is None and not line.startswith("trainmem ")):
                continue
            if pending is None:
                pending, start = "", number
            pending += " " + line.rstrip().removesuffix("\\")
            if not line.rstrip().endswith("\\"):
                found.append((f"{document.relative_to(ROOT)}:{start}", pending.strip()))
                pending = None
    return found


COMMANDS = documented_commands()


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) < MAX_README_LINES, f"README.md has {len(text.splitlines())} lines"
    for command in ("make demo", "make test"):
        assert command in text, f"README.md no longer names `{command}`"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file(document):
    links = _relative_links(document)
    missing = [target for target in links
               if not (document.parent / target.partition("#")[0]).exists()]
    assert not missing, f"{document.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_link_check_sees_links():
    """The README links to the docs pages and the results files; a pattern that found none would pass anything."""
    links = _relative_links(README)
    assert any(link.startswith("docs/") for link in links), links
    assert any(link.startswith("benchmarks/results/") for link in links), links


def test_the_documents_show_commands():
    """Each kind of command the pages teach is found, so a change in how blocks are written cannot empty the check."""
    verbs = {shlex.split(command, comments=True)[1] for _, command in COMMANDS}
    assert {"estimate", "measure", "fit", "devices", "compare", "plan", "calibrate"} <= verbs, verbs
    assert any(where.startswith("README.md") for where, _ in COMMANDS)


@pytest.mark.parametrize("where, command", [pytest.param(where, command, id=where) for where, command in COMMANDS])
def test_a_documented_command_parses(where, command):
    if PLACEHOLDER.search(command):
        pytest.skip(f"a placeholder to fill in: {command}")
    try:
        build_parser().parse_args(shlex.split(command, comments=True)[1:])
    except SystemExit as stop:  # --help or --version would print and exit
        pytest.fail(f"{where}: `{command}` exits the parser ({stop.code})")
    except Exception as error:
        pytest.fail(f"{where}: `{command}` is refused by trainmem's parser: {error}")


def test_the_parser_check_catches_a_flag_that_does_not_exist():
    with pytest.raises(Exception, match="--no-such-flag"):
        build_parser().parse_args(["estimate", "mlp:4-2", "--no-such-flag"])


def _doc_commands():
    spec = importlib.util.spec_from_file_location("doc_commands", ROOT / "benchmarks" / "doc_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOC_COMMANDS = _doc_commands()
RECORDED = DOC_COMMANDS.recorded()
QUICK_SECONDS = 8.0  # in the table; the rest (measure, plan, fit of a 1.3B model, calibrate…) only run there
RUNNABLE = [(where, command) for where, command in COMMANDS if not PLACEHOLDER.search(command)]


def test_every_documented_command_ran_and_passed_in_the_table():
    missing = [f"{where}: {command}" for where, command in RUNNABLE if command not in RECORDED]
    assert not missing, ("documented commands that benchmarks/results/doc_commands.md has not run (python "
                         "benchmarks/doc_commands.py):\n" + "\n".join(missing))
    failed = [command for command, row in RECORDED.items() if not row["passed"]]
    assert not failed, f"documented commands that failed when run: {failed}"
    assert len(RECORDED) >= len({command for _, command in RUNNABLE}) >= 30


# each distinct command once (the README repeats some of docs/flags.md's with other comments), at its first place
QUICK = list({tuple(shlex.split(command, comments=True)): (where, command) for where, command in reversed(RUNNABLE)
              if command in RECORDED and RECORDED[command]["seconds"] <= QUICK_SECONDS}.values())[::-1]


# Keras picks its backend when it is first imported, and once a Keras command has run in this process it is
# TensorFlow's: a command that names another backend runs in a process of its own, the rest in this one (torch
# imported once: about 1 s each instead of 4)
OWN_PROCESS = ("--keras-backend",)


@pytest.mark.heavy  # 0-5 s each here
@pytest.mark.parametrize("where, command", [pytest.param(w, c, id=w) for w, c in QUICK])
def test_a_quick_documented_command_runs(where, command, tmp_path, monkeypatch, capfd):
    # a Keras command needs TensorFlow, or Keras alone on the torch backend; --plot needs matplotlib (make compat's
    # environments have neither TensorFlow nor matplotlib: there trainmem refuses those commands in one line)
    keras = "keras" in command.lower() or where.startswith("docs/keras.md")  # that page's compare: torch vs Keras
    needs = ["keras" if "--keras-backend torch" in command else "tensorflow"] if keras else []
    needs += ["matplotlib"] if "--plot" in command else []
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    work = DOC_COMMANDS.scratch_directory(tmp_path)
    if any(flag in command for flag in OWN_PROCESS):
        result = DOC_COMMANDS.run_one(command, work, tmp_path / "cache", timeout=300)
        assert result["passed"], f"{where}: `{command}` exited {result['code']}: {result['why']}"
        return
    from trainmem.cli.main import main

    monkeypatch.chdir(work)
    monkeypatch.setenv("TRAINMEM_CACHE_DIR", str(tmp_path / "cache"))
    try:
        code = main(shlex.split(command, comments=True)[1:])
    except SystemExit as stop:
        code = stop.code
    err = capfd.readouterr().err
    assert code in DOC_COMMANDS.ANSWERS and "Traceback" not in err, f"{where}: `{command}` exited {code}: {err[-800:]}"


def test_the_table_selects_quick_commands():
    """The selection reads the table: one that found nothing would run nothing."""
    assert len(QUICK) >= 12, QUICK


@pytest.mark.heavy  # a fresh process that imports MkDocs and renders every page (0.5 s warm here, seconds cold)
def test_the_site_builds_with_strict(tmp_path):
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}: pip install -e '.[docs]' (or make docs)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
