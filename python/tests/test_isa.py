"""The wheel's instruction-set variants of gradcomp._core (python/CMakeLists.txt, gradcomp/_core.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import gradcomp
from gradcomp import _core

V3 = _core.REQUIRED_FLAGS["x86-64-v3"]
V4 = _core.REQUIRED_FLAGS["x86-64-v4"]
ALL = ("x86-64-v4", "x86-64-v3", "generic")


def test_auto_takes_the_preferred_variant_the_cpu_runs():
    assert _core.select("auto", frozenset(V4), ALL) == "x86-64-v4"
    assert _core.select("auto", frozenset(V3), ALL) == "x86-64-v3"
    assert _core.select("", frozenset(V3) - {"fma"}, ALL) == "generic"
    assert _core.select("auto", frozenset(V4), ("x86-64-v3", "generic")) == "x86-64-v3"  # v4 not built
    assert _core.select("auto", None, ALL) == "generic"  # no /proc/cpuinfo: the baseline only
    assert _core.select("AUTO", frozenset(), ("generic",)) == "generic"


def test_a_forced_variant_is_checked():
    assert _core.select("generic", frozenset(V4), ALL) == "generic"
    assert _core.select(" x86-64-v3 ", frozenset(V4), ALL) == "x86-64-v3"
    with pytest.raises(ImportError, match=r"lacks \(avx512f avx512bw avx512cd avx512dq avx512vl\)"):
        _core.select("x86-64-v4", frozenset(V3), ALL)
    with pytest.raises(ImportError, match="was not built"):
        _core.select("x86-64-v4", frozenset(V4), ("generic",))
    with pytest.raises(ImportError, match="is not one of auto, generic"):
        _core.select("avx9", frozenset(V4), ALL)
    with pytest.raises(ImportError, match="no usable build"):
        _core.select("auto", frozenset(), ())


def test_cpu_flags_reads_the_kernels_list(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nflags\t\t: fpu sse2 avx2 fma\nbugs\t\t: none\n"
                    "processor\t: 1\nflags\t\t: fpu sse2 avx2 fma\n")
    assert _core.cpu_flags(str(info)) == frozenset({"fpu", "sse2", "avx2", "fma"})
    assert _core.cpu_flags(str(tmp_path / "absent")) is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert _core.cpu_flags(str(tmp_path / "arm")) == frozenset()  # no x86 levels: generic


def test_the_imported_variant_is_the_selected_one():
    assert gradcomp.isa in gradcomp.isa_variants
    assert "generic" in gradcomp.isa_variants
    assert _core.select(os.environ.get("GRADCOMP_ISA", "auto"), _core.cpu_flags()) == gradcomp.isa
    tag = _core.abi_tag  # the instruction sets the module was compiled for (include/gradcomp/abi.hpp)
    if gradcomp.isa == "x86-64-v4":
        assert "avx512f" in tag and "fma" in tag
    elif gradcomp.isa == "x86-64-v3":
        assert "avx2" in tag and "fma" in tag and "avx512" not in tag
    else:
        assert "avx" not in tag
    assert isinstance(_core.Error, type) and _core.Error.__module__ == "gradcomp._core"


_STEP = r"""
import hashlib, json, sys, numpy as np, gradcomp
sys.path.insert(0, TESTS)
from test_core import _run_step  # every rank's rounds, reduced as the process group reduces them
m = gradcomp.ModelDescription()
m.add_conv("conv", 16, 8, 3, 3).add_dense("fc", 5000).add_dense("bias", 8, 1)
out = {"isa": gradcomp.isa, "abi": gradcomp._core.abi_tag}
for codec in ("dense", "qsgd", "homomorphic", "gradiveq"):
    plan = gradcomp.Plan(m, {"conv": codec, "fallback": "dense", "small": "dense", "qsgd_bits": 8,
                             "homomorphic_bits": 12, "warmup_iterations": 0, "sampling_iterations": 2,
                             "compressed_iterations": 4})
    layers = [gradcomp.BucketLayer(plan, r, 2) for r in range(2)]
    rng = np.random.default_rng(3)
    for step in range(4):
        grads = [[rng.standard_normal(n).astype(np.float32) for _, n, _ in m.layers] for _ in range(2)]
        want = [np.mean([g[i] for g in grads], axis=0) for i in range(3)]
        _run_step(layers, grads)
        assert all(np.array_equal(a, b) for a, b in zip(grads[0], grads[1])), codec  # both ranks alike
    out[codec] = {"sha": hashlib.sha256(b"".join(g.tobytes() for g in grads[0])).hexdigest(),
                  "err": max(float(np.max(np.abs(a - b))) for a, b in zip(grads[0], want))}
print(json.dumps(out))
"""


def test_every_variant_this_cpu_runs_trains_alike():
    """Each built variant the CPU runs, in a process of its own: 4 steps of dense, QSGD, the homomorphic
    quantizer and GradiVeQ (2 sampling steps, the fit, 2 compressed) at 2 ranks. Dense and QSGD give the same
    bits in every variant; the others are near the true mean in every variant (FMA may change their last bits
    between generic and the FMA variants, never the result's quality)."""
    runnable = [v for v in gradcomp.isa_variants if not _core.missing_flags(v, _core.cpu_flags())]
    assert "generic" in runnable
    results = []
    for v in runnable:
        env = dict(os.environ, GRADCOMP_ISA=v)
        script = _STEP.replace("TESTS", repr(os.path.dirname(os.path.abspath(__file__))))
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        r = json.loads(done.stdout.strip().splitlines()[-1])
        assert r["isa"] == v
        results.append(r)
    # Dense and QSGD (integer levels, a sum of squares in a fixed order) give the same bits in every variant.
    assert len({r["dense"]["sha"] for r in results}) == 1, [r["abi"] for r in results]
    assert len({r["qsgd"]["sha"] for r in results}) == 1, [r["abi"] for r in results]
    for r in results:
        assert r["dense"]["err"] < 1e-6
        assert r["qsgd"]["err"] < 0.5 and r["homomorphic"]["err"] < 0.05, r
        assert 0.0 < r["gradiveq"]["err"] < 10.0, r  # a rank-limited projection of random data: lossy, finite


def test_a_variant_the_cpu_lacks_is_refused_at_import():
    missing = [v for v in ALL if _core.missing_flags(v, _core.cpu_flags())]
    variant = missing[0] if missing else "avx9"
    env = dict(os.environ, GRADCOMP_ISA=variant)
    done = subprocess.run([sys.executable, "-c", "import gradcomp"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "GRADCOMP_ISA" in done.stderr
