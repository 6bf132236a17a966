"""The HTML report, opened in a real browser: Debian's chromium, headless.

For a CPU and a GPU-target estimate the page is rendered twice: once to a screenshot, which must show
the timeline drawn (each category's colour in the chart region, found by the phase bands' own fills), and
once to the DOM after the script ran, which must hold one SVG path per category with bytes (their bytes at
the peak adding up to the estimate's allocated peak) and the tooltip the script built for the point named
in the address. Both runs write Chromium's net log: the page must request nothing (a control page with an
<img> and a fetch shows that such requests do appear in the log). A model with markup in its module names
and warnings checks that nothing from the model is ever read as markup.
"""

from __future__ import annotations

import collections
import dataclasses
import html.parser
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

import trainmem
from trainmem.errors import TrainmemError
from trainmem.report.html import notebook_html, render_html, write_html
from trainmem.report.html_assets.svg import COLOURS, PHASE_FILLS
from trainmem.report.timeline import timeline

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install "
                                    "chromium; the Makefile's test setup does it): the browser checks need it")
WINDOW = (1200, 1300)
# quiet the browser's own background traffic (component updates, sync, field trials); whatever it still
# sends is told apart from the page's by its initiator (see _page_requests). No name resolves, so even
# those requests leave the machine no further than the resolver.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--no-first-run", "--disable-extensions", "--no-pings",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0"]
HOSTILE = ("<script>document['title']='pwned-script'</script>",
           "<img src=x onerror=document['title']='pwned-img'>")


def _chromium(page: Path, tmp: Path, action: list[str], fragment: str = "") -> tuple[str, dict]:
    """Run the browser on `page` with `action` (--screenshot=… or --dump-dom): its stdout and its net log."""
    netlog = tmp / f"net-{len(list(tmp.glob('net-*')))}.json"
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={netlog}",
                          f"--window-size={WINDOW[0]},{WINDOW[1]}", *action, page.resolve().as_uri() + fragment],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, json.loads(netlog.read_text())


def _page_requests(netlog: dict) -> set[str]:
    """URLs the page asked for. Requests the browser makes for itself carry the initiator "not an origin";
    the page's carry its origin ("null" for a file:// page)."""
    names = {value: key for key, value in netlog["constants"]["logEventTypes"].items()}
    urls = set()
    for event in netlog["events"]:
        params = event.get("params") or {}
        if names.get(event["type"]) == "URL_REQUEST_START_JOB" and "url" in params:  # the job's begin
            if params.get("initiator") != "not an origin":
                urls.add(params["url"])
    return {url for url in urls if not url.startswith(("file:", "data:", "about:"))}


