"""Per-rank bodies of the hook tests (run by ddp_harness.spawn in each process)."""

from __future__ import annotations

import copy
import io
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as gt
from ddp_harness import Net, data, digest, eval_loss

CAP_MB = 0.02
TORCH_MAJOR = int(torch.__version__.split(".")[0])  # DDP bucket cap: the test net spreads over >= 4 buckets


def make_state(codec: str, model):
    if codec == "dense":
        return gt.DenseState(model)
    if codec == "gradiveq":  # a short schedule: warm-up 3, L_t 4 (QSGD sampling), then compressed steps
        return gt.GradiVeQState(model, warmup_iterations=3, sampling_iterations=4, compressed_iterations=50)
    if codec == "gradiveq_ef_spread":  # error feedback, L_t spread: steps 7-9 compressed, then C S C S C S S
        return gt.GradiVeQState(model, warmup_iterations=3, sampling_iterations=4, compressed_iterations=3,
                                error_feedback=True, spread_sampling=True)
    if codec == "gradiveq_efq_spread":  # the same, the max-norm sampler's own rounding fed back too
        return gt.GradiVeQState(model, warmup_iterations=3, sampling_iterations=4, compressed_iterations=3,
                                error_feedback=True, spread_sampling=True, sampling_qsgd_norm="max",
                                sampling_error_feedback=True)
    if codec == "gradiveq_ef_spread_hostfit":  # the same, each fit run on one rank of the host, read by the others
        return gt.GradiVeQState(model, warmup_iterations=3, sampling_iterations=4, compressed_iterations=3,
                                error_feedback=True, spread_sampling=True, fit_sharing="host", fit_timeout=4.0)
    if codec == "qsgd":
        return gt.QSGDState(model, bits=4)
    if codec == "two_bit":
        return gt.TwoBitState(model, auto_scale=1.0)
    if codec == "top_k":
        return gt.TopKState(model, ratio_percent=10.0)
    if codec == "powersgd":  # rank 2, compressed from step 3 on (conv2, fc1-fc3; fc4 and 1-D parameters dense)
        return gt.PowerSGDState(model, rank=2, start_iter=3)
    if codec == "fp16":
        return gt.FP16State(model)
    if codec == "bf16":
        return gt.BF16State(model)
    if codec == "homomorphic":
        return gt.HomomorphicState(model)
    raise ValueError(codec)


def build(codec, seed=0):
    # torch before 2.x caps DDP's first bucket at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) whatever
    # bucket_cap_mb says (and says to set it to tune it): the same small cap for every bucket here
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * 1024 * 1024)
    torch.manual_seed(seed)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    state = make_state(codec, model)
    buckets = set()

    def counting_hook(st, bucket):
        buckets.add(bucket.index())
        return gt.hook(st, bucket)

    ddp.register_comm_hook(state, counting_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, state, opt, buckets


def steps(rank, ddp, opt, first, last, salt=0):
    for step in range(first, last):
        x, y = data(rank, step + salt)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def train(rank, world, codec, n_steps=20, runs=1):
    """`runs` trainings of `n_steps` steps; per run: the weights' digest, losses, buckets, stats."""
    out = []
    for run in range(runs):
        model, ddp, state, opt, buckets = build(codec, seed=run)
        loss0 = eval_loss(model)
        t0 = time.perf_counter()
        steps(rank, ddp, opt, 0, n_steps, salt=100 * run)
        out.append({"digest": digest(model), "loss0": loss0, "loss": eval_loss(model), "buckets": len(buckets),
                    "stats": dict(state.stats), "phases": sorted(set(state.phases().values())),
                    "step_ms": 1000 * (time.perf_counter() - t0) / n_steps})
    return out


def resume(rank, world, codec, total=12, stop=6, load_hook_state=True):
    """The digest of an uninterrupted run of `total` steps, and of a run stopped at
    `stop`, checkpointed (model, optimizer, hook state through torch.save), rebuilt and resumed."""
    model, ddp, state, opt, _ = build(codec)
    steps(rank, ddp, opt, 0, total)
    full = digest(model)
    full_params = {n: p.detach().clone() for n, p in model.named_parameters()}

    model, ddp, state, opt, _ = build(codec)
    steps(rank, ddp, opt, 0, stop)
    blob = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, blob)
    del model, ddp, state, opt

    model, ddp, state, opt, _ = build(codec)
    blob.seek(0)
    ck = torch.load(blob)  # weights_only (the default since torch 2.6): the hook state is plain bytes
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    if load_hook_state:
        state.load_state_dict(ck["hook"])
    steps(rank, ddp, opt, stop, total)
    diff = max(float((p.detach() - full_params[n]).abs().max()) for n, p in model.named_parameters())
    return full, digest(model), sorted(ck["hook"]["params"]), diff


