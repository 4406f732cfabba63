"""Builds the compiled ops ``distrl._C`` (csrc/) with torch's BuildExtension.

Everything else about the package lives in pyproject.toml. The extension is built
against the torch already installed, which is why the install command is
``pip install --no-build-isolation -e .``: build isolation would download a second torch.
The CUDA kernels (csrc/cuda/*.cu) are compiled only where that torch has CUDA and a CUDA
toolkit is found. ``DISTRL_NO_EXTENSION=1`` installs without compiling anything; the
pure-torch reference path then runs (``kernel=auto``) and ``kernel=compiled`` is refused.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent

NO_TORCH = (
    "distrl: setup.py compiles distrl._C against the installed torch, but torch is not "
    "importable. Install torch first (pip install torch), then run "
    "pip install --no-build-isolation -e ."
)

BUILD_FAILED = """
distrl: building the compiled ops distrl._C failed:
    {error}
It needs a C++17 compiler (g++ >= 9 or clang >= 10){cuda}. Either install one and rerun
    pip install --no-build-isolation -e .
or install without the compiled ops (V-trace and the sum tree then run the pure-torch
reference path, kernel=auto; kernel=compiled is refused):
    DISTRL_NO_EXTENSION=1 pip install --no-build-isolation -e .
"""


def extension_modules() -> tuple[list, dict]:
    """The distrl._C extension and the build_ext command, or nothing when switched off."""
    if os.environ.get("DISTRL_NO_EXTENSION", "0") == "1":
        print("distrl: DISTRL_NO_EXTENSION=1, not building distrl._C", file=sys.stderr)
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import (
            CUDA_HOME,
            BuildExtension,
            CppExtension,
            CUDAExtension,
        )
    except ImportError:
        sys.exit(NO_TORCH)

    with_cuda = torch.version.cuda is not None and CUDA_HOME is not None
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))
    compile_args = {"cxx": ["-O3"]}
    if with_cuda:
        sources += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc/cuda").glob("*.cu"))
        compile_args["nvcc"] = ["-O3"]
        extension = CUDAExtension("distrl._C", sources, extra_compile_args=compile_args)
    else:
        extension = CppExtension("distrl._C", sources, extra_compile_args=compile_args)
    print(f"distrl: building distrl._C, CUDA kernels: {with_cuda}", file=sys.stderr)

    class BuildDistrlExtension(BuildExtension):
        """BuildExtension that turns a compiler failure into one actionable message."""

        def run(self) -> None:
            try:
                super().run()
            except Exception as error:  # a missing compiler or a compile error
                cuda = " and the CUDA toolkit matching torch" if with_cuda else ""
                raise SystemExit(BUILD_FAILED.format(error=error, cuda=cuda)) from error

    return [extension], {"build_ext": BuildDistrlExtension}


ext_modules, cmdclass = extension_modules()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
