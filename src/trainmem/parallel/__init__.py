"""Many ranks: the layout (layout.py), a fake world per traced rank (world.py), which ranks are alike (roles.py), and
the strategies applied to a model (apply.py dispatching to ddp.py, fsdp.py, zero.py, tp.py, pp.py)."""
