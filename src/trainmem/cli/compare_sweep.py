"""`trainmem compare`'s command line: its flags, and the reading of `--sweep` into configurations the way the
CLI reads every flag (options.py → TrainingSetup, flag_rules.py's table per configuration), so that a bad swept
value fails as the flag would, one line naming the --sweep entry. commands/compare.py adds the flags and calls
run_compare(options) when compares_configurations(options), else compares PyTorch with Keras.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from trainmem.errors import SetupError, quote
from trainmem.setup.text_values import TEXT_VALUES

COMPARE_HELP = "models or setups side by side: PyTorch vs Keras for one model, or configurations (A B …, --sweep)"
COMPARE_DESCRIPTION = """\
Two comparisons, told apart by what is given:

  trainmem compare MODEL [flags]
      one mlp: or layer-spec model in PyTorch and in Keras on TensorFlow, side by side, each difference
      explained (the behaviour of earlier releases)
  trainmem compare A B … [flags] [--sweep KEY=V1,V2 …] [--devices D1,D2] [--plot FILE.png|svg]
  trainmem compare MODEL --sweep KEY=V1,V2 … [--devices …] [--plot …]
      configurations: every model × every combination of the swept values, each estimated with the same
      flags; one table of peaks (GPU: allocated, reserved, nvidia-smi; CPU: tensors, peak RSS), whether each
      fits its device, and with --devices the largest batch that fits each named device (trainmem fit's
      search: two traces per configuration, shared between devices that trace alike). Models come first.

--sweep keys are the flags' names (batch_size or batch, precision, loop, optimizer, optimizer_impl,
checkpointing=off,on, grad_accum, seq_len, zero_grad, activation, dropout, max_grad_norm, strategy,
world_size, …, device, alloc_conf, …); values are read as the flags read them. A key is swept or given as a
flag, not both. At most 64 configurations. A configuration whose trace fails is listed as failed with its
reason, never as not fitting. Exit codes: 0 when a configuration fits its device, 1 when configurations were
estimated and none fits, 2 on bad input or when none could be estimated (every one failed: the reasons in one
line)."""


def add_compare_flags(parser: argparse.ArgumentParser) -> None:
    """The configuration comparison's flags, after the setup flags (which add the first MODEL)."""
    parser.add_argument("more_models", nargs="*", metavar="MODEL", default=argparse.SUPPRESS,
                        help="more models to compare with the first (configurations)")
    group = parser.add_argument_group("comparing configurations")
    add = group.add_argument
    add("--sweep", action="append", nargs="+", metavar="KEY=V1,V2", help="estimate each value of KEY (a flag's "
        "name: batch, precision, loop, …); repeat, or give several in one --sweep, for their cross product "
        "(default: none)")
    add("--devices", metavar="D1,D2", help="devices to find the largest batch that fits, for each configuration "
        "(devices: `trainmem devices`) (default: none)")
    add("--margin", help="with --devices: fraction of each device's capacity to keep free, 0 ≤ m < 1 (default: "
        "fit's, the measured worst low error, each target's fit_margin in trainmem/targets/)")
    add("--time-limit", type=float, metavar="SECONDS", help="stop estimating after this long; the configurations "
        "not reached are listed as not evaluated (default: none)")
    if "--plot" not in parser._option_string_actions:  # noqa: SLF001 - estimate's --plot may be shared one day
        add("--plot", metavar="FILE.png|svg", help="configurations: also draw their peaks to FILE (needs "
            "matplotlib: pip install 'trainmem[plot]') (default: none)")


def compares_configurations(options: Any) -> bool:
    """Configurations when a second model or a sweep is given; one model alone is PyTorch vs Keras."""
    return bool(options.values.get("more_models") or options.values.get("sweep"))


