"""Many ranks: a fake world per traced rank (world.py), which ranks are alike (roles.py), the strategies applied
to a model (apply.py dispatching to ddp.py, fsdp.py, zero.py, tp.py, pp.py) and the trace of one rank (rank_trace.py).
The layout itself (`ParallelLayout`: degrees, rank numbering, knobs) is part of the setup: setup/layout.py."""
