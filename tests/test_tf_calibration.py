"""TensorFlow's import floor measured on this machine (`trainmem calibrate`, targets/tf/calibration.py) and used by
the Keras estimates here in place of the bundled entry's; the rest of the bundled constants stay."""

from __future__ import annotations

import importlib.util

import pytest

from trainmem.targets.tf import calibration
from trainmem.targets.tf import cpu_process as tf_cpu

MIB = 2**20
BUNDLED = {"import_anon_bytes": 190 * MIB, "import_file_bytes": 330 * MIB, "import_file_min": 320 * MIB,
           "import_file_max": 345 * MIB, "fit_machinery_bytes": 30 * MIB, "matched": "this CPU class and path"}


def _entry(**changes):
    entry = {"machine": calibration.this_machine(), "tensorflow": "2.21.0", "keras": "3.15.1",
             "import_anon_bytes": 200 * MIB, "import_file_bytes": 340 * MIB, "import_file_min": 339 * MIB,
             "import_file_max": 341 * MIB, "runs": 3, "measured": "2026-12-06"}
    return {**entry, **changes}


def test_this_machines_import_floor_replaces_the_bundled_one_and_nothing_else(tmp_path):
    calibration.store(_entry(), tmp_path)
    floor = calibration.with_own_floor(BUNDLED, tmp_path, "2.21.0")
    assert (floor["import_anon_bytes"], floor["import_file_bytes"], floor["import_file_max"]) == (
        200 * MIB, 340 * MIB, 341 * MIB)
    assert floor["fit_machinery_bytes"] == 30 * MIB and floor["matched"] == "this CPU class and path"
    assert floor["own_import_floor"] == "2026-12-06"


def test_another_tensorflow_or_machine_or_a_broken_file_keeps_the_bundled_floor(tmp_path):
    calibration.store(_entry(tensorflow="2.20.0"), tmp_path)
    calibration.store(_entry(machine={"vendor": "Other", "model_id": "1/1", "cpus": 1}), tmp_path)
    assert calibration.with_own_floor(BUNDLED, tmp_path, "2.21.0") == BUNDLED
    (tmp_path / calibration.USER_FILE).write_text("{not json")
    assert calibration.stored(tmp_path) == [] and calibration.with_own_floor(BUNDLED, tmp_path, "2.21.0") == BUNDLED


def test_a_second_calibration_of_the_same_machine_and_tensorflow_replaces_the_first(tmp_path):
    calibration.store(_entry(), tmp_path)
    calibration.store(_entry(import_anon_bytes=210 * MIB, measured="2026-12-07"), tmp_path)
    assert [entry["import_anon_bytes"] for entry in calibration.stored(tmp_path)] == [210 * MIB]


@pytest.mark.tf
@pytest.mark.heavy
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_measured_floor_is_this_machines_and_the_keras_estimate_uses_it(tmp_path, monkeypatch):
    from trainmem.targets import calibrations

    measured = calibration.measure(runs=1)
    # what import tensorflow, keras keeps: some hundreds of MiB of each kind (211 and 313-350 MiB measured)
    assert 100 * MIB < measured["import_anon_bytes"] < 600 * MIB
    assert 100 * MIB < measured["import_file_bytes"] < 800 * MIB
    monkeypatch.setenv(calibrations.ENV_DIR, str(tmp_path))
    calibration.store(measured, tmp_path)
    floor = tf_cpu.load_floor(True)
    assert floor["import_anon_bytes"] == measured["import_anon_bytes"] and floor["own_import_floor"]
