"""gradcomp.torch's hooks on CUDA buckets (docs/python.md, "CUDA tensors"); skipped without a GPU.

The hooks copy a CUDA bucket to host memory, run gradcomp's CPU code and move the rounds as CPU
tensors through gloo, then copy the mean back. So a CUDA bucket must give bit for bit what the same
values give as a CPU bucket, every step, for every codec."""

from __future__ import annotations

import pytest
import torch

import ddp_harness as h
import workers

CODECS = ["dense", "gradiveq", "qsgd", "two_bit", "top_k", "powersgd", "fp16", "bf16", "homomorphic"]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_the_twin_harness_on_cpu_buckets():
    """The harness of the CUDA test on CPU buckets (runs everywhere): a twin state on a host copy of
    every bucket gives the hook's own result bit for bit, so a difference on CUDA is the device path's."""
    codecs = ["dense", "gradiveq", "powersgd"]
    per_rank = h.unwrap(h.spawn(2, workers.cuda_against_host, codecs, 6, "cpu"))
    for codec in codecs:
        results = [r[codec] for r in per_rank]
        for res in results:
            assert res["devices"] == ["cpu"] and res["buckets"] >= 3 * 6 and not res["differing"], (codec, res)
        assert len({r["digest"] for r in results}) == 1, codec


@needs_cuda
def test_cuda_buckets_give_the_host_result_bit_for_bit():
    per_rank = h.unwrap(h.spawn(2, workers.cuda_against_host, CODECS))
    for codec in CODECS:
        results = [r[codec] for r in per_rank]
        if isinstance(results[0], str):  # a 16-bit dtype gloo cannot sum on this torch version
            assert results[0].startswith("unsupported") and all(r == results[0] for r in results)
            print(f"{codec:11s}: {results[0]}")
            continue
        for rank, res in enumerate(results):
            assert res["devices"] == ["cuda"], f"{codec} rank {rank}: the hook returned {res['devices']} buffers"
            assert res["buckets"] >= 3 * 8, f"{codec} rank {rank}: only {res['buckets']} hook calls"
            assert not res["differing"], f"{codec} rank {rank}: buckets {res['differing']} differ from the host run"
        assert len({r["digest"] for r in results}) == 1, f"{codec}: ranks ended with different weights"
        print(f"{codec:11s}: {results[0]['buckets']} CUDA buckets equal to their host copies, phases {results[0]['phases']}")