def _png_pixels(path: Path):
    """The RGB pixels (height × width × 3 array) of an 8-bit non-interlaced PNG, as Chromium writes them."""
    import numpy as np

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, pos = collections.defaultdict(bytes), 8
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunks[kind] += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, width * bpp + 1)
    image, prev = np.zeros((height, width * bpp), np.uint8), np.zeros(width * bpp, np.uint8)
    for y in range(height):  # the five PNG filters (PNG specification, 9.2)
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:
            image[y] = line
        elif kind == 1:  # Sub: a running sum along each channel
            image[y] = line.reshape(width, bpp).cumsum(axis=0, dtype=np.uint8).ravel()
        elif kind == 2:
            image[y] = line + prev
        else:  # Average and Paeth depend on the byte just rebuilt: byte by byte
            out, up = [0] * (width * bpp), prev.tolist()
            for i, value in enumerate(line.tolist()):
                left, corner = (out[i - bpp], up[i - bpp]) if i >= bpp else (0, 0)
                if kind == 3:
                    out[i] = (value + (left + up[i]) // 2) & 255
                    continue
                p = left + up[i] - corner
                pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
                out[i] = (value + (left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner)) & 255
            image[y] = out
        prev = image[y]
    return image.reshape(height, width, bpp)[:, :, :3]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


class _Dom(html.parser.HTMLParser):
    """The elements of a page: (tag, attributes, text inside it) in document order."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[list] = []
        self.open: list[list] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        element = [tag, dict(attrs), ""]
        self.elements.append(element)
        if tag not in ("meta", "line", "rect", "circle", "br", "input", "img"):
            self.open.append(element)

    def handle_endtag(self, tag):
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for element in self.open:
            element[2] += data

    def find(self, tag: str, **attrs: str) -> list[list]:
        return [e for e in self.elements if e[0] == tag and all(e[1].get(k) == v for k, v in attrs.items())]


@pytest.fixture(scope="module")
def estimates():
    # the same small MLP on this machine's CPU and on a GPU target small enough for its capacity to be drawn
    return {"cpu": trainmem.estimate("mlp:784-256-10", batch_size=32),
            "gpu": trainmem.estimate("mlp:784-256-10", batch_size=32, device="custom:capacity=64MiB,cc=8.0")}


def test_page_is_self_contained(estimates):
    for est in estimates.values():
        page = render_html(est)
        assert not re.search(r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:[a-z]+:)?//""", page, re.I)
        assert "url(" not in page and "@import" not in page
        # the only absolute URL is SVG's namespace name, which nothing fetches
        assert set(re.findall(r"https?://[^\"' ]*", page)) == {"http://www.w3.org/2000/svg"}
        assert page.count("<script") == 2  # the point data and the hover, both inline


@pytest.mark.heavy
@needs_chromium
@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_chromium_draws_the_timeline(estimates, target, tmp_path):
    est = estimates[target]
    t = timeline(est)
    page = tmp_path / "report.html"
    write_html(est, page)
    _, netlog = _chromium(page, tmp_path, [f"--screenshot={tmp_path / 'shot.png'}"])
    assert _page_requests(netlog) == set()
    import numpy as np

    pixels = _png_pixels(tmp_path / "shot.png")
    code = lambda rgb: (int(rgb[0]) << 16) | (int(rgb[1]) << 8) | int(rgb[2])  # noqa: E731
    codes = (pixels[:, :, 0].astype(np.int64) << 16) | (pixels[:, :, 1].astype(np.int64) << 8) | pixels[:, :, 2]
    # the chart's region: where the phase bands' fills (used nowhere else on the page) are
    ys, xs = np.nonzero(np.isin(codes, [code(_rgb(c)) for c in PHASE_FILLS.values()]))
    assert len(xs), "no phase band drawn"
    x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
    assert x1 - x0 > 0.6 * pixels.shape[1] and y1 - y0 > 200, (x0, x1, y0, y1)
    region = codes[y0:y1 + 1, x0:x1 + 1]
    assert len(np.unique(region)) > 12, f"{len(np.unique(region))} colours in the chart"
    counts = collections.Counter(region.ravel().tolist())
    top = max(t.allocated)
    for name in t.categories:  # a category that reaches a twentieth of the top is a band several pixels high
        if max(t.by_category[name]) >= top / 20:
            assert counts[code(_rgb(COLOURS[name]))] > 500, (name, counts[code(_rgb(COLOURS[name]))])


