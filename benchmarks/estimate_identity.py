"""Byte-identity of estimates across a change of code: run every estimate the benchmarks publish and hash it.

    python benchmarks/estimate_identity.py --out before.jsonl          # at the old commit
    python benchmarks/estimate_identity.py --out after.jsonl           # at the new one
    python benchmarks/estimate_identity.py --compare before.jsonl after.jsonl [--md results/identity.md]

The cases are the benchmark zoo's own estimates: every CPU row of accuracy_cpu.py (model × batch × optimizer),
every row of gpu_published.jsonl that trainmem can express, and the seed MLP's golden report. Each case
records the SHA-256 of its JSON (`Estimate.to_dict()`, keys sorted) and of its text report, and the JSON
itself so that a difference can be shown. Run the old code with PYTHONPATH pointing at its `src`.

The trace cache (trainmem/trace/cache_store.py) is checked the same way: run the new side twice with one fresh
TRAINMEM_CACHE_DIR, the first pass tracing and storing, the second answered from the cache (each record says which,
`trace_cache`), and compare both with the old side: a run answered from the cache must give the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def cases() -> list[tuple[str, str, dict, dict]]:
    """(case id, model reference, setup mapping, estimate() keywords)."""
    from accuracy_cpu import OPTIMIZERS, ZOO
    from accuracy_gpu import load_rows

    found = [("seed_mlp", "mlp:1000-100-100-100-100-10",
              {"batch_size": 256, "optimizer": "adam", "input_shape": "1000"}, {})]
    for name, ref, extra, batches, _ in ZOO:
        for batch in batches:
            for optimizer in OPTIMIZERS:
                found.append((f"cpu/{name}/b{batch}/{optimizer}", ref,
                              {"batch_size": batch, "optimizer": optimizer, "loop": "inline", **extra}, {}))
    for row in load_rows():
        if row.get("skip"):
            continue
        model = row["model"]
        if model.startswith(("benchmarks/", "tests/")):
            model = str(ROOT / model)
        found.append((f"gpu/{row['id']}", model, row["setup"],
                      {"device": row["device"], "cuda_context": row.get("cuda_context"),
                       "cuda_version": row.get("cuda_version"), "module_loading": row.get("module_loading")}))
    return found + keras_cases()


# Keras on TensorFlow: each CPU path (oneDNN on and off) and each GPU memory mode, on the Keras zoo
# (benchmarks/keras_models.py) and the seed MLP spec; JSON and text as the CLI prints them
KERAS_CPU = [("mlp", 256), ("cnn_bn", 32), ("resnet_small", 32), ("lstm", 64), ("transformer_encoder", 16),
             ("embedding_bag", 256)]
KERAS_GPU = [("mlp", 256, "t4", "default"), ("cnn_bn", 32, "a100-40gb", "growth"),
             ("transformer_encoder", 16, "h100-80gb", "limit:4GiB")]


def keras_cases() -> list[tuple[str, str, dict, dict]]:
    models = str(ROOT / "benchmarks" / "keras_models.py")
    found = [(f"keras/seed_mlp/onednn_{onednn}", "mlp:1000-100-100-100-100-10",
              {"batch_size": 256, "optimizer": "adam", "input_shape": "1000"},
              {"framework": "keras", "tf_onednn": onednn}) for onednn in ("on", "off")]
    for name, batch in KERAS_CPU:
        for onednn in ("on", "off"):
            found.append((f"keras/cpu/{name}/b{batch}/onednn_{onednn}", f"{models}:{name}",
                          {"batch_size": batch, "optimizer": "adam"}, {"framework": "keras", "tf_onednn": onednn}))
    for name, batch, device, mode in KERAS_GPU:
        found.append((f"keras/gpu/{name}/b{batch}/{device}/{mode}", f"{models}:{name}",
                      {"batch_size": batch, "optimizer": "adam"},
                      {"framework": "keras", "device": device, "tf_memory": mode}))
    return found


def _keywords(options: dict) -> dict:
    """estimate()'s keywords for the case's options at the code under test: the CUDA options as target_options
    where that code has TargetOptions, as loose keywords in the code before it (so one script runs both sides)."""
    import trainmem

    if not hasattr(trainmem, "TargetOptions"):
        return options
    run_keys = set(trainmem.TargetOptions.keys())
    given = {key: value for key, value in options.items() if key in run_keys}
    return {**{k: v for k, v in options.items() if k not in run_keys}, "target_options": given}


def run(out: Path, only: str | None) -> None:
    from trainmem import estimate
    from trainmem.setup import TrainingSetup

    with out.open("w") as sink:
        for case, model, setup, options in cases():
            if only and only not in case:
                continue
            started = time.perf_counter()
            cache = None
            try:
                est = estimate(model, setup=TrainingSetup.from_mapping(setup, where=case), **_keywords(options))
                cache = getattr(est, "trace_cache", None)
                payload = json.dumps(est.to_dict(), sort_keys=True, default=str)
                text = str(est)
            except Exception as error:  # noqa: BLE001 - an error is an outcome to compare too
                payload, text = json.dumps({"error": f"{type(error).__name__}: {error}"}), ""
            record = {"case": case, "json_sha256": hashlib.sha256(payload.encode()).hexdigest(),
                      "text_sha256": hashlib.sha256(text.encode()).hexdigest(), "json": json.loads(payload),
                      "seconds": round(time.perf_counter() - started, 2), "trace_cache": cache and cache.used}
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(f"{case:60s} {record['json_sha256'][:12]} {record['text_sha256'][:12]} {record['seconds']:7.1f} s",
                  flush=True)


def _first_difference(a, b, path: str = "") -> str:
    if type(a) is not type(b):
        return f"{path or '/'}: {a!r} → {b!r}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key, "<absent>") != b.get(key, "<absent>"):
                return _first_difference(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}/{key}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items → {len(b)}"
        for index, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}/{index}")
    return f"{path or '/'}: {str(a)[:120]!r} → {str(b)[:120]!r}"


def _without_block_note(data):
    """An estimate's JSON without the note on repeated blocks (composed, or traced whole and why)."""
    if not isinstance(data, dict):
        return data
    notes = [w for w in data.get("warnings", []) if not (isinstance(w, str) and " blocks of " in w
                                                          and ("composed from block" in w or "traced whole" in w))]
    return {**data, "warnings": notes}


