"""The failure harness of python/bench/bench_ddp_failures.py, a few runs: gradcomp's hooks never fail.

The bench runs 50 (2 ranks) and 20 (4 ranks) runs per hook and PyTorch's built-in hooks beside
them (their failures are measured there, never asserted here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_ddp_failures as bench  # noqa: E402


def _check(results, hooks):
    for hook in hooks:
        rec = results[hook]
        if rec["unsupported"]:  # BF16State where gloo cannot sum bfloat16 (torch 1.13)
            assert hook == "gradcomp_bf16", (hook, rec["unsupported"])
            continue
        assert rec["runs"] > 0
        assert rec["failures"] == 0, f"{hook}: {rec['failures']}/{rec['runs']} runs failed, first: {rec['first_error']}"
        assert min(rec["buckets"]) >= 4, f"{hook}: DDP used only {rec['buckets']} buckets"


def test_gradcomp_hooks_do_not_fail_at_2_ranks(tmp_path):
    results = bench.measure(2, 2, bench.GRADCOMP, str(tmp_path / "workers.log"), progress=False)
    _check(results, bench.GRADCOMP)


def test_gradcomp_hooks_do_not_fail_at_4_ranks(tmp_path):
    hooks = ["gradcomp_two_bit", "gradcomp_powersgd", "gradcomp_homomorphic"]  # all-gather; two sums; max + sum
    results = bench.measure(4, 1, hooks, str(tmp_path / "workers.log"), progress=False)
    _check(results, hooks)
