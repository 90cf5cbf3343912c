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
    python examples/python/train_ddp.py --steps 5 --synthetic   # no data set: random images (a smoke run)
    python examples/python/train_ddp.py --full --seed 1 --hooks allreduce,gradcomp_gradiveq,powersgd
    python examples/python/train_ddp.py --summary               # the --full grid so far (mean of 2 seeds), RESULT lines

The short run (default 300 steps) samples batches at random, keeps the learning rate
constant (--lr) and uses short codec schedules (GradiVeQ 20/10/200, PowerSGD start 10).

--full follows examples/train's --full run (examples/train/README.md, main.cpp,
config.cpp): all 60000 images cut into N shards (worker r holds every N-th image),
each reshuffled every epoch, 10 epochs of 15000/32 = 468 steps (4680 steps at 4
workers x batch 32); momentum SGD (m 0.9, weight decay 5e-4), peak learning rate
0.05, linear warm-up over 3% of the steps then cosine decay to 0; the final accuracy
on all 10000 test images (rank 0's replica; every rank's weights are checked equal).
Codec settings per hook, as examples/train's configuration of the same codec (the
1-D parameters, biases and norm weights, stay dense in every gradcomp hook; every
weight tensor is compressed, conv and linear, except by GradiVeQ: conv only):

    gradcomp_gradiveq   examples/train's gradiveq_plus: basis fitted on up to 16 pooled slices
                        per sample, warm-up 500, L_t 150 (QSGD 4-bit), L_c 400, lambda 0.01
    gradcomp_qsgd       4 bits, buckets of 512 (qsgd4)
    gradcomp_qsgd_max   the same, each bucket scaled by its max |value| (not in the default list)
    gradcomp_two_bit    automatic threshold (scale 1), residual; plain SGD at lr/(1-m)
    gradcomp_top_k      top 1% (exact), residual, no DGC momentum; plain SGD at lr/(1-m)
    gradcomp_powersgd   rank 2, error feedback, warm start, dense for the first 5% of the
                        steps (234), matrices under 144 elements dense
    gradcomp_fp16/bf16  16-bit sum; gradcomp_homomorphic: lanes from N, blocks of 512
    powersgd (built-in) rank matched to gradcomp_gradiveq's bytes per step (--powersgd-rank
                        match, the default with --full: from the CSV's gradcomp_gradiveq rows),
                        start iteration 5% of the steps (234), warm start, error feedback,
                        PyTorch's min_compression_rate 2
    allreduce, fp16, bf16 (built-in) DDP's all-reduce / PyTorch's hooks, momentum SGD

Each --full training of a (hook, seed) writes one row into --csv (default
docs/results/torch-ddp-full.csv; a row of the same hook, seed, torch version, workers
and steps is replaced), so the 2-seed x every-hook grid can be filled over several
sessions; --summary prints the mean-of-2-seeds table, issue 23's targets and RESULT
lines from that CSV and names the cells still missing.

Bytes per step: gradcomp's hooks count what each rank hands to the process group
(padding of the all-gather included); for PyTorch's hooks the count is computed
from the parameter shapes (float32 all-reduce 4 B/element, fp16/bf16 2 B,
PowerSGD (n + m) * rank floats per matrix it compresses (PyTorch's rule: those with
(n + m) * rank * 2 < n * m) and the others dense, after its start iteration). A
built-in hook that this torch does not support on gloo is reported as unsupported,
not as a failure.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import hashlib
import math
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
#: Variants of a codec beyond examples/train's configuration, run only when named in --hooks: QSGD
#: scaled by each bucket's max |value| instead of its l2 norm (same bytes; docs/codecs.md), and
#: gradiveq_plus whose L_t QSGD sampler is scaled so, and that recipe with each layer's d capped at 128
#: or 64 (GradiVeQState max_dimension: the wide layers' bases, their products and fit 3.5x or 7x smaller);
#: a ``_f16`` suffix stores the fitted basis as binary16 (basis_storage="float16": half the bytes the
#: encode and decode read, the same payload sizes); an ``_ef`` before it adds error feedback
#: (error_feedback=True: what the basis leaves out of a rank's gradient is sent at the next sampling
#: step) and ``_ef_spread`` also spreads each cycle's L_t sampling steps over the cycle
#: (spread_sampling=True: the same steps sample, so the same bytes, and the residual leaves every few steps);
#: ``_d256_ef_spread_f16`` is the latter with d at most 256 (between the two byte and time budgets);
#: ``_efq`` instead of ``_ef`` also feeds back the L_t sampler's own QSGD rounding
#: (sampling_error_feedback=True, bounded under the max-norm scale these recipes use); an ``_i8`` suffix
#: instead of ``_f16`` stores each basis column as int8 values times a power of two (basis_storage="int8":
#: a quarter of float32's bytes, the same payload sizes). A ``_hostfit`` suffix after either shares each
#: fit between the ranks of the host (fit_sharing="host": each parameter's basis fitted on one rank and read
#: by the others from /dev/shm, the same bases bit for bit, a quarter of the CPU time at 4 workers).
GRADIVEQ_CAPS = (128, 64)
VARIANT_HOOKS = (["gradcomp_qsgd_max", "gradcomp_gradiveq_max"] + [f"gradcomp_gradiveq_max_d{c}" for c in GRADIVEQ_CAPS]
                 + ["gradcomp_gradiveq_max_f16", "gradcomp_gradiveq_max_d128_f16",
                    "gradcomp_gradiveq_max_ef_f16", "gradcomp_gradiveq_max_d128_ef_f16",
                    "gradcomp_gradiveq_max_ef_spread_f16", "gradcomp_gradiveq_max_d128_ef_spread_f16",
                    "gradcomp_gradiveq_max_d256_ef_spread_f16"]
                 + [f"gradcomp_gradiveq_max{cap}_efq_spread_f16" for cap in ("", "_d256", "_d128")]
                 + [f"gradcomp_gradiveq_max{cap}_ef_spread_i8" for cap in ("", "_d256")]
                 + [f"gradcomp_gradiveq_max_d256_ef_spread_{s}_hostfit" for s in ("f16", "i8")])