def resume_all(rank, world, codecs):
    """resume() for each codec, and for two-bit once more without loading the hook state (the control)."""
    # gradiveq_ef_spread stops in L_c, its error-feedback memory held, and resumes through a spread cycle;
    # gradiveq_efq_spread stops right after L_t, holding only the sampler's rounding, which the next
    # (compressed) step must send
    steps_of = {"gradiveq_ef_spread": {"total": 16, "stop": 9}, "gradiveq_efq_spread": {"total": 16, "stop": 7},
                "gradiveq_ef_spread_hostfit": {"total": 16, "stop": 9}}
    out = {codec: resume(rank, world, codec, **steps_of.get(codec, {})) for codec in codecs}
    out["two_bit without hook state"] = resume(rank, world, "two_bit", load_hook_state=False)
    return out


def nan_all(rank, world, codecs):
    return {codec: nan_on_one_rank(rank, world, codec) for codec in codecs}


def nan_on_one_rank(rank, world, codec, bad_rank=1, bad_step=3):
    model, ddp, state, opt, _ = build(codec)
    for step in range(bad_step + 2):
        if rank == bad_rank and step == bad_step:
            model.fc2.weight.register_hook(lambda g: g * float("nan"))
        x, y = data(rank, step)
        opt.zero_grad()
        try:
            loss = F.cross_entropy(ddp(x), y)
            if TORCH_MAJOR >= 2:
                loss.backward()  # torch 2.x hands the hook's exception to backward() unchanged
            else:
                gt.backward(loss, state)  # torch 1.13 wraps it in a RuntimeError
        except gradcomp.ExchangeFailure as e:
            return {"step": step, "message": str(e), "rank": e.rank, "reason": e.reason, "parameter": e.parameter,
                    "type": type(e).__name__}
        opt.step()
    return {"step": None}


def dead_rank(rank, world, codec, dead=1, at_step=2):
    """Rank `dead` exits at `at_step`; the others must raise within the process group's timeout."""
    model, ddp, state, opt, _ = build(codec)
    for step in range(at_step + 2):
        if rank == dead and step == at_step:
            os._exit(0)
        x, y = data(rank, step)
        opt.zero_grad()
        t0 = time.perf_counter()
        try:
            F.cross_entropy(ddp(x), y).backward()
        except Exception as e:  # noqa: BLE001 - gloo's error type varies between versions
            return {"step": step, "seconds": time.perf_counter() - t0, "error": type(e).__name__}
        opt.step()
    return {"step": None}


def readme_example(rank, world, code, workdir):
    os.chdir(workdir)
    scope = {"__name__": "readme_example"}
    exec(compile(code, "README.md", "exec"), scope)
    state = scope["state"]
    return {"hook_calls": state.stats["hook_calls"],
            "digest": digest(scope["model"])}


def train_new_codecs(rank, world, codecs, n_steps=20):
    """train() for each codec; a 16-bit codec whose dtype the backend cannot all_reduce: "unsupported"."""
    out = {}
    for codec in codecs:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(codec)
        if dtype is not None and not gt.supports_all_reduce(dtype):
            # the state says so in its first backward, with a gradcomp.TransportError on every rank
            model, ddp, state, opt, _ = build(codec)
            x, y = data(rank, 0)
            try:
                gt.backward(F.cross_entropy(ddp(x), y), state)
                raised = "nothing"
            except gradcomp.TransportError as e:
                raised = "TransportError" if "cannot all_reduce" in str(e) else str(e)
            out[codec] = (f"unsupported: gloo on torch {torch.__version__} cannot all_reduce {dtype} "
                          f"(the state raised {raised})")
            continue
        out[codec] = train(rank, world, codec, n_steps)[0]
    return out


def resume_powersgd(rank, world):
    return {"with": resume(rank, world, "powersgd"), "without": resume(rank, world, "powersgd", load_hook_state=False)}


class HostBucket:
    """A CPU twin of a DDP GradBucket: a host copy of its buffer, the twin model's parameters."""

    def __init__(self, bucket, params):
        self._buffer = bucket.buffer().detach().cpu().clone()
        self._params = params
        self._index = bucket.index()

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def index(self):
        return self._index


