"""The avx512 and avx512bf16 paths of the native library on a CPU without AVX-512: mgk.c built with
-DMGK_EMULATE_AVX512 runs them on native/mgk_avx512_emu.h's scalar intrinsics (compiled for AVX2+FMA), and the
native tests (every ISA path's products, bf16 against the numpy emulation, a training step) run again on that
build, in a child pytest with MINIGPT_NATIVE_LIB pointing at it. A CPU with AVX-512 runs these paths for real in
those tests themselves; this file is for the sessions that land on one without (the amx path has its own tile
emulation, in tests/test_bf16.py)."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "native")
CC = os.environ.get("CC", "gcc")
# the native tests that cover products and whole steps on every path (the non-matmul ops' avx512 copies are the
# same C as their avx2 ones in this build, so tests/test_native_ops.py would add nothing here)
TESTS = ["tests/test_native_isa.py", "tests/test_bf16.py", "tests/test_kernels.py", "tests/test_ops.py"]


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(l.split(":")[1].split()) for l in f if l.startswith("flags")), set())
    except OSError:
        return set()


if shutil.which(CC) is None:
    pytest.skip(f"no C compiler ({CC}) to build the emulated library", allow_module_level=True)
if not {"avx2", "fma"} <= _cpu_flags():
    pytest.skip("the emulated AVX-512 build runs on AVX2+FMA, which this CPU lacks", allow_module_level=True)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """Path of the library built with the AVX-512 intrinsics emulated (flags as setup.py's, plus the macro)."""
    out = str(tmp_path_factory.mktemp("emu") / "libmgk_emu.so")
    sources = [os.path.join(NATIVE, f) for f in ("mgk.c", "mgk_pool.c", "mgk_ops.c", "mgk_attention.c")]
    cmd = [CC, "-O2", "-std=gnu11", "-fno-math-errno", "-pthread", "-fPIC", "-shared", "-Wno-psabi",
           "-DMGK_EMULATE_AVX512", "-I" + NATIVE, "-o", out] + sources
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_the_build_has_no_avx512_instruction_and_reports_both_paths(emulated):
    lib = ctypes.CDLL(emulated)
    lib.mgk_isa_name.restype = ctypes.c_char_p
    assert lib.mgk_cpu_isa() == 3                                    # MGK_ISA_AVX512BF16, and no amx
    assert [lib.mgk_isa_name(i) for i in range(5)] == [b"generic", b"avx2", b"avx512", b"avx512bf16", b"?"]
    if shutil.which("objdump"):                                      # binutils: no zmm register anywhere
        text = subprocess.run(["objdump", "-d", emulated], capture_output=True, text=True).stdout
        assert "%zmm" not in text and "vdpbf16ps" not in text


def test_native_tests_pass_on_the_emulated_avx512_paths(emulated):
    env = dict(os.environ, MINIGPT_NATIVE_LIB=emulated, MINIGPT_ISA="avx512bf16")   # the default path too
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    passed = re.findall(r"^(\S+) PASSED", done.stdout, re.M)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for path in ("avx512", "avx512bf16"):                           # each path's product tests ran and passed
        ran = [t for t in passed if re.search(rf"[\[:-]{path}[\]-]", t)]
        assert len(ran) >= 6, (path, ran)