#: The GradiVeQ hooks (rows the built-in PowerSGD is compared with at equal bytes).
GRADIVEQ_HOOKS = ("gradcomp_gradiveq",) + tuple(h for h in VARIANT_HOOKS if h.startswith("gradcomp_gradiveq"))


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


#: examples/train's --full run (examples/train/README.md): peak learning rate, momentum, weight decay,
#: epochs, warm-up share of the learning-rate schedule, PowerSGD's dense start share.
FULL = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "epochs": 10, "warmup_share": 0.03,
        "powersgd_start_share": 0.05, "batch": 32, "workers": 4}
#: The whole-run ratios docs/results.md reports for each codec's examples/train configuration on
#: --full (float32 bytes of the whole gradient over the bytes produced; seed 1, or the mean of seeds 1-3
#: for powersgd, fp16, bf16, homomorphic).
RESULTS_MD_RATIO = {"gradcomp_dense": 1.00, "gradcomp_qsgd": 7.35, "gradcomp_qsgd_max": 7.35,
                    **{h: 4.48 for h in GRADIVEQ_HOOKS},
                    "gradcomp_two_bit": 13.91, "gradcomp_top_k": 43.72, "gradcomp_powersgd": 9.22,
                    "gradcomp_fp16": 1.98, "gradcomp_bf16": 1.98, "gradcomp_homomorphic": 7.43}
RESULTS_MD_CONFIG = {"gradcomp_dense": "baseline", "gradcomp_qsgd": "qsgd4", "gradcomp_qsgd_max": "qsgd4",
                     **{h: "gradiveq_plus" for h in GRADIVEQ_HOOKS},
                     "gradcomp_two_bit": "two_bit", "gradcomp_top_k": "topk", "gradcomp_powersgd": "powersgd",
                     "gradcomp_fp16": "fp16", "gradcomp_bf16": "bf16", "gradcomp_homomorphic": "homomorphic"}
CSV_FIELDS = ["hook", "seed", "torch", "workers", "steps", "batch", "accuracy_percent", "bytes_per_step", "ratio",
              "step_ms_median", "step_ms_mean", "own_ms_per_step", "wall_s", "settings", "powersgd_rank",
              "powersgd_start", "replicas_equal", "date_utc", "load_avg", "commit"]


def learning_rate(args, step):
    """examples/train's schedule (main.cpp, learning_rate): linear warm-up over the first 3% of the steps,
    then cosine decay to 0; constant (--lr) in the short run."""
    if not args.full:
        return args.lr
    warm = max(1.0, FULL["warmup_share"] * args.steps)
    return args.lr * min(1.0, (step + 1) / warm) * 0.5 * (1.0 + math.cos(math.pi * step / args.steps))


def optimizer_of(name, args):
    """(momentum, learning-rate multiplier): examples/train trains the residual codecs (two-bit, top-k)
    with plain SGD at lr/(1-m), momentum SGD on top of their residual having cost it 8-16 points."""
    if args.full and name in ("gradcomp_two_bit", "gradcomp_top_k"):
        return 0.0, 1.0 / (1.0 - FULL["momentum"])
    return (FULL["momentum"] if args.full else 0.9), 1.0


