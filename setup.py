"""Build script: everything is in setup.cfg except the optional C extension minigpt/_mgk (native/mgk*.c).

_mgk is a plain C library (no Python C-API) that minigpt/backends/native.py loads with ctypes. If it cannot be
compiled (no C compiler, non-GNU toolchain) the install still succeeds with a warning; the "native" backend
then reports itself unavailable with the reason, and "auto" uses numba or numpy.
"""
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# No -march/-ffast-math: each x86 path (AMX, AVX512_BF16, AVX-512, AVX2+FMA) carries a target pragma, generic is
# compiled for the baseline, and the library picks one by cpuid (and a measured rate) at run time, so one build
# runs on any x86-64, and sums stay plain IEEE (fused) multiply-adds.
# -fno-math-errno: sqrtf need not set errno, so loops that call it vectorize (AdamW in mgk_ops.c); no value changes.
MGK = Extension("minigpt._mgk",
                sources=["native/mgk.c", "native/mgk_pool.c", "native/mgk_ops.c", "native/mgk_attention.c"],
                depends=["native/mgk.h", "native/mgk_ops.h", "native/mgk_job.h", "native/mgk_avx512.inc",
                         "native/mgk_avx512bf16.inc", "native/mgk_avx2.inc", "native/mgk_amx_hw.inc",
                         "native/mgk_amx_emu.inc", "native/mgk_gemm_generic.inc", "native/mgk_amx.inc",
                         "native/mgk_small.inc"],
                include_dirs=["native"], extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-fno-math-errno"],
                extra_link_args=["-pthread"])


class OptionalBuildExt(build_ext):
    """Turn a failed compile of the optional C library into a warning."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001  (distutils raises several unrelated types here)
            self._warn(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def get_export_symbols(self, ext):
        return []          # a ctypes library: there is no PyInit__mgk to export

    @staticmethod
    def _warn(e):
        warnings.warn(f"minigpt: the native kernel library was not built ({e}); the 'native' backend "
                      "will be unavailable. Install a C compiler (gcc) and reinstall to enable it.")


setup(ext_modules=[MGK], cmdclass={"build_ext": OptionalBuildExt})
