"""Estimate training memory: the orchestrator (orchestrate.py: prepare → trace → assemble_traced), the one
assembler (assemble.py) and the frozen answer with its typed rows (result.py)."""

from trainmem.estimate.orchestrate import Prepared, assemble_traced, cache_keyword, estimate, prepare, trace
from trainmem.estimate.result import AllocatorSummary, Estimate, LeanLoop, ModuleRow

__all__ = ["AllocatorSummary", "Estimate", "LeanLoop", "ModuleRow", "Prepared", "assemble_traced", "cache_keyword",
           "estimate", "prepare", "trace"]
