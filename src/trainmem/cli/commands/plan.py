"""`trainmem plan MODEL --gpus 8xh100-80gb`: the layouts that fit (plan/ is the planner itself).

Setup flags fix what they name (--precision, --checkpointing, --batch-size as the micro-batch); the lists below
widen or narrow what is enumerated. Exit 0 when a layout fits, 1 when none of those evaluated does, 2 on bad
input or when no layout could be evaluated (every one failed, with the reasons in one line, or the time limit
passed before any): a layout that fails is listed as failed with its reason, never counted as not fitting.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK, EXIT_STATUS_HELP, Outcome
from trainmem.cli.parallel_flags import add_parallel_flags
from trainmem.cli.parser import add_process_flags, add_setup_flags

PLAN_TEXT = "the layouts of N GPUs (data-parallel kind x dp.tp.pp x micro-batch x checkpointing x precision x offload) that fit, ranked by headroom"


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("plan", help=PLAN_TEXT, description=PLAN_TEXT, epilog=EXIT_STATUS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_flags(parser)
    add_process_flags(parser)
    add_parallel_flags(parser)
    group = parser.add_argument_group("plan")
    add = group.add_argument
    add("--gpus", metavar="COUNTxDEVICE", help="how many GPUs of which kind, e.g. 8xh100-80gb or 1024xh100-80gb "
        "(devices: `trainmem devices`); required")
    add("--strategies", metavar="LIST", help="data-parallel kinds to consider (default: ddp,fsdp,hsdp,zero1,zero2,zero3)")
    add("--micro-batches", metavar="LIST", help="micro-batch sizes (default: 1,2,4,8; --batch-size fixes one)")
    add("--precisions", metavar="LIST", help="fp32|bf16-mixed|… (default: bf16-mixed,fp32; --precision fixes one)")
    add("--checkpointing-options", metavar="LIST", help="off,on (default: both, off tried first; --checkpointing "
        "fixes on)")
    add("--offloads", metavar="LIST", help="none,optimizer,params (default: all three, none tried first)")
    add("--tps", metavar="LIST", help="tensor-parallel degrees to consider (default: every divisor of a node's GPUs)")
    add("--pps", metavar="LIST", help="pipeline degrees to consider (default: every divisor up to the blocks)")
    add("--margin", help="fraction of each GPU's memory to keep free, 0 ≤ m < 1 (default: fit's GPU margin)")
    add("--top", type=int, metavar="N", help="layouts shown (default: 20; JSON lists all)")
    add("--time-limit", type=float, metavar="SECONDS", help="stop tracing after this long; the layouts not reached "
        "are listed as not evaluated (default: none)")
    add("--jobs", type=int, metavar="N", help="worker processes tracing at once (default: one per CPU, as memory "
        "allows; 1: in this process)")


def run(options: Any, setup: Any) -> Outcome:
    from trainmem.errors import SetupError
    from trainmem.plan import fixed_checkpointing, plan

    values = options.values
    if values.get("gpus") is None:
        raise SetupError("expected --gpus COUNTxDEVICE such as 8xh100-80gb, got none", where="--gpus")
    if "device" in options.given:
        raise SetupError(f"expected --gpus COUNTxDEVICE with plan, got --device {options.given['device']}",
                         where=options.origins.get("device", "--device"))
    top = values.get("top")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise SetupError(f"expected a whole number of at least 1, got {top!r}", where="--top")
    limit = values.get("time_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0):
        raise SetupError(f"expected seconds above 0, got {limit!r}", where="--time-limit")
    given = options.given
    result = plan(options.model, values["gpus"], setup=setup, gpus_per_node=setup.parallel.gpus_per_node,
                  margin=values.get("margin"), strategies=values.get("strategies"),
                  micro_batches=values.get("micro_batches") or ((setup.batch_size,) if "batch_size" in given else None),
                  precisions=values.get("precisions") or ((setup.precision,) if "precision" in given else None),
                  checkpointing=values.get("checkpointing_options") or fixed_checkpointing(given),
                  offloads=values.get("offloads"), tps=values.get("tps"), pps=values.get("pps"), top=top or 20, time_limit=limit,
                  jobs=values.get("jobs"))
    text = json.dumps(result.to_dict(), indent=2) if values.get("format") == "json" else str(result)
    return Outcome(text, EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT if result.evaluated else EXIT_BAD_INPUT)
