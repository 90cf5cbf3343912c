#!/usr/bin/env python3
"""The gradcomp DDP hooks' own time as a share of a real ResNet-50 training step
(issue 23: "reported for ResNet-50-sized buckets"; docs/python.md, "Hook overhead").

    python python/bench/bench_resnet50_share.py                    # 2 gloo workers, batch 8, 2 + 3 steps
    python python/bench/bench_resnet50_share.py --workers 4        # 4 workers
    python python/bench/bench_resnet50_share.py --hooks dense,qsgd --steps 2

Every worker trains ResNet-50 (torchvision's resnet50 architecture written out in
plain torch.nn below, so that the bench needs no torchvision: the v1.5
bottleneck with the stride on the 3x3 conv, 161 parameter tensors, 25,557,032
parameters, the same names as torchvision's) under DistributedDataParallel on
gloo over localhost, with DDP's default buckets (25 MB; DDP rebuilds them after
the first step), on a fixed random batch of ``--batch`` 224x224 images with
random labels of 1000 classes, SGD (lr 0.01, momentum 0.9). For PyTorch's plain
all-reduce and for every gradcomp hook it runs ``--warmup`` steps, then
``--steps`` measured steps; a step is zero_grad, forward, backward (DDP's hooks
and collectives included) and the optimizer step. Per hook it prints the step
time, the hook's own time per step (``state.overhead()["own"]``: encode, decode
and the hook's Python, i.e. everything but the process group's collectives)
and own / step. The means are over the measured steps and over the ranks.

GradiVeQ (warm-up 1, L_t 3, L_c 200) is also run through its sampling steps and
its fit: its line is the cycle's amortized figure, (the own times of the L_t
sampling steps and of the first compressed step, which holds the fit, minus one
steady compressed step, plus L_c steady compressed steps) / (L_t + L_c), and
the same for the step time; the steady compressed step's share is printed
beside it. PowerSGD (rank 2) starts compressing at step 2, so its measured
steps are compressed. Prints RESULT torch_ddp_<hook>_resnet50_step_ms,
torch_ddp_<hook>_resnet50_own_ms and torch_ddp_<hook>_resnet50_own_share (%).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hook_overhead import HOOKS, make_state, spawn  # noqa: E402

GRADIVEQ_SCHEDULE = (1, 3, 200)  # warm-up, L_t, L_c
POWERSGD_START = 2


# ---- ResNet-50 (torchvision.models.resnet50's architecture, v1.5) ---------------

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.inplanes = 64
        self.layer1 = self._layer(64, 3, 1)
        self.layer2 = self._layer(128, 4, 2)
        self.layer3 = self._layer(256, 6, 2)
        self.layer4 = self._layer(512, 3, 2)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---- the workers ------------------------------------------------------------------

def worker(rank, world, args):
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gradcomp.torch as gt
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, 224, 224, generator=g)
    y = torch.randint(0, 1000, (args.batch,), generator=g)
    results = {}
    for name in args.hooks:
        if name == "bf16" and not gt.supports_all_reduce(torch.bfloat16):
            results[name] = None
            continue
        torch.manual_seed(1)
        model = ResNet50()
        ddp = DDP(model)
        state = None
        if name != "allreduce":
            state = make_state(name, model, gradiveq_schedule=GRADIVEQ_SCHEDULE, powersgd_start=POWERSGD_START)
            ddp.register_comm_hook(state, gt.hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        warmup = args.warmup
        if name == "gradiveq":  # its warm-up step and L_t sampling steps are measured (the cycle's part)
            warmup = 1
        total = warmup + args.steps + (GRADIVEQ_SCHEDULE[1] + 1 if name == "gradiveq" else 0)
        step_s, own_s, phases = [], [], []
        for step in range(total):
            before = state.overhead()["own"] if state else 0.0
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            step_s.append(time.perf_counter() - t0)
            own_s.append(state.overhead()["own"] - before if state else 0.0)
            phases.append(sorted(set(state.phases().values())) if state else [])
        results[name] = {"step_s": step_s, "own_s": own_s, "phases": phases, "warmup": warmup,
                         "loss": loss.item(), "n_params": sum(p.numel() for p in model.parameters()),
                         "n_tensors": len(list(model.parameters())),
                         "split": ({k: v / total for k, v in state.overhead().items()} if state else None)}
        del ddp, model, state, opt
    return results


def summarize(name, rows):
    """(step ms, own ms, extra) for one hook, the mean over the ranks."""
    step = np.mean([r["step_s"] for r in rows], axis=0) * 1000
    own = np.mean([r["own_s"] for r in rows], axis=0) * 1000
    w = rows[0]["warmup"]
    if name != "gradiveq":
        return float(step[w:].mean()), float(own[w:].mean()), ""
    lt, lc = GRADIVEQ_SCHEDULE[1], GRADIVEQ_SCHEDULE[2]
    # steps: [0] warm-up, [1..lt] sampling, [lt+1] first compressed (with the fit), then steady compressed
    first = lt + 1
    steady_step, steady_own = step[first + 1:].mean(), own[first + 1:].mean()
    cyc_step = (step[1:first + 1].sum() - steady_step + lc * steady_step) / (lt + lc)
    cyc_own = (own[1:first + 1].sum() - steady_own + lc * steady_own) / (lt + lc)
    ph = rows[0]["phases"]
    extra = (f"  [amortized over L_t {lt} + L_c {lc}; own per step: sampling "
             f"{', '.join(f'{v:.0f}' for v in own[1:first])}, first compressed (fit) {own[first]:.0f}, "
             f"steady compressed {steady_own:.0f} ms = {100 * steady_own / steady_step:.1f}% of "
             f"{steady_step:.0f} ms; phases {ph[1]} -> {ph[first]} -> {ph[-1]}]")
    return float(cyc_step), float(cyc_own), extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--batch", type=int, default=8, help="224x224 images per worker")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--hooks", default=",".join(["allreduce"] + HOOKS))
    args = ap.parse_args()
    args.hooks = [h for h in args.hooks.split(",") if h]
    t0 = time.time()
    load0 = os.getloadavg()
    per_rank = spawn(args.workers, worker, args)
    r0 = per_rank[0]
    first = next(v for v in r0.values() if v)
    print(f"torch {torch.__version__}, ResNet-50 ({first['n_params']} parameters in {first['n_tensors']} tensors), "
          f"{args.workers} gloo workers x {args.threads} thread(s) on {os.cpu_count()} CPUs, batch {args.batch} "
          f"of 224x224 per worker, {args.warmup} warm-up + {args.steps} measured steps; "
          f"load {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end; {time.time() - t0:.0f} s")
    print(f"{'hook':12s} {'step ms':>9s} {'own ms':>8s} {'share':>7s} {'encode':>7s} {'decode':>7s} {'python':>7s}"
          f" {'comm':>7s}  (encode/decode/python/comm: ms per step, all steps)")
    for name in args.hooks:
        rows = [r[name] for r in per_rank]
        if rows[0] is None:
            print(f"{name:12s} unsupported on this torch's gloo (bfloat16 all_reduce)")
            continue
        step, own, extra = summarize(name, rows)
        line = f"{name:12s} {step:9.0f} {own:8.0f} {100 * own / step:6.1f}%"
        if rows[0]["split"]:
            sp = {k: 1000 * float(np.mean([r["split"][k] for r in rows])) for k in rows[0]["split"]}
            line += f" {sp['encode']:7.0f} {sp['decode']:7.0f} {sp['python']:7.0f} {sp['comm']:7.0f}"
        print(line + extra)
        key = name if name == "allreduce" else f"gradcomp_{name}"
        print(f"RESULT torch_ddp_{key}_resnet50_step_ms {step:.0f}")
        if name != "allreduce":
            print(f"RESULT torch_ddp_{key}_resnet50_own_ms {own:.0f}")
            print(f"RESULT torch_ddp_{key}_resnet50_own_share {100 * own / step:.2f} %")


if __name__ == "__main__":
    main()
