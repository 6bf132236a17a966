"""One module a command. Each has `add(commands, add_command)`, which adds its subparser (`add_command(name,
text)` makes one with the setup and many-GPU flags and the MODEL references as its epilog), and `run`:
`run(options, setup) -> Outcome` for the commands of a model and a setup, `run(args) -> Outcome` for those
without (devices, calibrate)."""

from __future__ import annotations

from trainmem.cli.commands import calibrate, compare, devices, estimate, fit, measure, plan

COMMAND_MODULES = (estimate, measure, fit, compare, plan, devices, calibrate)  # the order --help lists them
SETUP_COMMANDS = {"estimate": estimate.run, "measure": measure.run, "fit": fit.run, "compare": compare.run,
                  "plan": plan.run}
ARGS_COMMANDS = {"devices": devices.run, "calibrate": calibrate.run}