@needs_chromium
@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_dom_after_the_script(estimates, target, tmp_path):
    est = estimates[target]
    t = timeline(est)
    page = tmp_path / "report.html"
    write_html(est, page)
    dumped, netlog = _chromium(page, tmp_path, ["--dump-dom"], fragment=f"#point={t.peak}")
    assert _page_requests(netlog) == set()
    dom = _Dom(dumped)
    [svg] = [e for e in dom.find("svg") if "tm-timeline" in e[1].get("class", "")]
    series = [e for e in dom.find("path") if e[1].get("class") == "tm-series"]
    assert [e[1]["data-category"] for e in series] == list(t.categories)
    assert svg[1]["data-series"] == str(len(t.categories)) and len(series) >= 5
    at_peak = {e[1]["data-category"]: int(e[1]["data-peak-bytes"]) for e in series}
    assert sum(at_peak.values()) == est.allocated_bytes
    for name, nbytes in est.breakdown.items():  # the drawing's peak column is the report's breakdown
        if name != "runtime":  # runtime also holds the allocator's rounding (report/timeline.py)
            assert at_peak.get(name, 0) == nbytes, name
    assert (target == "gpu") == bool(dom.find("line", **{"class": "tm-capacity"}))
    assert (target == "gpu") == bool(dom.find("path", **{"class": "tm-reserved"}))
    [tip] = dom.find("div", id="tm-tooltip")
    assert "display: block" in tip[1].get("style", "")
    assert f"op {est.peak_op}" in tip[2] and "module (model)" in tip[2] and f"step {est.peak_step}" in tip[2]
    [cursor] = dom.find("line", **{"class": "tm-cursor"})
    assert cursor[1]["visibility"] == "visible"


@needs_chromium
def test_the_mouse_moves_the_cursor(estimates, tmp_path):
    """A mousemove over the chart, dispatched where a point's column is drawn, shows that point: the hover's
    own mapping from the screen to the drawing (getScreenCTM), not the #point= shortcut."""
    est = estimates["gpu"]
    t = timeline(est)
    wanted = len(t.index) // 3
    page = tmp_path / "report.html"
    mouse = f"""<script>(function () {{
      var svg = document.querySelector("svg.tm-timeline"), box = svg.getBoundingClientRect();
      var g = JSON.parse(document.getElementById("tm-data").textContent).geometry, scale = box.width / g.svg_width;
      var x = box.left + (g.left + ({wanted} + 0.5) * g.width / {len(t.index)}) * scale;
      var y = box.top + (g.top + g.height / 2) * scale;
      svg.dispatchEvent(new MouseEvent("mousemove", {{clientX: x, clientY: y, bubbles: true}}));
    }})();</script></body>"""
    page.write_text(render_html(est).replace("</body>", mouse))
    dumped, _ = _chromium(page, tmp_path, ["--dump-dom"])
    [tip] = _Dom(dumped).find("div", id="tm-tooltip")
    assert "display: block" in tip[1].get("style", "")
    assert tip[2].startswith(f"event {t.index[wanted]} of {t.events} · step {t.step[wanted]} · {t.phase[wanted]}")


@needs_chromium
def test_the_net_log_sees_a_page_request(tmp_path):
    """The control: a page that does load something shows it in the net log, as the report's page would."""
    page = tmp_path / "control.html"
    page.write_text('<!DOCTYPE html><img src="http://127.0.0.1:9/x.png"><script>fetch("https://example.invalid/y")'
                    ".catch(function () {});</script>")
    _, netlog = _chromium(page, tmp_path, ["--dump-dom", "--virtual-time-budget=1000"])
    assert _page_requests(netlog) == {"http://127.0.0.1:9/x.png", "https://example.invalid/y"}


@pytest.fixture(scope="module")
def hostile():
    import collections as c

    import torch.nn as nn

    model = nn.Sequential(c.OrderedDict([(HOSTILE[0], nn.Linear(8, 16)), ("act", nn.ReLU()),
                                         (HOSTILE[1], nn.Linear(16, 4))]))
    est = trainmem.estimate(model, batch_size=4, input_shape="8")
    return dataclasses.replace(est, model_name="<script>document['title']='pwned-name'</script>",
                               warnings=(*est.warnings, "<img src=x onerror=document['title']='pwned-warning'>"))