def full_settings(name, args):
    """One line naming the codec settings and optimiser of a --full training (the CSV's settings column)."""
    opt = "plain SGD at lr/(1-m)" if optimizer_of(name, args)[1] != 1.0 else "momentum SGD"
    gradiveq_max = (f"gradiveq_plus: warm-up {args.gradiveq_warmup}, L_t {args.gradiveq_sampling} (QSGD 4-bit, max "
                    f"norm), L_c {args.gradiveq_compressed}, pooled 16 slices, lambda 0.01")
    return {
        "allreduce": "DDP's float32 all-reduce",
        "fp16": "PyTorch's fp16_compress_hook",
        "bf16": "PyTorch's bf16_compress_hook",
        "powersgd": f"PyTorch's powerSGD_hook rank {args.powersgd_rank}, start {args.powersgd_start}, warm start, "
                    "error feedback, min_compression_rate 2",
        "gradcomp_dense": "dense float32",
        "gradcomp_gradiveq": f"gradiveq_plus: warm-up {args.gradiveq_warmup}, L_t {args.gradiveq_sampling} "
                             f"(QSGD 4-bit), L_c {args.gradiveq_compressed}, pooled 16 slices, lambda 0.01; conv only",
        "gradcomp_qsgd": "QSGD 4 bits, buckets of 512; weights",
        "gradcomp_qsgd_max": "QSGD 4 bits, buckets of 512, max norm; weights",
        "gradcomp_gradiveq_max": f"{gradiveq_max}; conv only",
        **{f"gradcomp_gradiveq_max_d{cap}": f"{gradiveq_max}, d at most {cap}; conv only" for cap in GRADIVEQ_CAPS},
        "gradcomp_gradiveq_max_f16": f"{gradiveq_max}, binary16 basis; conv only",
        "gradcomp_gradiveq_max_d128_f16": f"{gradiveq_max}, d at most 128, binary16 basis; conv only",
        "gradcomp_gradiveq_max_ef_f16": f"{gradiveq_max}, error feedback, binary16 basis; conv only",
        "gradcomp_gradiveq_max_d128_ef_f16": f"{gradiveq_max}, d at most 128, error feedback, binary16 basis; "
                                             "conv only",
        "gradcomp_gradiveq_max_ef_spread_f16": f"{gradiveq_max}, error feedback, L_t spread over the cycle, "
                                               "binary16 basis; conv only",
        **{f"gradcomp_gradiveq_max_d{cap}_ef_spread_f16": f"{gradiveq_max}, d at most {cap}, error feedback, L_t "
                                                           "spread over the cycle, binary16 basis; conv only"
           for cap in (128, 256)},
        **{f"gradcomp_gradiveq_max{cap}_efq_spread_f16":
           f"{gradiveq_max}{cap.replace('_d', ', d at most ')}, error feedback with the sampler's rounding, L_t "
           "spread over the cycle, binary16 basis; conv only" for cap in ("", "_d256", "_d128")},
        **{f"gradcomp_gradiveq_max{cap}_ef_spread_i8":
           f"{gradiveq_max}{cap.replace('_d', ', d at most ')}, error feedback, L_t spread over the cycle, int8 "
           "basis (a power of two per column); conv only" for cap in ("", "_d256")},
        **{f"gradcomp_gradiveq_max_d256_ef_spread_{s}_hostfit":
           f"{gradiveq_max}, d at most 256, error feedback, L_t spread over the cycle, {basis} basis, fits shared "
           "on the host; conv only"
           for s, basis in (("f16", "binary16"), ("i8", "int8 (a power of two per column)"))},
        "gradcomp_two_bit": "two-bit, automatic threshold scale 1, residual; weights",
        "gradcomp_top_k": "top-k 1% exact, residual, no DGC momentum; weights",
        "gradcomp_powersgd": f"PowerSGD rank 2, start {args.powersgd_start}, min_elements 144, error feedback, "
                             "warm start; weights",
        "gradcomp_fp16": "fp16 sum; weights",
        "gradcomp_bf16": "bf16 sum; weights",
        "gradcomp_homomorphic": "homomorphic, bits from N, blocks of 512; weights",
    }[name] + f"; {opt}, lr {args.lr} warm-up 3% + cosine, wd {FULL['weight_decay']}"


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
                                            start_powerSGD_iter=args.powersgd_start, warm_start=True,
                                            **({"random_seed": args.seed} if args.full else {}))
        return state, powerSGD_hook.powerSGD_hook, args.powersgd_start
    import gradcomp.torch as gt
    codec = name[len("gradcomp_"):]
    # --full: examples/train's plans (config.cpp): 1-D tensors dense whatever their size, the codec on
    # every weight (GradiVeQ: conv weights only); codec seeds from --seed
    full = {"small": "dense", "small_below": 0, "seed": args.seed} if args.full else {}
    if codec == "dense":
        return gt.DenseState(model, **full), gt.hook, 0
    if codec.startswith("gradiveq"):
        warm, lt = args.gradiveq_warmup, args.gradiveq_sampling
        norm = {"sampling_qsgd_norm": "max"} if codec != "gradiveq" else {}
        if codec.endswith("_hostfit"):  # gradiveq_max_d256_ef_spread_{f16,i8}_hostfit
            norm["fit_sharing"] = "host"
            norm["fit_timeout"] = args.fit_timeout
            codec = codec[:-len("_hostfit")]
        if codec.endswith("_f16"):  # gradiveq_max[_d<cap>][_ef[q][_spread]]_f16
            norm["basis_storage"] = "float16"
            codec = codec[:-len("_f16")]
        if codec.endswith("_i8"):  # gradiveq_max[_d<cap>]_ef_spread_i8
            norm["basis_storage"] = "int8"
            codec = codec[:-len("_i8")]
        if codec.endswith("_spread"):
            norm["spread_sampling"] = True
            codec = codec[:-len("_spread")]
        if codec.endswith("_efq"):  # gradiveq_max[_d<cap>]_efq: the sampler's rounding fed back too
            norm["sampling_error_feedback"] = True
            codec = codec[:-len("q")]
        if codec.endswith("_ef"):  # gradiveq_max[_d<cap>]_ef
            norm["error_feedback"] = True
            codec = codec[:-len("_ef")]
        if codec.startswith("gradiveq_max_d"):  # gradiveq_max_d<cap>
            norm["max_dimension"] = int(codec[len("gradiveq_max_d"):])
        if args.full:  # gradiveq_plus; the 64 x 10 linear weight dense, as examples/train's plan
            state = gt.GradiVeQState(model, **gt.GRADIVEQ_PLUS, **full, **norm, warmup_iterations=warm,
                                     sampling_iterations=lt, compressed_iterations=args.gradiveq_compressed,
                                     options={"fallback": "dense"})
        else:
            state = gt.GradiVeQState(model, **norm, warmup_iterations=warm, sampling_iterations=lt,
                                     compressed_iterations=args.gradiveq_compressed)
        return state, gt.hook, warm
    if codec in ("qsgd", "qsgd_max"):
        norm = "max" if codec == "qsgd_max" else "l2"
        return (gt.QSGDState(model, bits=4, levels=0, bucket_size=512, norm=norm, **full) if args.full
                else gt.QSGDState(model, bits=4, norm=norm)), gt.hook, 0
    if codec == "two_bit":
        return gt.TwoBitState(model, auto_scale=1.0, **full), gt.hook, 0
    if codec == "top_k":
        if args.full:
            return gt.TopKState(model, ratio_percent=1.0, mode="exact", scale=1.0, dgc_momentum=False, **full), \
                gt.hook, 0
        return gt.TopKState(model, ratio_percent=1.0), gt.hook, 0
    if codec == "powersgd":  # short run: the same rank and start as the built-in powersgd row
        if args.full:  # examples/train's powersgd: rank 2, dense start 5%, min_elements 144
            return gt.PowerSGDState(model, rank=2, start_iter=args.powersgd_start, min_elements=144,
                                    error_feedback=True, warm_start=True, **full), gt.hook, args.powersgd_start
        return gt.PowerSGDState(model, rank=args.powersgd_rank, start_iter=args.powersgd_start), gt.hook, \
            args.powersgd_start
    if codec == "fp16":
        return gt.FP16State(model, **full), gt.hook, 0
    if codec == "bf16":
        if not gt.supports_all_reduce(torch.bfloat16):  # a collective: every rank asks
            raise NotImplementedError(f"gloo on torch {torch.__version__} cannot all_reduce bfloat16")
        return gt.BF16State(model, **full), gt.hook, 0
    if codec == "homomorphic":
        return (gt.HomomorphicState(model, bits=0, block_size=512, **full) if args.full
                else gt.HomomorphicState(model)), gt.hook, 0
    raise ValueError(name)


