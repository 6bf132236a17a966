"""The colours of the memory categories, one table for every drawing (report/plot.py's PNG/SVG, the HTML page).

Okabe & Ito, "Color Universal Design" (2008, https://jfly.uni-koeln.de/color/): eight colours that stay apart
under every common colour-vision deficiency. Ten categories: the two rarest (runtime, communication) take greys.
"""

CATEGORY_COLOURS = {
    "parameters": "#0072B2", "buffers": "#56B4E9", "gradients": "#E69F00", "optimizer_state": "#009E73",
    "optimizer_scalars": "#F0E442", "activations": "#D55E00", "temporaries": "#CC79A7", "inputs": "#999999",
    "runtime": "#555555", "communication": "#000000",
    "checkpoint": "#882255",  # --load only: Paul Tol's wine, apart from the eight above
}
OTHER_COLOUR = "#BBBBBB"  # a category this table does not name yet
