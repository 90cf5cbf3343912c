#!/usr/bin/env python3
"""Collective-order safety of DDP comm hooks: how often a short training fails.

Every gradcomp hook and PyTorch's built-in ``powerSGD_hook``,
``batched_powerSGD_hook`` and ``fp16_compress_hook`` train the test net of
python/tests (about 31k parameters, DDP ``bucket_cap_mb`` 0.02 so the net is
spread over at least 4 buckets; counted and reported) for 20 steps, RUNS times
at 2 ranks and RUNS4 times at 4 ranks, on gloo over localhost with a process
group timeout of 10 s. A run fails when any rank crashes or aborts, raises
(a gloo timeout included), hangs (once every rank finished its first step, no
rank finishes a step for 12 s, past the gloo timeout, and the run has not
ended; 120 s for the first step), ends
with weights that differ between the ranks, or with non-finite weights.

    python python/bench/bench_ddp_failures.py                       # 50 runs at 2 ranks, 20 at 4, every hook
    python python/bench/bench_ddp_failures.py --runs 5 --runs4 2 --hooks gradcomp_two_bit,builtin_powersgd

Runs are cheap: the worker processes stay alive across runs and hooks; each
run makes a fresh process group on a fresh key prefix of one TCP store (the
parent holds it). After a failed run the pool is killed and started again
(forked from a forkserver that has torch loaded), so one failure cannot leak
into the next run; the first rank that raises ends the run at once (the others
would wait for the gloo timeout). A built-in hook that this torch
cannot run on gloo (a dtype gloo cannot sum) is reported as unsupported, not
as a failure. Prints a table and RESULT lines:
torch_ddp_<hook>_failures_<world>r (failed runs; the table gives the runs), torch_ddp_gradcomp_hook_failures
and torch_ddp_powersgd_builtin_failures (every gradcomp hook, resp. both built-in
PowerSGD hooks, over every run of this torch version).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import queue as queue_module
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

GRADCOMP = ["gradcomp_dense", "gradcomp_gradiveq", "gradcomp_qsgd", "gradcomp_two_bit", "gradcomp_top_k",
            "gradcomp_powersgd", "gradcomp_fp16", "gradcomp_bf16", "gradcomp_homomorphic"]
BUILTIN = ["builtin_powersgd", "builtin_batched_powersgd", "builtin_fp16"]
PG_TIMEOUT_S = 10
CAP_MB = 0.02
STEPS = 20


def _digest(model) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _make(hook, model):
    """(state, hook function); raises NotImplementedError when this torch cannot run it on gloo."""
    import gradcomp.torch as gt
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as ps
    if hook.startswith("gradcomp_"):
        codec = hook[len("gradcomp_"):]
        if codec == "bf16" and not gt.supports_all_reduce(torch.bfloat16):
            raise NotImplementedError(f"gloo on torch {torch.__version__} cannot all_reduce bfloat16")
        import workers  # python/tests: the states of the tests (GradiVeQ: warm-up 3, L_t 4, then compressed)
        return workers.make_state(codec, model), gt.hook
    if hook == "builtin_fp16":
        if not gt.supports_all_reduce(torch.float16):
            raise NotImplementedError(f"gloo on torch {torch.__version__} cannot all_reduce float16")
        return None, default_hooks.fp16_compress_hook
    # PyTorch's PowerSGD: rank 2, compressed from step 2 on (the earliest it allows with error feedback
    # and warm start), its defaults otherwise
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    return state, (ps.powerSGD_hook if hook == "builtin_powersgd" else ps.batched_powerSGD_hook)


def _one_run(rank, world, hook, run, store, progress=None):
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from ddp_harness import Net, data
    dist.init_process_group("gloo", store=dist.PrefixStore(f"run{run}", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * 1024 * 1024)  # torch 1.x caps bucket 0
    torch.manual_seed(run)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    state, fn = _make(hook, model)
    buckets = set()

    def counting(st, bucket):
        buckets.add(bucket.index())
        return fn(st, bucket)

    ddp.register_comm_hook(state, counting)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = data(rank, step + 100 * run)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if progress is not None:
            progress.value += 1
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"digest": _digest(model), "finite": finite, "buckets": len(buckets)}


def _worker(rank, world, port, tasks, results, log, progress):
    sys.path.insert(0, str(HERE.parent / "tests"))
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)  # a crash's message (gloo's abort, terminate called ...) goes to the log
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    while True:
        task = tasks.get()
        if task is None:
            return
        hook, run = task
        try:
            out = ("ok", _one_run(rank, world, hook, run, store, progress))
        except NotImplementedError as e:
            out = ("unsupported", str(e))
        except BaseException as e:  # noqa: BLE001 - a failed run is counted
            out = ("raised", f"{type(e).__name__}: {str(e)[:300]}", traceback.format_exc(limit=4))
        results.put((rank, run, out))  # before the teardown: torch 1.13's destroy_process_group can stall
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001
            pass
        results.put((rank, run, ("idle",)))


class Pool:
    """`world` worker processes that run one training per task, kept alive across runs."""

    def __init__(self, world, log):
        self.world, self.log = world, log
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=30))
        # forkserver with torch preloaded: a new worker is a fork (milliseconds), not a fresh interpreter
        # importing torch (seconds on a loaded machine); the pool restarts after every failed run
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel", "numpy"])
        self.procs = []
        self.starts = 0
        self.teardown_stalls = 0
        self.idle = set()
        self.start()

    def start(self):
        self.stop()
        self.tasks = [self.ctx.Queue() for _ in range(self.world)]
        self.results = self.ctx.Queue()
        self.progress = [self.ctx.Value("q", 0, lock=False) for _ in range(self.world)]  # steps done, per rank
        self.procs = [self.ctx.Process(target=_worker, args=(r, self.world, self.port, self.tasks[r], self.results,
                                                             self.log, self.progress[r]), daemon=True)
                      for r in range(self.world)]
        for p in self.procs:
            p.start()
        self.starts += 1

    def stop(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self.procs = []

    @staticmethod
    def _raised(rank, out):
        where = out[2].strip().splitlines()[-3:-1] if len(out) > 2 else []
        return f"rank {rank}: {out[1]} ({' / '.join(x.strip() for x in where)})"

    def run(self, hook, run, deadline_s):
        """One training on every rank: (outcome, detail, buckets). outcome: ok, unsupported, raised,
        wrong, crashed, hang."""
        for q in self.tasks:
            q.put((hook, run))
        got = {}
        seen = [v.value for v in self.progress]
        # until every rank finished its first step (process start, imports, process group, DDP): 120 s;
        # then pushed back by deadline_s whenever a rank finishes a step
        first = list(seen)
        deadline = time.monotonic() + 120.0
        while len(got) < self.world:
            now = [v.value for v in self.progress]
            if now != seen:
                seen = now
                if all(a > b for a, b in zip(now, first)):
                    deadline = time.monotonic() + deadline_s
            try:
                rank, r, out = self.results.get(timeout=0.2)
                if out[0] == "idle":
                    self.idle.add((rank, r))
                    continue
                if r == run:
                    got[rank] = out
                if out[0] == "unsupported":  # the same on every rank; the others may stall in the probe
                    time.sleep(0.5)
                    self.start()
                    return "unsupported", out[1], None
                if out[0] == "raised":  # the others may wait for the gloo timeout: do not wait for them
                    time.sleep(0.5)
                    self.start()
                    return "raised", self._raised(rank, out), None
                continue
            except queue_module.Empty:
                pass
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive() and r not in got]
            if dead:
                time.sleep(0.5)  # let the other ranks' results arrive
                codes = {r: self.procs[r].exitcode for r in dead}
                self.start()
                return "crashed", f"rank(s) {dead} died, exit codes {codes}", None
            if time.monotonic() > deadline:
                self.start()
                return "hang", (f"ranks {sorted(set(range(self.world)) - set(got))} silent, no rank finished a step "
                                f"for {deadline_s} s"), None
        outs = [got[r] for r in range(self.world)]
        if all(o[0] == "unsupported" for o in outs):
            return "unsupported", outs[0][1], None
        raised = [(r, o) for r, o in enumerate(outs) if o[0] != "ok"]
        if raised:
            self.start()  # the group may be half broken: fresh processes for the next run
            return "raised", self._raised(*raised[0]), None
        # every rank tears its process group down before the next run; one that stalls there is
        # replaced (counted in self.teardown_stalls, not a failure of the run: its result is in)
        stop = time.monotonic() + 30.0
        while any((r, run) not in self.idle for r in range(self.world)) and time.monotonic() < stop:
            try:
                rank, r, out = self.results.get(timeout=0.2)
                if out[0] == "idle":
                    self.idle.add((rank, r))
            except queue_module.Empty:
                pass
        if any((r, run) not in self.idle for r in range(self.world)):
            self.teardown_stalls += 1
            self.start()
        vals = [o[1] for o in outs]
        if len({v["digest"] for v in vals}) != 1 or not all(v["finite"] for v in vals):
            return "wrong", "weights differ between ranks or are not finite", vals[0]["buckets"]
        return "ok", "", vals[0]["buckets"]


def measure(world, runs, hooks, log, deadline_s=12.0, progress=True):
    """{hook: {"runs", "failures", "kinds", "buckets", "unsupported", "first_error", "seconds"}}."""
    pool = Pool(world, log)
    out = {}
    run_id = 0
    try:
        for hook in hooks:
            t0 = time.monotonic()
            rec = {"runs": 0, "failures": 0, "kinds": {}, "buckets": set(), "unsupported": None, "first_error": None}
            for _ in range(runs):
                run_id += 1
                outcome, detail, buckets = pool.run(hook, run_id, deadline_s)
                if outcome == "unsupported":
                    rec["unsupported"] = detail
                    break
                rec["runs"] += 1
                if buckets is not None:
                    rec["buckets"].add(buckets)
                if outcome != "ok":
                    rec["failures"] += 1
                    rec["kinds"][outcome] = rec["kinds"].get(outcome, 0) + 1
                    rec["first_error"] = rec["first_error"] or f"{outcome}: {detail}"
            rec["seconds"] = time.monotonic() - t0
            rec["buckets"] = sorted(rec["buckets"])
            out[hook] = rec
            if progress:
                what = rec["unsupported"] and f"unsupported ({rec['unsupported']})" or \
                    f"{rec['failures']}/{rec['runs']} failed {rec['kinds'] or ''}"
                print(f"  {world} ranks {hook:26s} {what}  [{rec['seconds']:.0f} s, buckets {rec['buckets']}]"
                      + (f"\n      first: {rec['first_error'][:200]}" if rec["first_error"] else ""), flush=True)
        out["_starts"] = pool.starts
        out["_teardown_stalls"] = pool.teardown_stalls
    finally:
        for q in pool.tasks:
            q.put(None)
        time.sleep(0.5)
        pool.stop()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="runs of 2 ranks per hook")
    ap.add_argument("--runs4", type=int, default=20, help="runs of 4 ranks per hook")
    ap.add_argument("--hooks", default=",".join(GRADCOMP + BUILTIN))
    ap.add_argument("--deadline", type=float, default=12.0,
                    help="seconds without any rank finishing a step before a run counts as a hang (the gloo "
                         "timeout is 10 s: a collective that waits longer than that should have raised)")
    ap.add_argument("--log", default="ddp_failures_workers.log", help="the workers' stderr")
    args = ap.parse_args()
    hooks = [h for h in args.hooks.split(",") if h]
    t0 = time.monotonic()
    print(f"torch {torch.__version__}, gloo, {STEPS} steps a run, bucket_cap_mb {CAP_MB}, timeout {PG_TIMEOUT_S} s, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for world, runs in ((2, args.runs), (4, args.runs4)):
        if runs > 0:
            results[world] = measure(world, runs, hooks, args.log, args.deadline)
    tag = "torch" + torch.__version__.split("+")[0].replace(".", "_")
    print(f"\n{'hook':26s} " + " ".join(f"{f'{w} ranks':>16s}" for w in results))
    totals = {"gradcomp": [0, 0], "powersgd": [0, 0]}
    for hook in hooks:
        cells = []
        for world, res in results.items():
            rec = res[hook]
            if rec["unsupported"]:
                cells.append(f"{'unsupported':>16s}")
                continue
            cells.append(f"{rec['failures']:>7d}/{rec['runs']:<3d} {100 * rec['failures'] / max(1, rec['runs']):4.0f}%")
            print(f"RESULT torch_ddp_{hook}_failures_{world}r {rec['failures']}")  # of rec['runs'] (the table)
            key = "gradcomp" if hook.startswith("gradcomp_") else "powersgd" if "powersgd" in hook else None
            if key:
                totals[key][0] += rec["failures"]
                totals[key][1] += rec["runs"]
        print(f"{hook:26s} " + " ".join(cells))
    for key, name in (("gradcomp", "gradcomp_hook"), ("powersgd", "powersgd_builtin")):
        f, n = totals[key]
        if n:
            print(f"RESULT torch_ddp_{name}_failures {f}")
            print(f"RESULT torch_ddp_{name}_failure_rate_{tag} {f / n:.4f}")
            print(f"{name}: {f} failed of {n} runs on torch {torch.__version__}")
    print(f"total {time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}, pool (re)starts: "
          + ", ".join(f"{w} ranks {r['_starts']}" for w, r in results.items())
          + "; teardowns that stalled > 30 s after a finished run (pool replaced, not a failure): "
          + ", ".join(f"{w} ranks {r['_teardown_stalls']}" for w, r in results.items()))


if __name__ == "__main__":
    main()
