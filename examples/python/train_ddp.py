#!/usr/bin/env python3
"""Fashion-MNIST on the small ResNet of examples/train, trained by N gloo processes
(torch.multiprocessing, localhost) with DistributedDataParallel, once per comm hook:
PyTorch's plain all-reduce, fp16_compress_hook, bf16_compress_hook and powerSGD_hook,
and every gradcomp hook (dense, gradiveq, qsgd, two_bit, top_k, powersgd, fp16, bf16,
homomorphic) side by side.

Prints a table (test accuracy, bytes per step and worker, compression ratio against
float32, step time, the gradcomp hook's own time per step and its share of the step),
writes a CSV and (with gnuplot) a PNG, and RESULT lines: torch_ddp_<hook>_accuracy,
_ratio, _step_ms (gradcomp's: _overhead_share), torch_ddp_gradcomp_hook_failures and
torch_ddp_powersgd_builtin_failures (failed runs of the built-in PowerSGD hook). The
failure rates over many runs come from python/bench/bench_ddp_failures.py.

    python examples/python/train_ddp.py                         # 300 steps; Debian: apt-get install dataset-fashion-mnist
    python examples/python/train_ddp.py --full                  # examples/train's --full length: 10 epochs of 60000 images
    python examples/python/train_ddp.py --steps 5 --synthetic   # no data set: random images (a smoke run)

--full trains 10 epochs of the 60000 images (N x batch images a step) with
examples/train's --full GradiVeQ schedule (warm-up 500, L_t 100, L_c 400) and
evaluates on the 10000 test images; the learning rate stays constant (examples/train
warms up and decays it) and GradiVeQ is the paper's recipe (the binding does not expose
gradiveq_plus's pool and hold-out options).

Bytes per step: gradcomp's hooks count what each rank hands to the process group
(padding of the all-gather included); for PyTorch's hooks the count is computed
from the parameter shapes (float32 all-reduce 4 B/element, fp16/bf16 2 B,
PowerSGD (n + m) * rank floats per matrix and the vectors dense, after its
start iteration). A built-in hook that this torch does not support on gloo is
reported as unsupported, not as a failure.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

GRADCOMP_HOOKS = ["gradcomp_dense", "gradcomp_gradiveq", "gradcomp_qsgd", "gradcomp_two_bit", "gradcomp_top_k",
                  "gradcomp_powersgd", "gradcomp_fp16", "gradcomp_bf16", "gradcomp_homomorphic"]
BUILTIN_HOOKS = ["allreduce", "fp16", "bf16", "powersgd"]


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(4, cout)
        self.shortcut = None
        if cin != cout or stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(4, cout))

    def forward(self, x):
        y = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class SmallResNet(nn.Module):
    """examples/train/model.hpp's small ResNet."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, 2, 1, bias=False)
        self.stem_norm = nn.GroupNorm(4, 16)
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.stem_norm(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def load_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_data(args):
    if args.synthetic:
        g = np.random.default_rng(0)
        return (g.integers(0, 255, (2048, 28, 28), dtype=np.uint8), g.integers(0, 10, 2048, dtype=np.uint8),
                g.integers(0, 255, (512, 28, 28), dtype=np.uint8), g.integers(0, 10, 512, dtype=np.uint8))
    d = Path(args.data_dir)
    return (load_idx(d / "train-images-idx3-ubyte.gz"), load_idx(d / "train-labels-idx1-ubyte.gz"),
            load_idx(d / "t10k-images-idx3-ubyte.gz"), load_idx(d / "t10k-labels-idx1-ubyte.gz"))


def to_tensor(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(images.astype(np.float32) / 255.0) - 0.2860).div(0.3530).unsqueeze(1)


def make_hook(name, model, args):
    """(state, hook, start step of compression) for a hook name; raises NotImplementedError when unsupported."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "allreduce":
        return None, None, 0
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook, 0
    if name == "bf16":
        if not hasattr(default_hooks, "bf16_compress_hook"):
            raise NotImplementedError("this torch has no bf16_compress_hook")
        import gradcomp.torch as gt
        if not gt.supports_all_reduce(torch.bfloat16):  # a collective: every rank asks
            raise NotImplementedError(f"gloo on torch {torch.__version__} cannot all_reduce bfloat16")
        return None, default_hooks.bf16_compress_hook, 0
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=args.powersgd_start, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook, args.powersgd_start
    import gradcomp.torch as gt
    codec = name[len("gradcomp_"):]
    if codec == "dense":
        return gt.DenseState(model), gt.hook, 0
    if codec == "gradiveq":
        warm, lt = args.gradiveq_warmup, args.gradiveq_sampling
        state = gt.GradiVeQState(model, warmup_iterations=warm, sampling_iterations=lt,
                                 compressed_iterations=args.gradiveq_compressed)
        return state, gt.hook, warm
    if codec == "qsgd":
        return gt.QSGDState(model, bits=4), gt.hook, 0
    if codec == "two_bit":
        return gt.TwoBitState(model, auto_scale=1.0), gt.hook, 0
    if codec == "top_k":
        return gt.TopKState(model, ratio_percent=1.0), gt.hook, 0
    if codec == "powersgd":  # the same rank and start as the built-in powersgd row
        return gt.PowerSGDState(model, rank=args.powersgd_rank, start_iter=args.powersgd_start), gt.hook, \
            args.powersgd_start
    if codec == "fp16":
        return gt.FP16State(model), gt.hook, 0
    if codec == "bf16":
        if not gt.supports_all_reduce(torch.bfloat16):  # a collective: every rank asks
            raise NotImplementedError(f"gloo on torch {torch.__version__} cannot all_reduce bfloat16")
        return gt.BF16State(model), gt.hook, 0
    if codec == "homomorphic":
        return gt.HomomorphicState(model), gt.hook, 0
    raise ValueError(name)


def builtin_bytes(name, model, args, steps):
    """Bytes per step and worker handed to the collectives by PyTorch's hooks (from the shapes)."""
    n = sum(p.numel() for p in model.parameters())
    if name == "allreduce":
        return 4.0 * n
    if name in ("fp16", "bf16"):
        return 2.0 * n
    compressed = 0
    for p in model.parameters():
        if p.dim() > 1:
            rows, cols = p.shape[0], p.numel() // p.shape[0]
            r = min(args.powersgd_rank, rows, cols)
            compressed += 4 * (rows + cols) * r
        else:
            compressed += 4 * p.numel()
    start = min(args.powersgd_start, steps)
    return (start * 4.0 * n + (steps - start) * compressed) / steps


def worker(rank, world, port, name, args, data, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    result = {"hook": name, "rank": rank}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
        train_x, train_y, test_x, test_y = data
        torch.manual_seed(args.seed)
        model = SmallResNet()
        ddp = DDP(model)
        state, hook, _ = make_hook(name, model, args)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        g = torch.Generator().manual_seed(args.seed * 1000 + rank)
        times = []
        for step in range(args.steps):
            idx = torch.randint(0, len(train_y), (args.batch,), generator=g).numpy()
            x, y = to_tensor(train_x[idx]), torch.from_numpy(train_y[idx].astype(np.int64))
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            if rank == 0 and args.progress and (step + 1) % args.progress == 0:
                print(f"  {name}: step {step + 1}/{args.steps}", flush=True)
        model.eval()
        with torch.no_grad():
            n = min(args.eval, len(test_y))
            logits = torch.cat([model(to_tensor(test_x[i:i + 500])) for i in range(0, n, 500)])
            acc = float((logits[:n].argmax(1) == torch.from_numpy(test_y[:n].astype(np.int64))).float().mean())
        result.update(ok=True, accuracy=acc, step_ms=1000 * float(np.median(times)),
                      step_mean_ms=1000 * float(np.mean(times)))
        if name.startswith("gradcomp_"):
            result["bytes_per_step"] = state.stats["bytes_sent"] / args.steps
            result["hook_ms"] = 1000 * state.overhead()["own"] / args.steps  # encode, decode, Python; no waits
        else:
            result["bytes_per_step"] = builtin_bytes(name, model, args, args.steps)
    except NotImplementedError as e:
        result.update(ok=False, unsupported=str(e))
    except BaseException as e:  # noqa: BLE001 - a failed run is counted, not fatal
        result.update(ok=False, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=3))
    queue.put(result)
    try:
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        pass


def run_hook(name, args, data):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=worker, args=(r, args.workers, port, name, args, data, queue))
             for r in range(args.workers)]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + args.timeout
    while len(results) < args.workers and time.monotonic() < deadline:
        try:
            results.append(queue.get(timeout=1))
        except Exception:  # noqa: BLE001 - queue.Empty
            if not any(p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--eval", type=int, default=2000, help="test images evaluated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hooks", default=",".join(BUILTIN_HOOKS + GRADCOMP_HOOKS))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--synthetic", action="store_true", help="random images instead of Fashion-MNIST")
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--powersgd-start", type=int, default=10)
    ap.add_argument("--gradiveq-warmup", type=int, default=20)
    ap.add_argument("--gradiveq-sampling", type=int, default=10)
    ap.add_argument("--gradiveq-compressed", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per hook run")
    ap.add_argument("--progress", type=int, default=0, help="print every N steps (rank 0)")
    ap.add_argument("--out", default="train_ddp_out", help="folder of the CSV and PNG")
    ap.add_argument("--full", action="store_true",
                    help="10 epochs of the 60000 images, GradiVeQ 500/100/400, 10000 test images (long)")
    args = ap.parse_args()
    if args.full:
        args.steps = 10 * 60000 // (args.workers * args.batch)
        args.eval = 10000
        args.gradiveq_warmup, args.gradiveq_sampling, args.gradiveq_compressed = 500, 100, 400
    data = load_data(args)
    hooks = [h for h in args.hooks.split(",") if h]
    print(f"torch {torch.__version__}, {args.workers} gloo workers, {args.steps} steps of {args.batch} per worker")
    rows = []
    gradcomp_failures = powersgd_failures = 0
    for name in hooks:
        t0 = time.perf_counter()
        results = run_hook(name, args, data)
        print(f"{name:18s} ran in {time.perf_counter() - t0:.0f} s", flush=True)
        ok = [r for r in results if r.get("ok")]
        unsupported = [r for r in results if r.get("unsupported")]
        if unsupported:
            print(f"{name:18s} unsupported: {unsupported[0]['unsupported']}")
            continue
        if len(ok) != args.workers:
            err = next((r.get("error") for r in results if r.get("error")), "a worker did not report")
            print(f"{name:18s} FAILED: {err}")
            gradcomp_failures += name.startswith("gradcomp_")
            powersgd_failures += name == "powersgd"
            continue
        r0 = ok[0]
        rows.append({"hook": name, "accuracy": float(np.mean([r["accuracy"] for r in ok])),
                     "bytes_per_step": r0["bytes_per_step"], "step_ms": float(np.mean([r["step_ms"] for r in ok])),
                     "step_mean_ms": float(np.mean([r["step_mean_ms"] for r in ok])),
                     "hook_ms": float(np.mean([r["hook_ms"] for r in ok])) if "hook_ms" in r0 else None})
    if not rows:
        sys.exit("no hook completed")
    dense = 4.0 * sum(p.numel() for p in SmallResNet().parameters())
    print(f"\n{'hook':20s} {'accuracy':>9s} {'bytes/step':>11s} {'ratio':>7s} {'step ms':>8s} {'own ms':>7s} "
          f"{'share':>6s}   (own: the gradcomp hook's encode, decode and Python, mean per step, waits excluded; "
          f"share: of the mean step; step ms: median)")
    for r in rows:
        r["ratio"] = dense / r["bytes_per_step"]
        own = f"{r['hook_ms']:7.2f} {100 * r['hook_ms'] / r['step_mean_ms']:5.1f}%" if r["hook_ms"] is not None \
            else f"{'-':>7s} {'-':>6s}"
        print(f"{r['hook']:20s} {100 * r['accuracy']:8.2f}% {r['bytes_per_step']:11.0f} {r['ratio']:6.2f}x "
              f"{r['step_ms']:8.2f} {own}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train_ddp.csv", "w") as f:
        f.write("hook,accuracy,bytes_per_step,ratio,step_ms\n")
        for i, r in enumerate(rows):
            f.write(f"{r['hook']},{r['accuracy']:.6f},{r['bytes_per_step']:.1f},{r['ratio']:.4f},{r['step_ms']:.3f}\n")
    if shutil.which("gnuplot"):
        script = (f"set terminal png size 900,500 noenhanced; set output '{out / 'train_ddp.png'}';"
                  "set datafile separator ','; set style data histograms; set style fill solid 0.6;"
                  "set ylabel 'test accuracy (%)'; set y2label 'compression ratio'; set y2tics; set ytics nomirror;"
                  "set xtics rotate by -30; set key top left;"
                  f"plot '{out / 'train_ddp.csv'}' every ::1 using ($2*100):xtic(1) title 'accuracy',"
                  " '' every ::1 using 0:4 axes x1y2 with linespoints title 'ratio'")
        subprocess.run(["gnuplot", "-e", script], check=False)
    for r in rows:
        print(f"RESULT torch_ddp_{r['hook']}_accuracy {r['accuracy']:.4f}")
        print(f"RESULT torch_ddp_{r['hook']}_ratio {r['ratio']:.3f}")
        print(f"RESULT torch_ddp_{r['hook']}_step_ms {r['step_ms']:.2f}")
        if r["hook_ms"] is not None:
            print(f"RESULT torch_ddp_{r['hook']}_overhead_share {r['hook_ms'] / r['step_mean_ms']:.4f}")
    print(f"RESULT torch_ddp_gradcomp_hook_failures {gradcomp_failures}")
    if "powersgd" in hooks:
        print(f"RESULT torch_ddp_powersgd_builtin_failures {powersgd_failures}")


if __name__ == "__main__":
    main()