def powersgd_compressed_bytes(model, rank):
    """Bytes per step PyTorch's powerSGD_hook hands to its all-reduces once compressing: each gradient viewed
    as shape[0] x rest, compressed at rank min(n, m, rank) when (n + m) r * 2 < n m (its
    min_compression_rate 2), P and Q float32; the others float32 dense."""
    total = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, rank)
        total += 4 * (n + m) * r if (n + m) * r * 2 < n * m else 4 * n * m
    return total


def builtin_bytes(name, model, args, steps):
    """Bytes per step and worker handed to the collectives by PyTorch's hooks (from the shapes)."""
    n = sum(p.numel() for p in model.parameters())
    if name == "allreduce":
        return 4.0 * n
    if name in ("fp16", "bf16"):
        return 2.0 * n
    start = min(args.powersgd_start, steps)
    return (start * 4.0 * n + (steps - start) * powersgd_compressed_bytes(model, args.powersgd_rank)) / steps


def match_powersgd_rank(model, args, target, max_rank=64):
    """The rank whose whole-run bytes per step (start iteration args.powersgd_start) are nearest `target`."""
    def at(r):
        return (min(args.powersgd_start, args.steps) * 4.0 * sum(p.numel() for p in model.parameters())
                + (args.steps - min(args.powersgd_start, args.steps)) * powersgd_compressed_bytes(model, r)) / args.steps
    return min(range(1, max_rank + 1), key=lambda r: (abs(at(r) - target), r))


def shard_batches(args, n_train, rank):
    """The indices of every step's batch for this rank: examples/train's data plan under --full (worker r holds
    every N-th image, reshuffled each epoch, floor(shard / batch) steps an epoch), random draws otherwise."""
    if not args.full:
        g = torch.Generator().manual_seed(args.seed * 1000 + rank)
        for _ in range(args.steps):
            yield torch.randint(0, n_train, (args.batch,), generator=g).numpy()
        return
    shard = np.arange(rank, n_train - n_train % args.workers, args.workers)
    per_epoch = len(shard) // args.batch
    step = 0
    epoch = 0
    while step < args.steps:
        order = np.random.default_rng([args.seed, epoch, rank]).permutation(shard)
        for i in range(per_epoch):
            if step == args.steps:
                return
            yield order[i * args.batch:(i + 1) * args.batch]
            step += 1
        epoch += 1


