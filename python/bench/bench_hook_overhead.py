#!/usr/bin/env python3
"""The gradcomp DDP hooks' own overhead (docs/python.md, "Hook overhead").

The hook's own time is everything it spends outside the process group's
collectives: gradcomp's C++ (checks, encodes, absorbs, decodes, the mean, the
GradiVeQ fit, all amortized over the steps run) and the hook's Python (tensor
wrapping, 16-bit conversions). ``state.overhead()`` splits the hook's time into
``comm`` (inside ``dist.all_reduce`` / ``all_gather``) and the rest.

    python python/bench/bench_hook_overhead.py demo        # examples/python's small ResNet, 4 gloo workers
    python python/bench/bench_hook_overhead.py resnet50    # ResNet-50's parameter shapes, 25 MB buckets, 2 workers
    python python/bench/bench_hook_overhead.py gradiveq-phases   # GradiVeQ's own time per phase, --full's schedule

``demo``: every gradcomp hook and PyTorch's plain all-reduce train the small
ResNet of examples/train (random 28x28 images, batch 32 per worker) in one
4-process gloo group (the workers stay alive across hooks). Prints per hook the
step time (mean over the steps after the first 3), the hook's own time per
step and its share of the step, and RESULT torch_ddp_<hook>_step_ms and
torch_ddp_<hook>_overhead_share.

``resnet50``: no model; ResNet-50's parameters (bench/resnet50_model.hpp's
shapes, torchvision's order, 25.6M floats) grouped like DDP's default buckets
(reverse order, 25 MB cap), random gradients each step, the hook called on each
bucket as DDP would. Prints the hook's own time per step (ms) beside a plain
float32 all_reduce of the same buckets, RESULT
torch_ddp_resnet50_<hook>_own_ms and torch_ddp_resnet50_allreduce_ms.

``gradiveq-phases``: the demo model with train_ddp.py --full's GradiVeQ state
(gradiveq_plus: pooled 16 slices, lambda 0.01, QSGD 4-bit sampling; the 1-D
parameters and the fc weight dense), warm-up 5, L_t 150, L_c 100 by default
(--gradiveq-schedule), 256 steps; --gradiveq-max-dimension, --gradiveq-basis-storage,
--gradiveq-sampling-norm, --gradiveq-error-feedback, --gradiveq-spread-sampling and
--gradiveq-fit-sharing select the
variants of train_ddp.py's gradiveq_max hooks: the hook's own time split per phase (the
step that ends L_t runs the PCA fit) and RESULT torch_ddp_gradiveq_fit_ms,
torch_ddp_gradiveq_compressed_own_ms, torch_ddp_gradiveq_sampling_own_ms
(the sampling steps without the fit).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ["dense", "gradiveq", "qsgd", "two_bit", "top_k", "powersgd", "fp16", "bf16", "homomorphic"]


def small_resnet():
    spec = importlib.util.spec_from_file_location("train_ddp", ROOT / "examples" / "python" / "train_ddp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SmallResNet()


def make_state(codec, model, gradiveq_schedule=(20, 10, 200), powersgd_start=10):
    import gradcomp.torch as gt
    warm, lt, lc = gradiveq_schedule
    return {
        "dense": lambda: gt.DenseState(model),
        "gradiveq": lambda: gt.GradiVeQState(model, warmup_iterations=warm, sampling_iterations=lt,
                                             compressed_iterations=lc),
        "qsgd": lambda: gt.QSGDState(model, bits=4),
        "two_bit": lambda: gt.TwoBitState(model, auto_scale=1.0),
        "top_k": lambda: gt.TopKState(model, ratio_percent=1.0),
        "powersgd": lambda: gt.PowerSGDState(model, rank=2, start_iter=powersgd_start),
        "fp16": lambda: gt.FP16State(model),
        "bf16": lambda: gt.BF16State(model),
        "homomorphic": lambda: gt.HomomorphicState(model),
    }[codec]()


def _entry(rank, world, port, fn, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        queue.put((rank, ("ok", fn(rank, world, args))))
    except BaseException as e:  # noqa: BLE001
        queue.put((rank, ("raised", f"{type(e).__name__}: {e}", traceback.format_exc())))


def spawn(world, fn, args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    out = dict(queue.get() for _ in range(world))
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    for r in range(world):
        if out[r][0] != "ok":
            sys.exit(f"rank {r} raised {out[r][1]}\n{out[r][2]}")
    return [out[r][1] for r in range(world)]


# ---- demo model -----------------------------------------------------------------

def demo_batches(rank, batch):
    """The 4 random batches of 28x28 images and labels a rank of the demo benches cycles through."""
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(batch, 1, 28, 28, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,), generator=g) for _ in range(4)]
    return xs, ys


def demo_worker(rank, world, args):
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gradcomp.torch as gt
    xs, ys = demo_batches(rank, args.batch)
    results = {}
    for name in ["allreduce"] + args.hooks:
        if name == "bf16" and not gt.supports_all_reduce(torch.bfloat16):
            results[name] = None
            continue
        torch.manual_seed(1)
        model = small_resnet()
        ddp = DDP(model)
        state = None
        if name != "allreduce":
            state = make_state(name, model)
            ddp.register_comm_hook(state, gt.hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        step_s, own_s = [], []
        for step in range(args.steps):
            before = state.overhead()["own"] if state else 0.0
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(ddp(xs[step % 4]), ys[step % 4]).backward()
            opt.step()
            step_s.append(time.perf_counter() - t0)
            own_s.append(state.overhead()["own"] - before if state else 0.0)
        skip = 3
        ov = state.overhead() if state else None
        results[name] = {"step_ms": 1000 * float(np.mean(step_s[skip:])),
                         "own_ms": 1000 * float(np.mean(own_s[skip:])),
                         "own_all_ms": 1000 * float(np.mean(own_s)),
                         "split": {k: 1000 * v / args.steps for k, v in ov.items()} if ov else None,
                         "bytes": state.stats["bytes_sent"] / args.steps if state else None}
        del ddp, model, state, opt
    return results


def demo(args):
    per_rank = spawn(args.workers, demo_worker, args)
    print(f"torch {torch.__version__}, {args.workers} gloo workers, {args.steps} steps (mean over steps "
          f"{4}..{args.steps}), batch {args.batch} per worker; load {os.getloadavg()[0]:.1f}")
    print(f"{'hook':12s} {'step ms':>8s} {'own ms':>7s} {'share':>6s} {'encode':>7s} {'decode':>7s} "
          f"{'python':>7s} {'comm':>7s}  (own, encode, decode, python, comm: ms per step, every step)")
    for name in ["allreduce"] + args.hooks:
        rows = [r[name] for r in per_rank]
        if rows[0] is None:
            print(f"{name:12s} unsupported on this torch's gloo (bfloat16 all_reduce)")
            continue
        step = float(np.mean([r["step_ms"] for r in rows]))
        own = float(np.mean([r["own_ms"] for r in rows]))
        share = own / step
        line = f"{name:12s} {step:8.2f} {own:7.2f} {100 * share:5.1f}%"
        if rows[0]["split"]:
            sp = {k: float(np.mean([r["split"][k] for r in rows])) for k in rows[0]["split"]}
            line += f" {sp['encode']:7.2f} {sp['decode']:7.2f} {sp['python']:7.2f} {sp['comm']:7.2f}"
        print(line)
        key = name if name == "allreduce" else f"gradcomp_{name}"
        print(f"RESULT torch_ddp_{key}_step_ms {step:.2f}")
        if name != "allreduce":
            print(f"RESULT torch_ddp_{key}_overhead_share {share:.4f}")


# ---- GradiVeQ per phase ------------------------------------------------------------

def gradiveq_phases_worker(rank, world, args):
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gradcomp.torch as gt
    xs, ys = demo_batches(rank, args.batch)
    torch.manual_seed(1)
    model = small_resnet()
    ddp = DDP(model)
    warm, lt, lc = args.gradiveq_schedule
    cap = {"max_dimension": args.gradiveq_max_dimension} if args.gradiveq_max_dimension else {}
    cap["basis_storage"] = args.gradiveq_basis_storage
    cap["sampling_qsgd_norm"] = args.gradiveq_sampling_norm
    cap["error_feedback"] = args.gradiveq_error_feedback
    cap["spread_sampling"] = args.gradiveq_spread_sampling
    cap["fit_sharing"] = args.gradiveq_fit_sharing
    state = gt.GradiVeQState(model, **gt.GRADIVEQ_PLUS, **cap, small="dense", small_below=0, seed=1,
                             warmup_iterations=warm, sampling_iterations=lt, compressed_iterations=lc,
                             options={"fallback": "dense"})
    ddp.register_comm_hook(state, gt.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    rows = []
    for step in range(args.steps):
        before = state.overhead()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(xs[step % 4]), ys[step % 4]).backward()
        opt.step()
        after = state.overhead()
        phase = [p for p in sorted(set(state.phases().values())) if p.startswith("gradiveq")]
        rows.append({"phase": phase[0] if phase else "?", "step": time.perf_counter() - t0,
                     "eq7": state.relative_compression_loss(),  # this step's eq. 7 (L_c steps only)
                     **{k: after[k] - before[k] for k in ("own", "encode", "decode", "python")}})
    return rows


def gradiveq_phases(args):
    per_rank = spawn(args.workers, gradiveq_phases_worker, args)
    warm, lt, lc = args.gradiveq_schedule
    print(f"torch {torch.__version__}, {args.workers} gloo workers, demo model, gradiveq_plus warm-up {warm}, "
          f"L_t {lt}, L_c {lc}, {args.steps} steps; load {os.getloadavg()[0]:.1f}; ms per step, mean over ranks")
    print(f"{'phase':26s} {'steps':>5s} {'step':>7s} {'own':>7s} {'encode':>7s} {'decode':>7s} {'python':>7s}")
    # the fit runs inside the last step that reports a sampling phase (its hook ends L_t)
    fit_steps = [i - 1 for i in range(1, args.steps) if per_rank[0][i - 1]["phase"].startswith("gradiveq:sampling")
                 and not per_rank[0][i]["phase"].startswith("gradiveq:sampling")]
    if args.gradiveq_spread_sampling:  # from cycle 2 the sampling steps interleave; the refit ends each cycle
        cycle = lt + lc
        fit_steps = [warm + lt - 1] + list(range(warm + 2 * cycle - 1, args.steps, cycle))
    groups = {}
    for i, row in enumerate(per_rank[0]):
        key = "fit (the step ending L_t)" if i in fit_steps else row["phase"]
        groups.setdefault(key, []).append(i)
    means = {}
    for key, steps in groups.items():
        m = {k: 1000 * float(np.mean([r[i][k] for r in per_rank for i in steps]))
             for k in ("step", "own", "encode", "decode", "python")}
        means[key] = m
        print(f"{key:26s} {len(steps):5d} {m['step']:7.1f} {m['own']:7.2f} {m['encode']:7.2f} {m['decode']:7.2f} "
              f"{m['python']:7.2f}")
    eq7 = [row["eq7"] for r in per_rank for row in r if row["eq7"] is not None]
    if eq7:
        print(f"eq. 7 relative loss in L_c (the share of a rank's gradient energy the basis leaves out): mean "
              f"{np.mean(eq7):.3f} over {len(eq7)} rank-steps, range {min(eq7):.3f}-{max(eq7):.3f}")
    if "fit (the step ending L_t)" in means:
        print(f"RESULT torch_ddp_gradiveq_fit_ms {means['fit (the step ending L_t)']['own']:.1f} ms")
    if "gradiveq:compressed" in means:
        print(f"RESULT torch_ddp_gradiveq_compressed_own_ms {means['gradiveq:compressed']['own']:.2f} ms")
    if "gradiveq:sampling-qsgd" in means:
        print(f"RESULT torch_ddp_gradiveq_sampling_own_ms {means['gradiveq:sampling-qsgd']['own']:.2f} ms")


# ---- ResNet-50-sized buckets ----------------------------------------------------

def resnet50_shapes():
    """bench/resnet50_model.hpp's layers, in torchvision's shapes and order."""
    out = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    inp = 64
    for li, (blocks, w) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            p = f"layer{li + 1}.{b}"
            out += [(f"{p}.conv1.weight", (w, inp, 1, 1)), (f"{p}.bn1.weight", (w,)), (f"{p}.bn1.bias", (w,)),
                    (f"{p}.conv2.weight", (w, w, 3, 3)), (f"{p}.bn2.weight", (w,)), (f"{p}.bn2.bias", (w,)),
                    (f"{p}.conv3.weight", (4 * w, w, 1, 1)), (f"{p}.bn3.weight", (4 * w,)),
                    (f"{p}.bn3.bias", (4 * w,))]
            if b == 0:
                out += [(f"{p}.downsample.0.weight", (4 * w, inp, 1, 1)), (f"{p}.downsample.1.weight", (4 * w,)),
                        (f"{p}.downsample.1.bias", (4 * w,))]
            inp = 4 * w
    out += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return out


class _Params(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        for name, shape in shapes:
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.zeros(shape)))


class FakeBucket:
    """What the hooks read of DDP's GradBucket: buffer(), parameters(), index()."""

    def __init__(self, index, params):
        self._index, self._params = index, params
        self._buffer = torch.zeros(sum(p.numel() for p in params))

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def index(self):
        return self._index


