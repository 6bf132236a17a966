"""Size the device code that cuBLAS, cuBLASLt and cuDNN load into a CUDA context, per GPU architecture.

Under eager module loading the CUDA runtime loads every module a library registered (its fat binaries)
when the library first calls into the runtime (cublasCreate, cudnnCreate); the driver picks, for each
module, the cubin for the device's SM architecture — the newest one of the same major version not newer
than the device (SASS is binary-compatible within a major version, CUDA C++ Programming Guide, "Binary
Compatibility") — or JIT-compiles its PTX when the module has no such cubin. So the bytes one library
adds to nvidia-smi under eager loading are at least the loadable sections of the cubins chosen that way.

This script reads them from the real libraries of the nvidia-* wheels that CUDA builds of torch install:
  1. the `.nv_fatbin` section of each shared library is parsed (fat binary header magic 0xBA55ED50, one
     entry per cubin/PTX with kind, SM arch, flags and sizes) to know which cubins form each module;
  2. each chosen cubin is decompressed (LZ4 block for CUDA 11/12 libraries, zstd for CUDA 13) and its ELF
     section table read: `file` is the cubin's size, `loaded` the sum of its SHF_ALLOC sections that live
     in device memory (.text.*, .nv.constant*, .nv.global*; .nv.shared.*/.nv.local.* are on-chip or
     launch-time reservations, not module memory). Symbol tables, relocations and .nv.info stay on the host.
  3. with --cuobjdump, the decompression is checked against NVIDIA's cuobjdump: the sm_80 cubins it
     extracts (`cuobjdump -arch sm_80 -xelf all LIB`) must have the same sizes. cuobjdump 13.x refuses
     fat binaries that still hold sm_35 code (the CUDA 11 libraries), which the table says.
Modules that have only PTX for an arch are counted (`ptx_only`) but not sized: their JIT output is
unknown here. The sizes are a lower bound of what the driver allocates (it also pads and aligns each
module's sections and allocates per-module bookkeeping); no published figure for that overhead was found.

Usage (writes benchmarks/results/cuda_library_images.md and src/trainmem/targets/data/cuda_library_images.json;
needs the `lz4` and `zstandard` Python packages):
  pip download --no-deps -d WHEELS nvidia-cublas-cu11==11.10.3.66 nvidia-cudnn-cu11==8.5.0.96 ...
  pip download --no-deps -d CUOBJ nvidia-cuda-cuobjdump && unzip CUOBJ/*.whl -d CUOBJ
  python benchmarks/cuda_library_images.py --cuobjdump CUOBJ/nvidia/cu13/bin/cuobjdump WHEELS/*.whl
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON_OUT = ROOT / "src/trainmem/targets/data/cuda_library_images.json"
MD_OUT = ROOT / "benchmarks/results/cuda_library_images.md"
ARCHES = (70, 75, 80, 86, 89, 90, 100, 120)  # V100, T4, A100, A10/3090, L4/4090, H100, B200, RTX 5090
FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
SHF_ALLOC = 0x2
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
DEVICE_PREFIXES = (".text.", ".nv.constant", ".nv.global")


def elf_sections(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, flags, offset, size) of every section of a 64-bit little-endian ELF image."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entsize, count, strndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[strndx][4]
    out = []
    for name_off, _type, flags, _addr, offset, size, *_ in headers:
        start = names + name_off
        out.append((data[start:data.index(b"\0", start)].decode(), flags, offset, size))
    return out


def _image(blob: bytes, entry: int, header: int, flags: int) -> bytes:
    """An entry's image, decompressed: CUDA 11/12 compress with LZ4 blocks (flag 0x2000), CUDA 13 with
    zstd frames (flag 0x8000); the header holds the compressed size at +16, the raw size at +56."""
    compressed, = struct.unpack_from("<I", blob, entry + 16)
    raw_size, = struct.unpack_from("<Q", blob, entry + 56)
    data = blob[entry + header:entry + header + compressed]
    if flags & FLAG_LZ4:
        import lz4.block

        return lz4.block.decompress(data, uncompressed_size=raw_size)
    if flags & FLAG_ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_size)
    _kind, _v, _h, payload = struct.unpack_from("<HHIQ", blob, entry)
    return blob[entry + header:entry + header + payload]


def fatbin_entries(lib: Path) -> list[tuple[int, int, int, int]]:
    """(module index, kind, SM arch, byte offset of the entry) for every entry of the library's fat
    binaries (`.nv_fatbin` section), in file order; offsets are into `fatbin_blob(lib)`."""
    blob = fatbin_blob(lib)
    entries, pos, module = [], 0, 0
    while pos + 16 <= len(blob):
        magic, _version, header, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned inside the section
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            arch, = struct.unpack_from("<I", blob, entry + 28)
            entries.append((module, kind, arch, entry))
            entry += entry_header + payload
        pos, module = end, module + 1
    return entries


def fatbin_blob(lib: Path) -> bytes:
    data = lib.read_bytes()
    found = [(o, s) for name, _f, o, s in elf_sections(data) if name == ".nv_fatbin"]
    return data[found[0][0]:found[0][0] + found[0][1]] if found else b""


def choose(entries, target: int) -> tuple[dict[int, tuple[int, int]], int, int]:
    """Per module, (arch, entry offset) of the cubin the driver loads on an sm_`target` GPU; and how
    many modules have only PTX usable there, and how many have neither (not loadable on that GPU)."""
    cubins, ptx, modules = defaultdict(list), set(), set()
    for module, kind, arch, offset in entries:
        modules.add(module)
        if kind == KIND_ELF and arch // 10 == target // 10 and arch <= target:
            cubins[module].append((arch, offset))
        elif kind == KIND_PTX and arch <= target:
            ptx.add(module)
    chosen = {m: max(found) for m, found in cubins.items()}
    ptx_only = sum(1 for m in modules if m not in chosen and m in ptx)
    return chosen, ptx_only, len(modules) - len(chosen) - ptx_only


def cubin_size(blob: bytes, offset: int) -> tuple[int, int]:
    """(file bytes, loaded bytes) of the cubin whose fatbin entry starts at `offset`."""
    _kind, _v, header, _payload = struct.unpack_from("<HHIQ", blob, offset)
    flags, = struct.unpack_from("<Q", blob, offset + 40)
    image = _image(blob, offset, header, flags)
    loaded = sum(size for name, sflags, _o, size in elf_sections(image)
                 if sflags & SHF_ALLOC and name.startswith(DEVICE_PREFIXES))
    return len(image), loaded


def measure_library(lib: Path) -> dict[str, dict[str, int]]:
    blob, entries = fatbin_blob(lib), fatbin_entries(lib)
    result, sizes = {}, {}
    for target in ARCHES:
        chosen, ptx_only, missing = choose(entries, target)
        for _arch, off in chosen.values():
            if off not in sizes:
                sizes[off] = cubin_size(blob, off)
        picked = [sizes[off] for _arch, off in chosen.values()]
        result[f"sm_{target}"] = {"modules": len(chosen), "ptx_only": ptx_only, "unsupported": missing,
                                  "file_bytes": sum(f for f, _ in picked),
                                  "loaded_bytes": sum(b for _, b in picked)}
    return result


def wheel_libraries(wheel: Path, into: Path) -> tuple[str, list[Path]]:
    """Unpack the shared libraries of an nvidia-* wheel; return 'name==version' and their paths."""
    name, version = wheel.name.split("-")[:2]
    libs = []
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            base = member.rsplit("/", 1)[-1]
            if "/lib/" in member and ".so" in base and base.startswith(("libcublas", "libcudnn")):
                libs.append(Path(archive.extract(member, into)))
    return f"{name.replace('_', '-')}=={version}", sorted(libs)


def summary(records: list[dict]) -> list[str]:
    """Per package and arch: the loaded bytes of all its libraries; cuDNN's adv sub-library (RNN and
    attention APIs) apart, since only those calls load it."""
    arches = list(records[0]["arches"])
    lines = ["| package | " + " | ".join(arches) + " |", "|---|" + "---:|" * len(arches)]
    for package in dict.fromkeys(r["package"] for r in records):
        cells = []
        for arch in arches:
            rows = [(r["library"], r["arches"][arch]) for r in records if r["package"] == package]
            if not any(row["modules"] for _l, row in rows):
                cells.append("no cubins")
                continue
            adv = sum(row["loaded_bytes"] for lib, row in rows if lib.startswith("libcudnn_adv"))
            rest = sum(row["loaded_bytes"] for lib, row in rows) - adv
            cells.append(f"{rest / 2**20:.1f}" + (f" (+{adv / 2**20:.1f} adv)" if adv else ""))
        lines.append(f"| {package} | " + " | ".join(cells) + " |")
    return lines


def markdown(records: list[dict], command: str) -> str:
    packages = " ".join(dict.fromkeys(r["package"] for r in records))
    lines = ["# Device code of cuBLAS / cuBLASLt / cuDNN per GPU architecture", "",
             "What each library loads into the CUDA context under eager module loading: for every module (fat "
             "binary) of the library, the loadable sections (.text, .nv.constant, .nv.global) of the cubin the "
             "driver picks for the GPU's arch (the newest of the same major version not newer than it). A lower "
             "bound of the device memory the library takes: the driver also aligns sections and keeps per-module "
             "state. Modules with only PTX for an arch (JIT-compiled, not sized) and with no code for it are "
             "counted in the detail table.", "",
             f"Inputs: `pip download --no-deps -d WHEELS {packages}`", "", f"Command: `{command}`", "",
             "## Loaded MiB per package and arch", ""] + summary(records) + [
             "", "## Per library", "",
             "`file` is the whole cubin (with its host-side symbol tables and metadata); `cuobjdump check`: the "
             "sizes of the sm_80 cubins NVIDIA's cuobjdump extracts equal those decompressed here.", "",
             "| package | library | arch | modules | ptx-only | unsupported | loaded MiB | file MiB | cuobjdump check |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for rec in records:
        for arch, row in rec["arches"].items():
            if row["modules"] or row["ptx_only"]:
                lines.append(f"| {rec['package']} | {rec['library']} | {arch} | {row['modules']} | {row['ptx_only']} "
                             f"| {row['unsupported']} | {row['loaded_bytes'] / 2**20:.1f} | "
                             f"{row['file_bytes'] / 2**20:.1f} | {rec['cuobjdump_check']} |")
    return "\n".join(lines) + "\n"


def main_markdown_only() -> None:
    """Rewrite the markdown from the JSON (no measurement)."""
    data = json.loads(JSON_OUT.read_text())
    MD_OUT.write_text(markdown(data["libraries"], data["source"]["command"]))


def cuobjdump_check(cuobjdump: str | None, lib: Path) -> str:
    """'same', 'differs' or why not checked: sm_80 cubin sizes from cuobjdump against this decompression."""
    blob = fatbin_blob(lib)
    if not blob:
        return "no device code"
    if not cuobjdump:
        return "not checked"
    mine = sorted(cubin_size(blob, off)[0] for _m, kind, arch, off in fatbin_entries(lib)
                  if kind == KIND_ELF and arch == 80)
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([cuobjdump, "-arch", "sm_80", "-xelf", "all", str(lib.resolve())], cwd=out,
                              capture_output=True, text=True)
        if done.returncode:
            return "cuobjdump refused: " + done.stderr.strip().split("\n")[-1][:80]
        theirs = sorted(p.stat().st_size for p in Path(out).iterdir())
    return f"same ({len(mine)} sm_80 cubins)" if mine == theirs else f"differs ({len(mine)} vs {len(theirs)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuobjdump", help="check the decompression against this cuobjdump")
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the .json")
    parser.add_argument("wheels", nargs="*", type=Path)
    args = parser.parse_args()
    if args.markdown_only:
        return main_markdown_only()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for wheel in args.wheels:
            package, libs = wheel_libraries(wheel, Path(tmp))
            for lib in libs:
                records.append({"package": package, "library": lib.name, "arches": measure_library(lib),
                                "cuobjdump_check": cuobjdump_check(args.cuobjdump, lib)})
                print(package, lib.name, records[-1]["arches"]["sm_80"], records[-1]["cuobjdump_check"], flush=True)
                lib.unlink()
    command = ("python benchmarks/cuda_library_images.py --cuobjdump cuobjdump "
               + " ".join(w.name for w in args.wheels))
    tool = subprocess.run([args.cuobjdump, "--version"], capture_output=True, text=True).stdout.split("\n")[-2] \
        if args.cuobjdump else "none"
    source = {"command": command, "checked_with": tool.strip(),
              "method": "per module, the newest same-major cubin not newer than the GPU's arch (PTX-only modules "
                        "not sized); loaded_bytes = SHF_ALLOC .text/.nv.constant/.nv.global sections of those cubins"}
    JSON_OUT.write_text(json.dumps({"source": source, "libraries": records}, indent=1) + "\n")
    MD_OUT.write_text(markdown(records, command))


if __name__ == "__main__":
    main()
