"""Every flag reads its text as setup/text_values.py says, so `--sweep KEY=V1,V2` and `trainmem.sweep()` read a value
exactly as the flag would."""

from __future__ import annotations

import argparse

import pytest

from trainmem.cli.parser import build_parser
from trainmem.setup.text_values import TEXT_VALUES, on_off, one_of, reader, true_false
from trainmem.sweep import SWEEP_KEYS


def _command_actions(name: str) -> list[argparse.Action]:
    return list(build_parser()._subparsers._group_actions[0].choices[name]._actions)  # noqa: SLF001 - argparse's table


@pytest.mark.parametrize("command", ["estimate", "compare", "fit", "measure"])
def test_each_flag_reads_text_as_the_table_says(command):
    typed: dict[str, set] = {}
    switches: set[str] = set()
    for action in _command_actions(command):
        if action.dest not in SWEEP_KEYS:
            continue
        if action.nargs == 0:
            switches.add(action.dest)
        elif action.choices:
            assert tuple(action.choices) == reader(action.dest).choices, action.dest
        else:
            typed.setdefault(action.dest, set()).add(action.type or str)
    for key, types in typed.items():
        assert types == {reader(key)}, f"--{key.replace('_', '-')} reads {types}, the table {reader(key)}"
    for key in switches - set(typed):  # a switch alone (--checkpointing): its text form is on|off
        assert reader(key) is on_off, key


def test_the_readers_say_what_they_expect():
    assert on_off("ON") is True and on_off("false") is False and true_false("yes") is True
    with pytest.raises(argparse.ArgumentTypeError, match="expected on|off"):
        on_off("maybe")
    with pytest.raises(argparse.ArgumentTypeError, match="expected lazy|eager, got 'soon'"):
        one_of(("lazy", "eager"))("soon")
    assert reader("batch_size")("8") == 8 and reader("precision") is str and set(TEXT_VALUES) <= SWEEP_KEYS


def test_a_swept_value_fails_as_the_flag_would():
    from trainmem.errors import SetupError
    from trainmem.sweep import parse_sweep

    with pytest.raises(SetupError, match="expected on|off"):
        parse_sweep(["checkpointing=on,sometimes"], TEXT_VALUES)
    axes = parse_sweep(["batch=2,4", "module_loading=lazy,eager"], TEXT_VALUES)
    assert [axis.values for axis in axes] == [(2, 4), ("lazy", "eager")]
