"""Multi-process torch.distributed (gloo, localhost) harness of the hook tests.

`spawn(world, fn, *args)` starts `world` processes (torch.multiprocessing,
spawn), each runs `fn(rank, world, *args)` inside a gloo process group whose
timeout is 10 s, and returns every rank's result in rank order; an exception
in a rank is returned as ("raised", type name, message, attributes)."""

from __future__ import annotations

import datetime
import hashlib
import os
import queue as queue_module
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PG_TIMEOUT_S = 10


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        result = ("ok", fn(rank, world, *args))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        attrs = {k: getattr(e, k) for k in ("rank", "reason", "parameter", "failures") if hasattr(e, k)}
        result = ("raised", type(e).__name__, str(e), attrs, traceback.format_exc())
    queue.put((rank, result))
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        pass


def spawn(world: int, fn, *args, timeout: float = 240.0):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            try:
                rank, result = queue.get(timeout=0.5)
                results[rank] = result
                continue
            except queue_module.Empty:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results))} did not report in {timeout} s")
            for r, p in enumerate(procs):  # a rank that exited without a result (killed, os._exit)
                if r not in results and not p.is_alive() and queue.empty():
                    results[r] = ("exited", p.exitcode)
    finally:
        # every rank has reported: give them a moment to leave, then end them (a process whose
        # backward raised inside a comm hook may not get through the process group's teardown)
        grace = time.monotonic() + 5
        for p in procs:
            p.join(timeout=max(0.1, grace - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]


def unwrap(results):
    """The values of results that must all be ("ok", value); fails with the rank's traceback otherwise."""
    for rank, r in enumerate(results):
        assert r[0] == "ok", f"rank {rank} raised {r[1]}: {r[2]}\n{r[4]}"
    return [r[1] for r in results]


class Net(torch.nn.Module):
    """A small conv net (about 31k parameters, 12 tensors): with bucket_cap_mb=0.02
    DDP splits it into at least 4 buckets."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3)
        self.conv2 = torch.nn.Conv2d(8, 16, 3)
        self.fc1 = torch.nn.Linear(256, 48)
        self.fc2 = torch.nn.Linear(48, 128)
        self.fc3 = torch.nn.Linear(128, 64)
        self.fc4 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        return self.fc4(x)


def data(rank: int, step: int, batch: int = 16):
    """A learnable task (is the top half brighter than the bottom half?); each rank its own samples."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(batch, 1, 12, 12, generator=g)
    return x, (x[:, :, :6].mean((1, 2, 3)) > x[:, :, 6:].mean((1, 2, 3))).long()


def eval_loss(model) -> float:
    x, y = data(999, 999, 256)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def digest(model) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()