def compare(before: Path, after: Path, md: Path | None, title: str) -> int:
    old = {r["case"]: r for r in map(json.loads, before.read_text().splitlines())}
    new = {r["case"]: r for r in map(json.loads, after.read_text().splitlines())}
    lines = [f"# {title}", "", "Generated by `python benchmarks/estimate_identity.py --compare BEFORE AFTER --md ...`; "
             "each side by `--out` at its commit. A case is identical when the SHA-256 of its JSON (keys sorted) and "
             "of its text report are the same before and after.", "",
             "| case | JSON before | JSON after | text before | text after | identical | first difference |",
             "|---|---|---|---|---|---|---|"]
    differ = missing = only_note = 0
    for case in old:
        a, b = old[case], new.get(case)
        if b is None:
            missing += 1
            continue
        same = a["json_sha256"] == b["json_sha256"] and a["text_sha256"] == b["text_sha256"]
        differ += not same
        first = "" if same else _first_difference(a["json"], b["json"]).replace("|", "/")
        note = not same and _without_block_note(a["json"]) == _without_block_note(b["json"])
        only_note += note
        lines.append(f"| {case} | {a['json_sha256'][:12]} | {b['json_sha256'][:12]} | "
                     f"{a['text_sha256'][:12]} | {b['text_sha256'][:12]} | {'yes' if same else 'NO'} | "
                     f"{'only the note on composed blocks' if note else first[:160]} |")
        if not same:
            print(f"{case}: {first}")
    extra = sorted(set(new) - set(old))
    lines += ["", f"{len(old) - missing - differ} of {len(old) - missing} cases identical"
              + (f"; {only_note} more identical but for the note that says a model's repeated blocks were composed "
                 "(trace/block_reuse.py)" if only_note else "")
              + (f"; {missing} not run after" if missing else "") + (f"; {len(extra)} new cases" if extra else "") + "."]
    print(lines[-1])
    if md:
        md.write_text("\n".join(lines) + "\n")
    return 1 if differ or missing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", help="run only the cases whose id contains this text")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--md", type=Path)
    parser.add_argument("--title", default="Estimates before and after a change of code")
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare, args.md, args.title))
    if not args.out:
        parser.error("expected --out FILE or --compare BEFORE AFTER")
    run(args.out, args.only)


if __name__ == "__main__":
    main()
