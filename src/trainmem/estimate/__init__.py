"""Estimate training memory: the orchestrator (orchestrate.py: plan → trace → assemble_traced), the one
assembler (assemble.py) and the frozen answer with its typed rows (result.py)."""

from trainmem.estimate.orchestrate import Plan, assemble_traced, estimate, plan, trace
from trainmem.estimate.result import AllocatorSummary, Estimate, LeanLoop, ModuleRow

__all__ = ["AllocatorSummary", "Estimate", "LeanLoop", "ModuleRow", "Plan", "assemble_traced", "estimate", "plan",
           "trace"]