def evaluate(model, test_x, test_y, n):
    model.eval()
    with torch.no_grad():
        n = min(n, len(test_y))
        logits = torch.cat([model(to_tensor(test_x[i:min(n, i + 500)])) for i in range(0, n, 500)])
        acc = float((logits.argmax(1) == torch.from_numpy(test_y[:n].astype(np.int64))).float().mean())
    model.train()
    return acc


def print_own_split(name, own_by_phase, steps):
    """Rank 0's own time (encode, decode, Python) per phase of its codecs, and the steps that fitted a basis
    (GradiVeQ: own time over 50x the phase's median), so that a share can be traced to its part."""
    print(f"  {name}: own ms per step by phase (rank 0; encode, decode, python; fits: steps over 50x the median)")
    for phase, (n, enc, dec, py, per_step) in own_by_phase.items():
        median = float(np.median(per_step))
        fits = [x for x in per_step if x > 50 * median and x > 0.05]
        rest = n - len(fits)
        fit_total = sum(fits)
        body = (sum(per_step) - fit_total) / max(1, rest)
        print(f"    {phase}: {n} steps, {1000 * (enc + dec + py) / n:.2f} ms (encode {1000 * enc / n:.2f}, decode "
              f"{1000 * dec / n:.2f}, python {1000 * py / n:.2f}); without fits {1000 * body:.2f} ms; "
              f"{len(fits)} fits, {1000 * fit_total / max(1, len(fits)):.0f} ms each, "
              f"{1000 * fit_total / steps:.2f} ms per step of the run", flush=True)