def cuda_against_host(rank, world, codecs, n_steps=8, device_type="cuda"):
    """Per codec: DDP on CUDA (one GPU shared by the ranks when there is only one) with the codec's
    hook, and beside it a twin state on a CPU copy of the model that gets a host copy of every bucket
    before the hook runs. The CUDA bucket's mean must equal the twin's bit for bit (the hook copies
    a CUDA bucket to the host and runs the CPU code), and the ranks must end with the same weights."""
    cuda = device_type == "cuda"  # "cpu": the same harness on CPU buckets (a check of the harness itself)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = int(CAP_MB * 1024 * 1024)
    out = {}
    for codec in codecs:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(codec)
        if dtype is not None and not gt.supports_all_reduce(dtype):
            out[codec] = f"unsupported: gloo on torch {torch.__version__} cannot all_reduce {dtype}"
            continue
        torch.manual_seed(0)
        host_model = Net()
        model = copy.deepcopy(host_model).to(device)
        ddp = DDP(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=CAP_MB)
        state, twin = make_state(codec, model), make_state(codec, host_model)
        twin_params = dict(host_model.named_parameters())
        names = {id(p): n for n, p in model.named_parameters()}
        checked, differing = [], []

        def twin_hook(st, bucket):
            host = HostBucket(bucket, [twin_params[names[id(p)]] for p in bucket.parameters()])
            fut = gt.hook(st, bucket)
            expected = gt.hook(twin, host).value()
            got = fut.value()
            checked.append(got.device.type)
            if not torch.equal(got.detach().cpu(), expected):
                differing.append(bucket.index())
            return fut

        ddp.register_comm_hook(state, twin_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for step in range(n_steps):
            x, y = data(rank, step)
            opt.zero_grad()
            F.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()
        out[codec] = {"digest": digest(model.cpu()), "devices": sorted(set(checked)), "buckets": len(checked),
                      "differing": differing, "phases": sorted(set(state.phases().values()))}
    return out


def compression_loss(rank, world, n_steps=10):
    """GradiVeQ's eq. 7 report: after a warm-up step (expected empty) and after the last step (L_c),
    with this rank's own gradient of that step computed beside DDP's backward (no hook runs for it)."""
    model, ddp, state, opt, _ = build("gradiveq")
    steps(rank, ddp, opt, 0, 1)
    warmup_report = state.compression_loss()
    warmup_relative = state.relative_compression_loss()
    steps(rank, ddp, opt, 1, n_steps - 1)
    x, y = data(rank, n_steps - 1)
    names = [n for n, _ in model.named_parameters()]
    local = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    own_energy = {n: float(g.double().pow(2).sum()) for n, g in zip(names, local)}
    opt.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    opt.step()
    return {"warmup": warmup_report, "warmup_relative": warmup_relative, "last": state.compression_loss(), "own_energy": own_energy,
            "phases": state.phases(), "relative": state.relative_compression_loss()}


def fit_sharing(rank, world, n_steps=16):
    """GradiVeQ with and without fit sharing on the host: the weights' digests and the hook states."""
    out = {}
    for codec in ("gradiveq_ef_spread", "gradiveq_ef_spread_hostfit"):
        model, ddp, state, opt, _ = build(codec)
        steps(rank, ddp, opt, 0, n_steps)
        out[codec] = {"digest": digest(model), "hook": state.state_dict()["params"], "stats": dict(state.stats),
                      "members": getattr(state, "fit_sharing_members", None),
                      "directory": state._fit_sharing.directory if state._fit_sharing is not None else None}
        del model, ddp, state, opt
    return out


class _FailingFits:
    """DDPBuckets whose fit() raises (the error file's path of fit sharing)."""

    def __init__(self, ex):
        self._ex = ex

    def __getattr__(self, name):
        return getattr(self._ex, name)

    def fit(self, name):
        raise gradcomp.StateError(f"injected: the fit of {name} failed")


def fit_sharing_failure(rank, world, mode, bad_rank=1, n_steps=12):
    """Fit sharing where rank `bad_rank` dies before writing its bases (mode "dead") or its fit raises
    ("raise"): the type, message and seconds of what every rank raised, or None."""
    model, ddp, state, opt, _ = build("gradiveq_ef_spread_hostfit")
    sharing = state._fit_sharing
    if rank == bad_rank and mode == "dead":
        sharing._write = lambda *a: os._exit(0)
    # "raise": the failing rank removes its files (what its exit does) before the others read, every time
    peer_gone = os.path.join(sharing.directory, f"m{sharing.members.index(1 - bad_rank)}-test-peer-gone")
    if rank == bad_rank and mode == "raise":
        run = sharing.run
        sharing.run = lambda ex: run(_FailingFits(ex))
    if rank != bad_rank and mode == "raise":
        read = sharing._read

        def read_after_peer_exit(seq, index):
            while not (os.path.exists(peer_gone) or os.path.exists(sharing._path(seq, index))):
                time.sleep(0.001)
            return read(seq, index)
        sharing._read = read_after_peer_exit
    for step in range(n_steps):
        x, y = data(rank, step)
        opt.zero_grad()
        t0 = time.perf_counter()
        try:
            loss = F.cross_entropy(ddp(x), y)
            if TORCH_MAJOR >= 2:
                loss.backward()
            else:
                gt.backward(loss, state)
        except gradcomp.Error as e:
            if rank == bad_rank and mode == "raise":
                sharing._finalizer()
                os.makedirs(sharing.directory, exist_ok=True)
                open(peer_gone, "wb").close()
            return {"step": step, "type": type(e).__name__, "message": str(e), "seconds": time.perf_counter() - t0}
        opt.step()
    return None