def test_markup_from_the_model_is_escaped(hostile):
    page = render_html(hostile)
    for text in (*HOSTILE, "<img src=x onerror=document['title']='pwned-warning'>"):
        assert text not in page
    assert "&lt;img src=x onerror=document[&#x27;title&#x27;]=&#x27;pwned-img&#x27;&gt;" in page
    [data] = re.findall(r'<script type="application/json" id="tm-data">(.*?)</script>', page, re.S)
    assert "<" not in data and set(HOSTILE) <= set(json.loads(data)["modules"])
    notebook = notebook_html(hostile)
    assert "<script" not in notebook.replace("&lt;script", "") and not any(text in notebook for text in HOSTILE)


@needs_chromium
def test_markup_from_the_model_never_runs(hostile, tmp_path):
    t = timeline(hostile)
    point = t.module.index(HOSTILE[1])
    page = tmp_path / "report.html"
    write_html(hostile, page)
    dumped, netlog = _chromium(page, tmp_path, ["--dump-dom"], fragment=f"#point={point}")
    assert _page_requests(netlog) == set()
    dom = _Dom(dumped)
    assert dom.find("title")[0][2] == f"trainmem — {hostile.model_name}"  # as text, not run
    assert not dom.find("img") and len(dom.find("script")) == 2
    [tip] = dom.find("div", id="tm-tooltip")
    assert f"module {HOSTILE[1]}" in tip[2]  # shown as text, as the model named it
    names = {e[1].get("data-module") for e in dom.elements if "data-module" in e[1]}
    assert set(HOSTILE) <= names


def test_notebook_view(estimates, tmp_path):
    est = estimates["gpu"]
    view = notebook_html(est)
    assert "<script" not in view and view.startswith('<div class="tm">')
    assert view.count('class="tm-series"') == len(timeline(est).categories)
    assert len(view) < 60_000, len(view)
    assert "tm-series" in est._repr_html_()
    # no replay kept (a Keras estimate): the view says so in one line; the file is refused
    bare = dataclasses.replace(est, replay_input=None)
    assert "no timeline" in notebook_html(bare) and "<svg" not in notebook_html(bare)
    with pytest.raises(TrainmemError) as error:
        write_html(bare, tmp_path / "never-written.html")
    assert error.value.where == "--html"


@pytest.mark.parametrize("name, words", [
    ("missing/report.html", "existing folder"),
    (".", "ending in .html"),
    ("report.png", "ending in .html"),
    ("folder.html", "the folder"),
])
def test_bad_paths(estimates, tmp_path, name, words):
    (tmp_path / "folder.html").mkdir()
    with pytest.raises(TrainmemError) as error:
        write_html(estimates["cpu"], tmp_path / name)
    assert error.value.where == "--html" and words in error.value.message
    assert "\n" not in str(error.value)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, which takes no new files")
def test_unwritable_path(estimates):
    # /proc refuses new files even to root (for whom permission bits are no obstacle)
    with pytest.raises(TrainmemError) as error:
        write_html(estimates["cpu"], "/proc/trainmem-report.html")
    assert error.value.where == "--html" and "could not write" in error.value.message


def test_module_tree_sums_and_order():
    import torch.nn as nn

    model = nn.Sequential(nn.Sequential(nn.Linear(8, 32), nn.ReLU()),
                          nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    est = trainmem.estimate(model, batch_size=4, input_shape="8")
    owned = timeline(est).modules_at_peak
    dom = _Dom(render_html(est))
    nodes = [(e[1]["data-module"], int(e[1]["data-bytes"])) for e in dom.elements if "data-module" in e[1]]
    total = dict(nodes)
    assert len(total) == len(nodes) and "1.2" in total and "1" in total  # every ancestor is a node, once
    parent = lambda name: name.rpartition(".")[0] if "." in name else ("" if name else None)  # noqa: E731
    for name, nbytes in total.items():  # each node: what it owns plus what its children hold
        assert nbytes == owned.get(name, 0) + sum(v for child, v in total.items() if parent(child) == name)
    assert total[""] == sum(owned.values())
    for name in total:  # siblings in document order: largest first
        siblings = [v for child, v in nodes if parent(child) == name]
        assert siblings == sorted(siblings, reverse=True)
