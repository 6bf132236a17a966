"""ONNX coverage: export every classification model torchvision lists as people export them (eval mode,
torch.onnx.export's TorchScript exporter, opset 17, a dynamic batch axis), then estimate training the
exported graph at batch 1. Writes benchmarks/results/onnx_coverage.md: how many convert and trace, each
failure with its reason, seconds per model. Each export is deleted after its estimate (the largest are
gigabytes).

    .venv-vision/bin/python benchmarks/onnx_coverage.py      (torchvision needs torch 2.14.1; needs onnx)
"""

from __future__ import annotations

import datetime
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem import estimate  # noqa: E402
from trainmem.errors import TrainmemError  # noqa: E402


def export(name: str, path: Path) -> None:
    import torch
    import torchvision

    model = torchvision.models.get_model(name).eval()
    size = 299 if name.startswith("inception") else 224
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, size, size),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}})


def main() -> None:
    import onnx
    import torch
    import torchvision

    rows = []
    for name in torchvision.models.list_models(module=torchvision.models):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.onnx"
            try:
                export(name, path)
            except Exception as error:  # noqa: BLE001 - the exporter's failure is torch's, not ours
                rows.append({"model": name, "status": "not exported", "reason": str(error).splitlines()[0][:160]})
                print(rows[-1], flush=True)
                continue
            started = time.perf_counter()
            try:
                est = estimate(str(path), batch_size=1, optimizer="adam")
                rows.append({"model": name, "status": "ok", "seconds": time.perf_counter() - started,
                             "parameters": est.parameters})
            except TrainmemError as error:
                rows.append({"model": name, "status": "failed", "reason": str(error)[:200]})
            print(rows[-1], flush=True)
    ok = [r for r in rows if r["status"] == "ok"]
    exported = [r for r in rows if r["status"] != "not exported"]
    lines = ["# ONNX coverage: torchvision's classification models, exported", "",
             f"Generated {datetime.date.today()} by `.venv-vision/bin/python benchmarks/onnx_coverage.py` (torch "
             f"{torch.__version__}, torchvision {torchvision.__version__}, onnx {onnx.__version__}). Each model is "
             "exported in eval mode with torch.onnx.export (TorchScript exporter, opset 17, dynamic batch) and "
             "its graph estimated at batch 1 with Adam.", "",
             f"- exported: {len(exported)}/{len(rows)}",
             f"- converted and traced: **{len(ok)}/{len(exported)}** of the exported graphs",
             f"- median {statistics.median(r['seconds'] for r in ok):.1f} s a model (the estimate, not the export)"
             if ok else "- none traced", ""]
    failures = [r for r in rows if r["status"] != "ok"]
    if failures:
        lines += ["| model | status | reason |", "|---|---|---|"]
        lines += [f"| {r['model']} | {r['status']} | {r['reason']} |" for r in failures]
    else:
        lines.append("No failures.")
    lines += ["", "Numerical agreement of the converted modules with ONNX's reference evaluator is checked in "
              "`tests/test_onnx_ref.py` on smaller exports (the evaluator is too slow for these).", ""]
    (ROOT / "benchmarks/results/onnx_coverage.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