def ddp_buckets(params, cap_bytes=25 * 1024 * 1024):
    """DDP's default grouping: parameters in reverse order, buckets of at most `cap_bytes`."""
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        if cur and size + 4 * p.numel() > cap_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += 4 * p.numel()
    if cur:
        buckets.append(cur)
    return [FakeBucket(i, b) for i, b in enumerate(buckets)]


def resnet50_worker(rank, world, args):
    import gradcomp.torch as gt
    model = _Params(resnet50_shapes())
    params = list(model.parameters())
    buckets = ddp_buckets(params)
    g = torch.Generator().manual_seed(rank)
    grads = [torch.randn(b.buffer().numel(), generator=g) * 1e-2 for b in buckets]
    # the reference: a plain float32 all_reduce of the same buckets
    ref = []
    for _ in range(3):
        t0 = time.perf_counter()
        for b, gr in zip(buckets, grads):
            b.buffer().copy_(gr)
            dist.all_reduce(b.buffer())
        ref.append(time.perf_counter() - t0)
    results = {"buckets": [b.buffer().numel() for b in buckets], "allreduce_ms": 1000 * float(np.median(ref))}
    for name in args.hooks:
        if name == "bf16" and not gt.supports_all_reduce(torch.bfloat16):
            results[name] = None
            continue
        # GradiVeQ and PowerSGD: short starts so that the run reaches their compressed steps
        state = make_state(name, model, gradiveq_schedule=(1, 3, 200), powersgd_start=2)
        own, phases = [], []
        for step in range(args.steps):
            before = state.overhead()["own"]
            for b, gr in zip(buckets, grads):
                b.buffer().copy_(gr)  # not timed: DDP's backward fills the bucket
                gt.hook(state, b).wait()
            own.append(state.overhead()["own"] - before)
            phases.append(sorted(set(state.phases().values())))
        results[name] = {"own_ms": [1000 * x for x in own], "phases": phases,
                         "bytes": state.stats["bytes_sent"] / args.steps}
        del state
    return results


