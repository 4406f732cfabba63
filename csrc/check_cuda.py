"""Compile-check csrc/cuda/*.cu with nvcc against the installed torch, with no GPU needed.

    python csrc/check_cuda.py [--arch sm_90]

setup.py compiles the CUDA kernels only where torch has CUDA, so on a CPU-only machine
they would never be compiled at all. This script runs ``nvcc -c`` on each .cu file with
the installed torch's headers and throws the objects away, so a type or syntax error in
a kernel shows up here and in CI. A CPU-only torch wheel ships the c10/ATen CUDA headers
except one that its build generates, ``c10/cuda/impl/cuda_cmake_macros.h``; a stand-in
is written to a temporary include directory. Without nvcc it fails (CI must check the
kernels), unless ``--allow-missing-nvcc`` says a machine without the toolkit is expected.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torch.utils.cpp_extension import CUDA_HOME, include_paths

CSRC = Path(__file__).resolve().parent
GENERATED_HEADER = "c10/cuda/impl/cuda_cmake_macros.h"


def nvcc_path() -> str | None:
    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90, H100/H200)")
    parser.add_argument("--allow-missing-nvcc", action="store_true",
                        help="exit 0 (saying so) when nvcc is not found")
    args = parser.parse_args()
    nvcc = nvcc_path()
    if nvcc is None:
        print("check_cuda: nvcc not found (neither $CUDA_HOME/bin/nvcc nor on PATH); CUDA "
              "kernels NOT compile-checked", file=sys.stderr)
        return 0 if args.allow_missing_nvcc else 1
    sources = sorted((CSRC / "cuda").glob("*.cu"))
    with tempfile.TemporaryDirectory() as tmp:
        includes = [f"-I{path}" for path in include_paths()]
        if not any((Path(path) / GENERATED_HEADER).exists() for path in include_paths()):
            stand_in = Path(tmp) / "include" / GENERATED_HEADER
            stand_in.parent.mkdir(parents=True)
            stand_in.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
            includes.append(f"-I{Path(tmp) / 'include'}")
        if CUDA_HOME:
            includes.append(f"-I{Path(CUDA_HOME) / 'include'}")

        def compile_one(source: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
            command = [nvcc, "-c", "-std=c++20", "-O3", f"-arch={args.arch}",
                       "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", *includes,
                       str(source), "-o", str(Path(tmp) / f"{source.stem}.o")]
            return source, subprocess.run(command, capture_output=True, text=True)

        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(compile_one, sources))
    failed = 0
    for source, result in results:
        status = "ok" if result.returncode == 0 else "FAILED"
        print(f"check_cuda: {source.relative_to(CSRC.parent)}: {status}")
        if result.returncode != 0:
            failed += 1
            print(result.stdout + result.stderr, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
