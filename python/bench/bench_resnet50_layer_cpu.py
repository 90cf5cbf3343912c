#!/usr/bin/env python3
"""CPU seconds of gradcomp's C++ in the DDP hooks at ResNet-50 size, in one process
(docs/python.md, "Hook overhead"): compares builds of gradcomp._core (SIMD or not)
without the noise of a loaded machine's wall clock.

    python python/bench/bench_resnet50_layer_cpu.py                 # every hook's codec, 2 ranks, 6 steps
    python python/bench/bench_resnet50_layer_cpu.py --hooks qsgd,two_bit --steps 4

The hooks' C++ object (``gradcomp._core.DDPBuckets``, made with the same plan
options as ``gradcomp.torch``'s states, see bench_hook_overhead.make_state) for
each of ``--ranks`` ranks, all in this process; ResNet-50's 161 parameters in
torchvision's shapes grouped like DDP's default buckets (reverse order, 25 MB);
random gradients. The process group is emulated: sum and max rounds are reduced
with numpy (16-bit cells through torch's 16-bit types, int32 words as int32,
as gradcomp.torch does), all-gather rounds hand every rank's array to every rank.
Only the C++ calls (begin, complete, finish: checks, encodes, absorbs, decodes,
the mean, GradiVeQ's fit) are timed, with ``time.process_time`` (CPU time of
this single-threaded process, so other processes' load changes it little).
Prints per codec the CPU ms per rank and step (the mean over steps 2..N, as
bench_hook_overhead.py resnet50 does) and RESULT
torch_ddp_resnet50_gradcomp_<hook>_cpu_ms; ``_core.simd`` / ``_core.abi_tag``
say which build ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hook_overhead import HOOKS, _Params, ddp_buckets, make_state, resnet50_shapes  # noqa: E402

_DTYPE_16 = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def reduce_round(op, element, arrays):
    """What the process group's all_reduce leaves in every rank's array (in place)."""
    if element == "int32_words":
        total = np.zeros(arrays[0].shape, np.int64)
        for a in arrays:
            total += a.view(np.int32)
        total = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)  # int32 wrap-around
        for a in arrays:
            a.view(np.int32)[:] = total
        return
    if element in _DTYPE_16:
        ts = [torch.from_numpy(a).to(_DTYPE_16[element]) for a in arrays]
        total = ts[0].clone()
        for t in ts[1:]:
            total = total + t if op == "sum" else torch.maximum(total, t)
        total = total.to(torch.float32).numpy()
    elif op == "sum":
        total = np.sum(arrays, axis=0, dtype=np.float32)
    else:
        total = np.max(arrays, axis=0)
    for a in arrays:
        a[:] = total


def run(codec, ranks, steps, seed=0):
    import gradcomp._core as core
    model = _Params(resnet50_shapes())
    names = {id(p): n for n, p in model.named_parameters()}
    state = make_state(codec, model, gradiveq_schedule=(1, 3, 200), powersgd_start=2)
    buckets = ddp_buckets(list(model.parameters()))
    exs = [core.DDPBuckets(state._plan_options, seed, r, ranks, state._matrix_view) for r in range(ranks)]
    ids = [[ex.bucket([names[id(p)] for p in b.parameters()], [list(p.shape) for p in b.parameters()])
            for b in buckets] for ex in exs]
    g = np.random.default_rng(1)
    grads = [[(g.standard_normal(b.buffer().numel()) * 1e-2).astype(np.float32) for b in buckets]
             for _ in range(ranks)]
    cpu = []
    for _ in range(steps):
        spent = 0.0
        for bi in range(len(buckets)):
            flats = [grads[r][bi].copy() for r in range(ranks)]
            t = time.process_time()
            reqs = [exs[r].begin(ids[r][bi], flats[r]) for r in range(ranks)]
            spent += time.process_time() - t
            while reqs[0]:
                gathered = None
                for j in range(len(reqs[0])):
                    op, element, _ = reqs[0][j]
                    arrays = [reqs[r][j][2] for r in range(ranks)]
                    if op == "all_gather":
                        gathered = [a.copy() for a in arrays]
                    else:
                        reduce_round(op, element, arrays)
                t = time.process_time()
                reqs = [exs[r].complete(gathered) for r in range(ranks)]
                spent += time.process_time() - t
            t = time.process_time()
            failed = [exs[r].finish(flats[r]) for r in range(ranks)]
            spent += time.process_time() - t
            assert all(f is None for f in failed), failed
        cpu.append(spent / ranks)
    return cpu, sorted(set(exs[0].phases().values()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hooks", default=",".join(HOOKS))
    args = ap.parse_args()
    import gradcomp._core as core
    torch.set_num_threads(1)
    t0 = time.time()
    load0 = os.getloadavg()[0]
    print(f"gradcomp._core: simd {getattr(core, 'simd', 'unknown (a build before _core.simd)')}, abi "
          f"{getattr(core, 'abi_tag', '?')}; {args.ranks} ranks in one process, {args.steps} steps, "
          f"ResNet-50's 25,557,032 floats in DDP's 25 MB buckets")
    print(f"{'hook':12s} {'CPU ms per rank and step (steps 2..N)':>38s}  per step; phases of the last step")
    for name in [h for h in args.hooks.split(",") if h]:
        cpu, phases = run(name, args.ranks, args.steps)
        mean = 1000 * float(np.mean(cpu[1:])) if len(cpu) > 1 else 1000 * cpu[0]
        print(f"{name:12s} {mean:38.1f}  [{', '.join(f'{1000 * c:.0f}' for c in cpu)}] {phases}")
        print(f"RESULT torch_ddp_resnet50_gradcomp_{name}_cpu_ms {mean:.1f}")
    print(f"load {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