def refuse_configuration_flags(options: Any) -> None:
    """--devices, --time-limit and --plot belong to the configuration comparison."""
    for key in ("devices", "time_limit", "plot"):
        if options.values.get(key) is not None:
            raise SetupError(f"expected a second MODEL or --sweep with --{key.replace('_', '-')} (one MODEL alone "
                             "compares PyTorch with Keras), got one model", where=options.origins.get(key, key))


# ---- the command -----------------------------------------------------------------------------------------------


def _sweep_items(value: Any) -> Any:
    """--sweep's argparse value (lists of KEY=… per flag), or a --setup file's: a list of texts or a table."""
    if value is None or isinstance(value, (str, Mapping)):
        return value
    return [item for group in value for item in (group if isinstance(group, list) else [group])]


def _time_limit(options: Any) -> float | None:
    limit = options.values.get("time_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0):
        raise SetupError(f"expected seconds above 0, got {quote(limit)}", where=options.origins.get("time_limit"))
    return limit


def configurations(options: Any) -> tuple[list, list[str], list[str]]:
    """Every (model, swept values) as a sweep.Configuration, each checked as its flags would be; the table's
    configuration columns; the warnings the flag table gives beyond the command's own."""
    from trainmem.cli.options import Options, check_run_options, gpu_options, setup_from_options
    from trainmem.setup.target_options import TargetOptions
    from trainmem.sweep import Configuration, check_count, grid, label_of, parse_sweep

    models = [options.model, *(options.values.get("more_models") or [])]
    where = options.origins.get("sweep", "--sweep")
    axes = parse_sweep(_sweep_items(options.values.get("sweep")), TEXT_VALUES, where)
    for axis in axes:
        if axis.key in options.given:
            raise SetupError(f"expected --{axis.key.replace('_', '-')} or {where} {axis.shown}=…, got both",
                             where=options.origins.get(axis.key, where))
    check_count(models, axes, where=where)
    known = set(check_run_options(options, "compare"))
    configs, warnings = [], []
    for model, picked in grid(models, axes):
        chosen = {axis.key: axis.values[index] for axis, index in picked}
        origins = {**options.origins, **{axis.key: f"{where} {axis.shown}={axis.texts[i]}" for axis, i in picked}}
        here = Options({**options.values, **chosen, "model": model}, {**options.given, **chosen}, origins)
        warnings += [line for line in check_run_options(here, "compare") if line not in known | set(warnings)]
        run = TargetOptions(**gpu_options(here), tf_memory=here.tf_memory)
        configs.append(Configuration(model, label_of(model, len(models) > 1, picked), setup_from_options(here),
                                     here.device, run))
    columns = (["model"] if len(models) > 1 else []) + [axis.shown for axis in axes]
    return configs, columns, warnings


def run_compare(options: Any):
    """What the CLI's command functions return: an Outcome (text, exit code, warnings)."""
    from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK, Outcome
    from trainmem.sweep import device_budgets, run

    limit = _time_limit(options)
    configs, columns, warnings = configurations(options)
    budgets = device_budgets(options.values.get("devices"), options.values.get("margin"))
    result = run(configs, columns, budgets, limit, warnings=warnings)
    written = []
    if options.values.get("plot"):
        from trainmem.cli.options import output_paths
        from trainmem.cli.output_files import write_safely

        where = options.origins.get("plot", "--plot")
        path = (options.values.get("output_paths") or output_paths(options))["plot"]
        write_safely(path, options.plot, where, lambda staged: result.write_plot(staged, where=where))
        written.append(f"trainmem: wrote the plot of peaks to {options.plot}")
    text = json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result)
    # an error is no answer: 1 only when a configuration was estimated and none fits (sweep.run raises when every
    # one failed; none estimated within the time limit is no verdict either)
    fits = any(row.estimate.fits for row in result.estimated)
    code = EXIT_OK if fits else EXIT_DOES_NOT_FIT if result.estimated else EXIT_BAD_INPUT
    return Outcome(text, code, tuple(warnings) + tuple(written))
