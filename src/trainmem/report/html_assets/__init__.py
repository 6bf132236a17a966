"""The HTML report's static parts, inlined into every page (report/html.py): its style sheet and the small
script behind the timeline's hover. Nothing is fetched at view time: no fonts, scripts or images from
anywhere, so the file opens the same offline, from an e-mail or from an archive years later.

Every rule is scoped under `.tm`, so that a notebook page (notebook_html) keeps its own look.
"""

from __future__ import annotations

# Sizes and colours are the report's own choices; system font stacks only (nothing to download).
CSS = """
.tm { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; max-width: 1060px; }
.tm h1 { font-size: 22px; margin: 0 0 4px; }
.tm h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #d8dce4; padding-bottom: 3px; }
.tm p { margin: 4px 0; }
.tm .setup { color: #444b5a; white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace;
  font-size: 12.5px; }
.tm table { border-collapse: collapse; margin: 6px 0; }
.tm td, .tm th { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
.tm th { font-weight: 600; border-bottom: 1px solid #d8dce4; }
.tm td.num, .tm th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tm tr.total td { border-top: 1px solid #9aa1ae; font-weight: 600; }
.tm .verdict { display: inline-block; padding: 4px 10px; border-radius: 4px; font-weight: 600; margin: 6px 0; }
.tm .fits { background: #e3f4e8; color: #11632f; }
.tm .nofit { background: #fbe3e1; color: #9c1c12; }
.tm .swatch { display: inline-block; width: 11px; height: 11px; margin-right: 6px; vertical-align: -1px;
  border: 1px solid rgba(0,0,0,.25); }
.tm .chart { position: relative; }
.tm svg.tm-timeline { width: 100%; height: auto; display: block; background: #fff; }
.tm svg text { font: 11px system-ui, sans-serif; fill: #333a46; }
.tm .tm-tooltip { position: absolute; pointer-events: none; background: rgba(255,255,255,.97);
  border: 1px solid #8a93a3; border-radius: 4px; padding: 6px 8px; font-size: 12px; box-shadow: 0 2px 6px
  rgba(0,0,0,.15); white-space: nowrap; display: none; z-index: 2; }
.tm .tm-tooltip .head { font-weight: 600; }
.tm .tm-tooltip td { padding: 0 8px 0 0; }
.tm details { margin-left: 16px; }
.tm details > summary, .tm .leaf { cursor: pointer; padding: 1px 0; }
.tm .leaf { margin-left: 30px; cursor: default; }
.tm .mname { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; word-break: break-all; }
.tm .bar { display: inline-block; height: 8px; background: #5b8fd6; margin: 0 8px; vertical-align: 1px; }
.tm .muted { color: #6a7282; }
.tm ul { margin: 4px 0; padding-left: 22px; }
.tm li { margin: 2px 0; }
.tm pre { background: #f5f6f8; padding: 8px; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
"""

# The hover: a vertical cursor and a tooltip (op, module, phase, live bytes in all and by category) at the
# point under the mouse, or the one the arrow keys move to. Every string from the model is set with
# textContent, never as markup. `#point=N` in the address shows point N on load (a link to a moment).
JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tm-data").textContent);
  var svg = document.querySelector("svg.tm-timeline");
  var chart = svg.parentNode;
  var NS = "http://www.w3.org/2000/svg";
  var g = data.geometry, n = data.index.length, current = -1;
  var cursor = document.createElementNS(NS, "line");
  cursor.setAttribute("class", "tm-cursor");
  cursor.setAttribute("y1", g.top); cursor.setAttribute("y2", g.top + g.height);
  cursor.setAttribute("stroke", "#111"); cursor.setAttribute("stroke-width", "1");
  cursor.setAttribute("visibility", "hidden");
  svg.appendChild(cursor);
  var tip = document.createElement("div");
  tip.className = "tm-tooltip"; tip.id = "tm-tooltip";
  chart.appendChild(tip);

  function units(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], v = Math.abs(b), i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? "-" : "") + (i === 0 ? String(v) : v.toFixed(2)) + " " + u[i];
  }
  function row(table, colour, name, value) {
    var tr = table.insertRow(), a = tr.insertCell(), b = tr.insertCell();
    if (colour) {
      var s = document.createElement("span");
      s.className = "swatch"; s.style.background = colour; a.appendChild(s);
    }
    a.appendChild(document.createTextNode(name));
    b.className = "num"; b.textContent = units(value);
  }
  function show(i) {
    if (i < 0 || i >= n) { return; }
    current = i;
    var x = g.left + (i + 0.5) * g.width / n;
    cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
    cursor.setAttribute("visibility", "visible");
    tip.textContent = "";
    var head = document.createElement("div"); head.className = "head";
    head.textContent = "event " + data.index[i] + " of " + data.events + " · step " + data.step[i] + " · " +
      data.phases[data.phase[i]];
    tip.appendChild(head);
    var op = document.createElement("div"); op.className = "op"; op.textContent = "op " + data.ops[data.op[i]];
    tip.appendChild(op);
    var mod = document.createElement("div"); mod.className = "module";
    mod.textContent = "module " + data.modules[data.module[i]];
    tip.appendChild(mod);
    var table = document.createElement("table");
    row(table, null, data.allocated_name, data.allocated[i]);
    if (data.reserved) { row(table, null, "reserved", data.reserved[i]); }
    for (var c = data.categories.length - 1; c >= 0; c--) {
      var name = data.categories[c];
      row(table, data.colours[name], name, data.by_category[name][i]);
    }
    tip.appendChild(table);
    tip.style.display = "block";
    var box = svg.getBoundingClientRect(), scale = box.width / g.svg_width;
    var left = x * scale + 14;
    if (left + tip.offsetWidth > box.width) { left = Math.max(0, x * scale - tip.offsetWidth - 14); }
    tip.style.left = left + "px";
    tip.style.top = (g.top * scale + 4) + "px";
  }
  function hide() { tip.style.display = "none"; cursor.setAttribute("visibility", "hidden"); }
  function pointAt(event) {
    var p = svg.createSVGPoint(); p.x = event.clientX; p.y = event.clientY;
    var s = p.matrixTransform(svg.getScreenCTM().inverse());
    if (s.x < g.left || s.x > g.left + g.width || s.y < g.top || s.y > g.top + g.height) { return -1; }
    return Math.min(n - 1, Math.floor((s.x - g.left) * n / g.width));
  }
  svg.addEventListener("mousemove", function (event) {
    var i = pointAt(event);
    if (i < 0) { hide(); } else { show(i); }
  });
  svg.addEventListener("mouseleave", hide);
  svg.addEventListener("keydown", function (event) {
    if (event.key === "ArrowRight") { show(Math.min(n - 1, current + 1)); event.preventDefault(); }
    else if (event.key === "ArrowLeft") { show(Math.max(0, current - 1)); event.preventDefault(); }
    else if (event.key === "Home" || event.key === "p") { show(data.peak); event.preventDefault(); }
    else if (event.key === "Escape") { hide(); }
  });
  var wanted = /[#&]point=(\d+)/.exec(window.location.hash);
  if (wanted) { show(parseInt(wanted[1], 10)); }
})();
"""