def exit_with_parent(parent_pid):
    """A worker ends when the process that started it ends, however it ends (on Linux: PR_SET_PDEATHSIG):
    a parent killed by SIGTERM or SIGKILL mid-run otherwise leaves its workers training for minutes, on
    the CPUs the next run measures."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # it ended before the call above
        os._exit(1)


def worker(rank, world, port, name, args, data, queue, parent_pid=None):
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    result = {"hook": name, "rank": rank}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
        train_x, train_y, test_x, test_y = data
        torch.manual_seed(args.seed)
        model = SmallResNet()
        ddp = DDP(model)
        state, hook, _ = make_hook(name, model, args)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        momentum, lr_mult = optimizer_of(name, args)
        wd = FULL["weight_decay"] if args.full else 1e-4
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * lr_mult, momentum=momentum, weight_decay=wd)
        times = []
        loss_sum, loss_n = 0.0, 0
        eq7_sum, eq7_n = 0.0, 0  # GradiVeQ: this rank's eq. 7 relative loss, summed over its L_c steps
        own_by_phase = {}  # gradcomp hooks, rank 0: phase -> [steps, encode s, decode s, python s]
        split_after = {"encode": 0.0, "decode": 0.0, "python": 0.0}  # state.overhead() after the last step
        per_epoch = (len(train_y) // world) // args.batch
        t_start = time.perf_counter()
        for step, idx in enumerate(shard_batches(args, len(train_y), rank)):
            x, y = to_tensor(train_x[idx]), torch.from_numpy(train_y[idx].astype(np.int64))
            t0 = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = learning_rate(args, step) * lr_mult
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            if rank == 0 and name.startswith("gradcomp_"):
                split_before, split_after = split_after, state.overhead()
                phase = ",".join(sorted(set(state.phases().values())))
                row = own_by_phase.setdefault(phase, [0, 0.0, 0.0, 0.0, []])
                delta = [split_after[k] - split_before[k] for k in ("encode", "decode", "python")]
                row[0] += 1
                for i, d in enumerate(delta):
                    row[1 + i] += d
                row[4].append(sum(delta))
            eq7 = state.relative_compression_loss() if hasattr(state, "relative_compression_loss") else None
            if eq7 is not None:
                eq7_sum += eq7
                eq7_n += 1
            loss_sum += loss.item()
            loss_n += 1
            if rank == 0 and args.progress and (step + 1) % args.progress == 0:
                print(f"  {name}: step {step + 1}/{args.steps}", flush=True)
            if rank == 0 and args.full and (step + 1) % per_epoch == 0 and step + 1 < args.steps:
                acc = evaluate(model, test_x, test_y, 2000)
                print(f"  [{name} seed {args.seed}] epoch {(step + 1) // per_epoch} step {step + 1}/{args.steps} "
                      f"loss {loss_sum / loss_n:.4f} test {100 * acc:.2f}% (2000 images) "
                      f"{time.perf_counter() - t_start:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
                loss_sum, loss_n = 0.0, 0
        if not math.isfinite(loss_sum):
            raise FloatingPointError(f"{name}: the loss is not finite")
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        result.update(ok=True, step_ms=1000 * float(np.median(times)), step_mean_ms=1000 * float(np.mean(times)),
                      digest=digest)
        if rank == 0 or not args.full:  # --full: rank 0's replica (every rank's weights are compared)
            result["accuracy"] = evaluate(model, test_x, test_y, args.eval)
        if rank == 0 and eq7_n:
            print(f"  {name}: mean eq. 7 relative loss in L_c {eq7_sum / eq7_n:.3f} over {eq7_n} steps (rank 0: "
                  "the share of its gradient's energy the basis left out)", flush=True)
        if own_by_phase:
            print_own_split(name, own_by_phase, args.steps)
        if name.startswith("gradcomp_"):
            result["bytes_per_step"] = state.stats["bytes_sent"] / args.steps
            result["hook_ms"] = 1000 * state.overhead()["own"] / args.steps  # encode, decode, Python; no waits
        else:
            result["bytes_per_step"] = builtin_bytes(name, model, args, args.steps)
            if name == "powersgd" and hasattr(state, "total_numel_after_compression"):
                # PyTorch's own count of the elements it all-reduced in its compressed steps
                n = sum(p.numel() for p in model.parameters())
                start = min(args.powersgd_start, args.steps)
                result["bytes_per_step_counted"] = (4.0 * (start * n + state.total_numel_after_compression)
                                                    / args.steps)
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
    procs = [ctx.Process(target=worker, args=(r, args.workers, port, name, args, data, queue, os.getpid()))
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


# ---- the --full grid: one CSV row per (hook, seed), the summary ---------------------------------------

def read_rows(path):
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_row(path, row):
    """Adds `row` to the CSV, replacing a row of the same hook, seed, torch, workers and steps."""
    key = ("hook", "seed", "torch", "workers", "steps")
    rows = [r for r in read_rows(path) if tuple(r[k] for k in key) != tuple(str(row[k]) for k in key)]
    rows.append({k: row.get(k, "") for k in CSV_FIELDS})
    rows.sort(key=lambda r: (r["torch"], int(r["workers"]), int(r["steps"]), r["hook"], int(r["seed"])))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    tmp.replace(path)


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "python", "examples/python"],
                               cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def summary(args):
    """The mean-of-2-seeds table of the --full grid in the CSV, issue 23's targets, RESULT lines, missing cells."""
    version = args.summary_torch or torch.__version__.split("+")[0]
    steps = args.steps
    rows = [r for r in read_rows(args.csv) if r["torch"] == version and int(r["workers"]) == args.workers
            and int(r["steps"]) == steps]
    seeds = [int(s) for s in args.summary_seeds.split(",")]
    hooks = [h for h in args.hooks.split(",") if h]
    hooks += [v for v in VARIANT_HOOKS if v not in hooks and any(r["hook"] == v for r in rows)]  # when trained
    cell = {(r["hook"], int(r["seed"])): r for r in rows}
    print(f"--full grid in {args.csv}: torch {version}, {args.workers} workers, {steps} steps, seeds "
          f"{args.summary_seeds}")
    missing = [(h, s) for h in hooks for s in seeds if (h, s) not in cell]
    mean = {}
    for h in hooks:
        got = [cell[(h, s)] for s in seeds if (h, s) in cell]
        if got:
            mean[h] = {"acc": float(np.mean([float(r["accuracy_percent"]) for r in got])),
                       "bytes": float(np.mean([float(r["bytes_per_step"]) for r in got])),
                       "ratio": float(np.mean([float(r["ratio"]) for r in got])), "n": len(got),
                       "seeds": [float(r["accuracy_percent"]) for r in got],
                       "rank": got[0].get("powersgd_rank", ""), "start": got[0].get("powersgd_start", "")}
    base = mean.get("allreduce")
    print(f"\n{'hook':22s} {'seeds':>5s} {'test % mean':>11s} {'per seed':>16s} {'vs allreduce':>12s} "
          f"{'bytes/step':>10s} {'ratio':>7s} {'results.md ratio':>17s}")
    for h in hooks:
        if h not in mean:
            print(f"{h:22s} {0:5d} {'-':>11s}")
            continue
        m = mean[h]
        d = f"{m['acc'] - base['acc']:+.2f}" if base else "-"
        ref = f"{RESULTS_MD_RATIO[h]:.2f}x ({RESULTS_MD_CONFIG[h]})" if h in RESULTS_MD_RATIO else "-"
        extra = f"  rank {m['rank']}, start {m['start']}" if h == "powersgd" else ""
        print(f"{h:22s} {m['n']:5d} {m['acc']:11.2f} {'/'.join(f'{a:.2f}' for a in m['seeds']):>16s} {d:>12s} "
              f"{m['bytes']:10.0f} {m['ratio']:6.2f}x {ref:>17s}{extra}")
    complete = lambda h: h in mean and mean[h]["n"] == len(seeds)  # noqa: E731
    print(f"\nIssue 23's targets (mean of {len(seeds)} seeds; 'incomplete' until every seed of both rows is in):")
    for h in [h for h in hooks if h.startswith("gradcomp_")]:
        if not (complete(h) and complete("allreduce")):
            verdict = "incomplete"
        else:
            delta = mean[h]["acc"] - base["acc"]
            verdict = f"{delta:+.2f} points: " + ("met" if delta >= -1.0 else "MISSED")
        print(f"  {h} within 1 point of allreduce: {verdict}")
    for gq in [h for h in GRADIVEQ_HOOKS if h in hooks]:
        if complete(gq) and complete("powersgd"):
            g, p = mean[gq], mean["powersgd"]
            delta = g["acc"] - p["acc"]
            print(f"  {gq} at least as accurate as powersgd at equal bytes ({g['bytes']:.0f} against "
                  f"{p['bytes']:.0f} B/step; PowerSGD rank {p['rank']}, start iteration {p['start']}): "
                  f"{delta:+.2f} points: {'met' if delta >= 0 else 'MISSED'}")
        else:
            print(f"  {gq} at least as accurate as powersgd at equal bytes: incomplete")
    for h in hooks:
        if h in mean:
            tag = "" if mean[h]["n"] == len(seeds) else f"_{mean[h]['n']}of{len(seeds)}seeds"
            print(f"RESULT torch_ddp_full_{h}_accuracy{tag} {mean[h]['acc']:.2f} %")
            print(f"RESULT torch_ddp_full_{h}_ratio{tag} {mean[h]['ratio']:.2f} x")
            if base and h != "allreduce" and complete(h) and complete("allreduce"):
                print(f"RESULT torch_ddp_full_{h}_vs_allreduce {mean[h]['acc'] - base['acc']:+.2f} points")
    for gq in GRADIVEQ_HOOKS:
        if complete(gq) and complete("powersgd"):
            print(f"RESULT torch_ddp_full_{gq[len('gradcomp_'):]}_vs_powersgd_equal_bytes "
                  f"{mean[gq]['acc'] - mean['powersgd']['acc']:+.2f} points")
    if missing:
        print(f"\nmissing cells ({len(missing)} of {len(hooks) * len(seeds)}): "
              + ", ".join(f"{h} seed {s}" for h, s in missing))
        by_seed = {}
        for h, s in missing:
            by_seed.setdefault(s, []).append(h)
        flags = (f" --workers {args.workers}" if args.workers != FULL["workers"] else "") + \
            (f" --epochs {args.epochs:g}" if args.epochs != FULL["epochs"] else "") + \
            (" --synthetic" if args.synthetic else "")
        for s, hs in sorted(by_seed.items()):
            hs = sorted(hs, key=lambda h: h == "powersgd")  # its rank matches gradcomp_gradiveq's row: last
            print(f"  python examples/python/train_ddp.py --full{flags} --seed {s} --hooks {','.join(hs)}")
    else:
        print("\nevery cell of the grid is in")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="short run's steps (--full: 10 epochs of its shards)")
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=None, help="short run: the constant rate (0.05); --full: the peak "
                                                            "of the warm-up and cosine schedule (0.05)")
    ap.add_argument("--eval", type=int, default=2000, help="test images evaluated (--full: 10000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hooks", default=",".join(BUILTIN_HOOKS + GRADCOMP_HOOKS))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--synthetic", action="store_true", help="random images instead of Fashion-MNIST")
    ap.add_argument("--powersgd-rank", default=None,
                    help="built-in powersgd's rank (short run: 2; --full: 'match', the rank whose bytes per step "
                         "over the run are nearest gradcomp_gradiveq's in --csv)")
    ap.add_argument("--powersgd-start", type=int, default=None,
                    help="PowerSGD's start iteration (short run: 10; --full: 5%% of the steps)")
    ap.add_argument("--gradiveq-warmup", type=int, default=None, help="(20; --full: 500)")
    ap.add_argument("--gradiveq-sampling", type=int, default=None, help="L_t (10; --full: 150, gradiveq_plus)")
    ap.add_argument("--gradiveq-compressed", type=int, default=None, help="L_c (200; --full: 400)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per hook run (1800; --full: 6 h)")
    ap.add_argument("--fit-timeout", type=float, default=300.0,
                    help="_hostfit variants: seconds a rank waits for another's bases (the process group's 300)")
    ap.add_argument("--progress", type=int, default=0, help="print every N steps (rank 0)")
    ap.add_argument("--out", default="train_ddp_out", help="folder of the CSV and PNG")
    ap.add_argument("--full", action="store_true",
                    help="examples/train's --full run: 10 epochs of the 60000 images, its learning-rate schedule "
                         "and codec settings, 10000 test images; a row per (hook, seed) into --csv (long)")
    ap.add_argument("--epochs", type=float, default=FULL["epochs"], help="--full: epochs over the shards (10)")
    ap.add_argument("--csv", default=str(Path(__file__).resolve().parents[2] / "docs" / "results" /
                                         "torch-ddp-full.csv"), help="--full's rows, --summary's input")
    ap.add_argument("--summary", action="store_true", help="print the --full grid from --csv (no training)")
    ap.add_argument("--summary-seeds", default="1,2", help="the seeds of the grid")
    ap.add_argument("--summary-torch", default=None, help="the torch version of the rows (default: this one)")
    args = ap.parse_args()
    full_defaults = {"lr": FULL["lr"], "gradiveq_warmup": 500, "gradiveq_sampling": 150, "gradiveq_compressed": 400,
                     "timeout": 6 * 3600.0}
    short_defaults = {"lr": 0.05, "gradiveq_warmup": 20, "gradiveq_sampling": 10, "gradiveq_compressed": 200,
                      "timeout": 1800.0, "powersgd_start": 10, "powersgd_rank": "2"}
    if args.full or args.summary:
        args.full = True
        per_epoch = ((2048 if args.synthetic else 60000) // args.workers) // args.batch
        args.steps = max(1, int(round(args.epochs * per_epoch)))
        args.eval = 10000
        full_defaults["powersgd_start"] = int(round(FULL["powersgd_start_share"] * args.steps))
        full_defaults["powersgd_rank"] = "match"
    for k, v in (full_defaults if args.full else short_defaults).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.summary:
        summary(args)
        return
    data = load_data(args)
    hooks = [h for h in args.hooks.split(",") if h]
    unknown = [h for h in hooks if h not in BUILTIN_HOOKS + GRADCOMP_HOOKS + VARIANT_HOOKS]
    if unknown:
        sys.exit(f"unknown hooks {unknown} (hooks: {','.join(BUILTIN_HOOKS + GRADCOMP_HOOKS + VARIANT_HOOKS)})")
    if str(args.powersgd_rank) == "match" and "powersgd" in hooks and "gradcomp_gradiveq" in hooks:
        hooks = [h for h in hooks if h != "powersgd"] + ["powersgd"]  # its rank comes from gradiveq's row
    print(f"torch {torch.__version__}, {args.workers} gloo workers, {args.steps} steps of {args.batch} per worker"
          + (", examples/train's --full schedule" if args.full else ""), flush=True)
    rows = []
    gradcomp_failures = powersgd_failures = 0
    rank_arg = str(args.powersgd_rank)
    args.powersgd_rank = 2 if rank_arg == "match" else int(rank_arg)  # until powersgd's turn
    for name in hooks:
        if name == "powersgd":
            if rank_arg == "match":
                got = [float(r["bytes_per_step"]) for r in read_rows(args.csv) if r["hook"] == "gradcomp_gradiveq"
                       and r["torch"] == torch.__version__.split("+")[0] and int(r["workers"]) == args.workers
                       and int(r["steps"]) == args.steps]
                if not got:
                    print(f"{name:18s} skipped: --powersgd-rank match needs a gradcomp_gradiveq row in {args.csv} "
                          "(train gradcomp_gradiveq first, or give --powersgd-rank N)", flush=True)
                    continue
                target = float(np.mean(got))
                args.powersgd_rank = match_powersgd_rank(SmallResNet(), args, target)
                print(f"{name:18s} rank {args.powersgd_rank} (start {args.powersgd_start}): "
                      f"{builtin_bytes(name, SmallResNet(), args, args.steps):.0f} B/step against "
                      f"gradcomp_gradiveq's {target:.0f} (mean of {len(got)} seed(s))", flush=True)
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        results = run_hook(name, args, data)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        print(f"{name:18s} ran in {wall:.0f} s", flush=True)
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
        ok.sort(key=lambda r: r["rank"])
        r0 = ok[0]
        equal = len({r["digest"] for r in ok}) == 1
        if not equal:
            print(f"{name:18s} FAILED: the replicas' weights differ")
            gradcomp_failures += name.startswith("gradcomp_")
            powersgd_failures += name == "powersgd"
            continue
        accs = [r["accuracy"] for r in ok if "accuracy" in r]
        row = {"hook": name, "accuracy": float(np.mean(accs)),
               "bytes_per_step": r0["bytes_per_step"], "step_ms": float(np.mean([r["step_ms"] for r in ok])),
               "step_mean_ms": float(np.mean([r["step_mean_ms"] for r in ok])),
               "hook_ms": float(np.mean([r["hook_ms"] for r in ok])) if "hook_ms" in r0 else None, "wall": wall}
        if "bytes_per_step_counted" in r0:
            print(f"{name:18s} bytes per step: {r0['bytes_per_step']:.0f} from the shapes, "
                  f"{r0['bytes_per_step_counted']:.0f} from PowerSGDState's own element count")
        rows.append(row)
        if args.full:
            dense = 4.0 * sum(p.numel() for p in SmallResNet().parameters())
            write_row(args.csv, {
                "hook": name, "seed": args.seed, "torch": torch.__version__.split("+")[0], "workers": args.workers,
                "steps": args.steps, "batch": args.batch, "accuracy_percent": f"{100 * row['accuracy']:.2f}",
                "bytes_per_step": f"{row['bytes_per_step']:.1f}", "ratio": f"{dense / row['bytes_per_step']:.4f}",
                "step_ms_median": f"{row['step_ms']:.2f}", "step_ms_mean": f"{row['step_mean_ms']:.2f}",
                "own_ms_per_step": "" if row["hook_ms"] is None else f"{row['hook_ms']:.3f}",
                "wall_s": f"{wall:.0f}", "settings": full_settings(name, args),
                "powersgd_rank": (2 if name == "gradcomp_powersgd" else args.powersgd_rank) if "powersgd" in name
                else "",
                "powersgd_start": args.powersgd_start if "powersgd" in name else "",
                "replicas_equal": "yes",
                "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                "load_avg": f"{load0[0]:.1f}-{load1[0]:.1f} (1-min, start-end)", "commit": git_commit()})
            print(f"{name:18s} {100 * row['accuracy']:.2f}% -> row (hook {name}, seed {args.seed}) in {args.csv}",
                  flush=True)
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
