"""The files a command writes (--plot, --html, --memory-snapshot): their paths are resolved against the directory
trainmem started in, whatever the model's code does to the working directory, checked before anything is
traced, and never written through a symbolic link (cli/output_files.py). The refusals through the whole CLI, each proven to come before the model's file is
imported, are cases of tests/test_hostile.py (output-*, compare-plot-*)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.cli.output_files import checked_path, output_paths, write_safely
from trainmem.errors import TrainmemError

# a factory that moves the working directory, as a user's code may (to find its data, say)
MOVING_FACTORY = """\
import os
from pathlib import Path

import torch.nn as nn


def factory():
    elsewhere = Path(__file__).with_name("elsewhere")
    elsewhere.mkdir(exist_ok=True)
    os.chdir(elsewhere)
    return nn.Linear(10, 2)
"""
HTML = (".html", ".htm")


def _where(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def test_relative_outputs_land_where_trainmem_started_whatever_the_factory_does(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(MOVING_FACTORY)
    monkeypatch.chdir(tmp_path)  # undone after the test, wherever the factory left the directory
    flags = ["--html", "report.html", "--device", "a100-40gb", "--memory-snapshot", "snapshot.pickle"]
    code = main(["estimate", "model.py:factory", "--input-shape", "10", *flags])
    err = capsys.readouterr().err
    assert code == 0, err
    assert Path.cwd() == tmp_path / "elsewhere"  # the factory did move it
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert pickle.loads((tmp_path / "snapshot.pickle").read_bytes())["segments"] is not None
    assert not list((tmp_path / "elsewhere").iterdir())
    assert "wrote the HTML report to report.html" in err  # the path as the user gave it
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".trainmem-")]  # no staging folder left


def test_a_plot_lands_where_trainmem_started(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "model.py").write_text(MOVING_FACTORY)
    monkeypatch.chdir(tmp_path)
    code = main(["estimate", "model.py:factory", "--input-shape", "10", "--plot", "timeline.svg", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "timeline.svg").read_text().lstrip().startswith("<?xml")
    assert not (tmp_path / "elsewhere" / "timeline.svg").exists()


def test_paths_are_made_absolute_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = output_paths({"html": "report.html", "plot": None, "memory_snapshot": "s.pkl"}, _where)
    assert paths == {"html": str(tmp_path / "report.html"), "memory_snapshot": str(tmp_path / "s.pkl")}


@pytest.mark.parametrize("name, words", [
    ("missing/report.html", "existing folder"),
    ("report.txt", "ending in .html or .htm"),
    ("", "expected a file name"),
    ("folder.html", "the folder"),
    ("link.html", "a symbolic link to 'model.py'"),
    ("dangling.html", "a symbolic link to 'nowhere.html'"),
    ("model.py/report.html", "is not a folder"),
    ("fifo.html", "a FIFO"),
    ("bad\0name.html", "expected a file name"),
    ("x" * 5000 + ".html", "expected a file name"),  # longer than a file system takes
])
def test_bad_output_paths_are_one_line_naming_the_flag(tmp_path, monkeypatch, name, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("print('the user's code')\n")
    (tmp_path / "folder.html").mkdir()
    (tmp_path / "link.html").symlink_to("model.py")
    (tmp_path / "dangling.html").symlink_to("nowhere.html")
    os.mkfifo(tmp_path / "fifo.html")
    with pytest.raises(TrainmemError) as error:
        checked_path(name, HTML, "--html")
    assert error.value.where == "--html" and words in error.value.message, error.value.message
    assert "\n" not in str(error.value) and len(str(error.value)) < 400
    assert (tmp_path / "model.py").read_text() == "print('the user's code')\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: permission bits are no obstacle")
def test_read_only_file_and_folder_are_refused(tmp_path):
    (tmp_path / "kept.html").write_text("keep me")
    (tmp_path / "kept.html").chmod(0o444)
    with pytest.raises(TrainmemError, match="read-only"):
        checked_path(str(tmp_path / "kept.html"), HTML, "--html")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        with pytest.raises(TrainmemError, match="no permission to write"):
            checked_path(str(locked / "report.html"), HTML, "--html")
    finally:
        locked.chmod(0o755)


def test_an_existing_file_is_replaced_whole(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("an older report, longer than the new one " * 100)
    path = checked_path(str(target), HTML, "--html")
    assert write_safely(path, "report.html", "--html", lambda staged: Path(staged).write_text("new")) == 3
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["report.html"]


def test_a_link_made_after_the_check_is_refused(tmp_path):
    (tmp_path / "model.py").write_text("code")
    path = checked_path(str(tmp_path / "report.html"), HTML, "--html")
    (tmp_path / "report.html").symlink_to("model.py")  # between reading the flags and writing the file
    with pytest.raises(TrainmemError, match="symbolic link") as error:
        write_safely(path, "report.html", "--html", lambda staged: Path(staged).write_text("report"))
    assert error.value.where == "--html"
    assert (tmp_path / "model.py").read_text() == "code"


def test_a_link_made_while_writing_is_replaced_never_followed(tmp_path):
    (tmp_path / "model.py").write_text("code")
    path = checked_path(str(tmp_path / "report.html"), HTML, "--html")

    def write_while_a_link_appears(staged: str) -> None:
        Path(staged).write_text("report")
        (tmp_path / "report.html").symlink_to("model.py")  # the race: after every check, before the rename

    write_safely(path, "report.html", "--html", write_while_a_link_appears)
    assert not (tmp_path / "report.html").is_symlink() and (tmp_path / "report.html").read_text() == "report"
    assert (tmp_path / "model.py").read_text() == "code"


def test_a_failed_write_names_the_users_path_and_leaves_nothing(tmp_path):
    path = checked_path(str(tmp_path / "report.html"), HTML, "--html")

    def fails(staged: str) -> None:
        Path(staged).write_text("half a report")
        raise TrainmemError(f"expected a writable file, could not write {staged!r}: No space left on device",
                            where="--html")

    with pytest.raises(TrainmemError) as error:
        write_safely(path, "report.html", "--html", fails)
    assert "'report.html'" in error.value.message and ".trainmem-" not in error.value.message
    assert os.listdir(tmp_path) == []
