"""How many trace entries a --memory-snapshot keeps by default (report/memviz.py), kept apart so that the
command line can show it without importing the exporter."""

# memory_viz (pytorch.org/memory_viz) draws every trace entry in the browser, so a long step makes it slow to
# load and to pan. 100,000 is a round default, not a measured limit: it keeps every entry of the models the
# tests and benchmarks use and the window around the peak of a large one; --snapshot-max-entries raises it.
DEFAULT_MAX_ENTRIES = 100_000
