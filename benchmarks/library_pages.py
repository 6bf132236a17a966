"""How many pages of a framework's libraries a process keeps resident (RssFile) after importing it, as the page
cache holds the library files: as found, then after the files were evicted and read back by the imports themselves.

The same `import tensorflow, keras` maps 334 MiB of file-backed pages right after `pip install` wrote the files and
313 MiB once they were evicted and read back (AMD EPYC Zen 5, TensorFlow 2.21, 2026-12-06): the kernel maps a page
fault's neighbours only where they are cached, and a file written whole by pip is cached whole, while one read back
by page faults is cached where it was read (mm/filemap.c filemap_map_pages, fault-around). Reading the whole file
with read() afterwards does not bring the higher figure back (314 MiB): it is the freshly written state only. torch's
libraries show no such difference (75 MiB both ways). trainmem's TensorFlow floor is the evicted-and-read-back figure
(targets/data/tf_cpu_floor.json); the high end allows the largest surplus recorded here
(targets/data/library_pages.json, targets/tf/cpu_process.py).

    python benchmarks/library_pages.py tensorflow [--runs 3]    # right after `pip install` to see the fresh state

Eviction is posix_fadvise(POSIX_FADV_DONTNEED) on every file of the packages, which drops their clean cached pages
unless another process maps them: run it with no other process of that framework alive. Appends a JSON line to
benchmarks/data/library_pages.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.targets.tf.calibration import distribution_version, import_resident  # noqa: E402  (trainmem calibrate's)
IMPORTS = {"tensorflow": ("import tensorflow, keras", ("tensorflow", "keras", "numpy", "h5py", "ml_dtypes", "google",
                                                       "absl", "grpc", "optree")),
           "torch": ("import torch", ("torch", "numpy", "sympy", "networkx", "jinja2"))}


def package_files(packages) -> list[str]:
    files = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            files += [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
    return files


def evict(files) -> None:
    for name in files:
        try:
            handle = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(handle)


def versions(packages) -> dict[str, str]:
    return {package: number for package in packages[:2] if (number := distribution_version(package))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=sorted(IMPORTS))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    code, packages = IMPORTS[args.framework]
    files = package_files(packages)
    newest = max(os.path.getmtime(name) for name in files)
    installed = versions(packages)
    as_found = [import_resident(code) for _ in range(args.runs)]
    evict(files)
    read_back = [import_resident(code) for _ in range(args.runs)]  # the first reads the files back; the others find them
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    row = {"framework": args.framework, "imports": code, "date": datetime.date.today().isoformat(), "cpu": cpu,
           "machine": platform.machine(), "python": platform.python_version(),
           "versions": installed,
           "files_age_hours": round((time.time() - newest) / 3600, 2),
           "as_found_file": [run["file"] for run in as_found], "read_back_file": [run["file"] for run in read_back],
           "anon": statistics.median(run["anon"] for run in as_found + read_back),
           "command": f"python benchmarks/library_pages.py {args.framework} --runs {args.runs}"}
    with open(ROOT / "benchmarks" / "data" / "library_pages.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")
    mib = 2**20
    print(f"{args.framework}: RssFile as found {[round(b / mib) for b in row['as_found_file']]} MiB (files written "
          f"{row['files_age_hours']} h ago), read back {[round(b / mib) for b in row['read_back_file']]} MiB")


if __name__ == "__main__":
    main()