def resnet50(args):
    per_rank = spawn(args.workers, resnet50_worker, args)
    r0 = per_rank[0]
    n = sum(r0["buckets"])
    print(f"torch {torch.__version__}, {args.workers} gloo workers, ResNet-50's {n} floats in {len(r0['buckets'])} "
          f"buckets of at most 25 MB ({r0['buckets']}), {args.steps} steps; load {os.getloadavg()[0]:.1f}")
    ar = float(np.mean([r["allreduce_ms"] for r in per_rank]))
    print(f"plain float32 all_reduce of the buckets: {ar:.1f} ms per step")
    print(f"RESULT torch_ddp_resnet50_allreduce_ms {ar:.1f}")
    print(f"{'hook':12s} {'own ms/step':>12s} {'first step':>11s} {'max':>9s}  phases of the last step")
    for name in args.hooks:
        if r0[name] is None:
            print(f"{name:12s} unsupported on this torch's gloo")
            continue
        own = np.mean([r[name]["own_ms"] for r in per_rank], axis=0)
        mean = float(np.mean(own[1:])) if len(own) > 1 else float(own[0])
        print(f"{name:12s} {mean:12.1f} {own[0]:11.1f} {own.max():9.1f}  {r0[name]['phases'][-1]}")
        print(f"RESULT torch_ddp_resnet50_gradcomp_{name}_own_ms {mean:.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["demo", "resnet50", "gradiveq-phases"])
    ap.add_argument("--workers", type=int, default=None, help="default: 4 (demo), 2 (resnet50)")
    ap.add_argument("--steps", type=int, default=None, help="default: 40 (demo), 6 (resnet50)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hooks", default=",".join(HOOKS))
    ap.add_argument("--gradiveq-schedule", default="5,150,100", help="gradiveq-phases: warm-up,L_t,L_c")
    ap.add_argument("--gradiveq-max-dimension", type=int, default=0,
                    help="gradiveq-phases: cap on each layer's d (GradiVeQState max_dimension; 0: none)")
    ap.add_argument("--gradiveq-basis-storage", choices=["float32", "float16", "int8"], default="float32",
                    help="gradiveq-phases: GradiVeQState basis_storage (float16: the basis rounded to binary16; int8: each column to int8 times a power of two)")
    ap.add_argument("--gradiveq-sampling-norm", choices=["l2", "max"], default="l2",
                    help="gradiveq-phases: GradiVeQState sampling_qsgd_norm (max: train_ddp.py's gradiveq_max)")
    ap.add_argument("--gradiveq-error-feedback", action="store_true",
                    help="gradiveq-phases: GradiVeQState error_feedback")
    ap.add_argument("--gradiveq-fit-sharing", choices=["none", "host"], default="none",
                    help="gradiveq-phases: GradiVeQState fit_sharing (host: each basis fitted once by the host's ranks)")
    ap.add_argument("--gradiveq-spread-sampling", action="store_true",
                    help="gradiveq-phases: GradiVeQState spread_sampling (the fit then ends each cycle)")
    args = ap.parse_args()
    args.gradiveq_schedule = tuple(int(x) for x in args.gradiveq_schedule.split(","))
    args.hooks = [h for h in args.hooks.split(",") if h]
    if args.what == "gradiveq-phases":
        args.workers = args.workers or 4
        args.steps = args.steps or 256
        gradiveq_phases(args)
    elif args.what == "demo":
        args.workers = args.workers or 4
        args.steps = args.steps or 40
        demo(args)
    else:
        args.workers = args.workers or 2
        args.steps = args.steps or 6
        resnet50(args)


if __name__ == "__main__":
    main()
