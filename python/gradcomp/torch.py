"""DistributedDataParallel comm hooks over gradcomp's bucket layer (docs/python.md).

One state object per codec (``DenseState``, ``GradiVeQState``, ``QSGDState``,
``TwoBitState``, ``TopKState``, ``PowerSGDState``, ``FP16State``, ``BF16State``,
``HomomorphicState``), registered with::

    ddp.register_comm_hook(state, gradcomp.torch.hook)

How a DDP bucket is exchanged:

- Every parameter has its own bucket layer (a one-layer plan whose seed is
  mixed from the parameter's name), held by the C++ ``gradcomp._core.DDPBuckets``,
  so codec memory (residuals, QSGD streams, GradiVeQ bases and schedule) is
  keyed by parameter name and does not depend on how DDP groups parameters into
  buckets: a bucket rebuild keeps it.
- One C++ call per DDP bucket and round: ``DDPBuckets.begin`` checks and
  encodes every parameter of the bucket and returns the first round's
  collectives, ``complete`` absorbs them and returns the next round's,
  ``finish`` writes the mean. Python only issues the collectives. Per round
  ONE collective per kind of round present (``all_reduce`` SUM of the
  summable buffers of one element type, control blocks included, concatenated;
  ``all_reduce`` MAX; one ``all_gather`` of every rank's payloads packed into
  one padded byte tensor). The bucket layer checks every reduced buffer after
  the sum. A round's ``element`` says how its float32 cells are reduced:
  ``float32`` as they are; ``float16`` / ``bfloat16`` converted (exactly) to a
  ``torch.float16`` / ``torch.bfloat16`` tensor and summed by the process
  group in that type (its own 16-bit sum), then converted back; ``int32_words``
  (uint32 bit patterns in the cells) viewed as ``torch.int32`` without a value
  conversion and summed as integers (wrap-around mod 2^32 is the codec's sum).
- The all-gather pads to a capacity every rank agrees on (the largest packed
  size seen in the bucket's last 16 steps, or the dense size the first time);
  a rank whose payloads do not fit says so in the 8-byte size header of the
  same collective, and every rank then repeats it once with the larger
  capacity (counted in ``stats['extra_collectives']``).
- Collective order: the hook issues its collectives synchronously and waits
  for each inside the hook, and returns an already completed Future. DDP calls
  the hook in bucket order on every rank, so every rank issues the same
  collectives in the same order (no callback can reorder them).
- Failures: a rank whose bucket holds a NaN or Inf flags every parameter of
  the bucket in the control block of the first round; every rank learns it
  from the same collective and every rank raises the same
  ``gradcomp.ExchangeFailure`` (the codec states of the bucket are rolled back).
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
import uuid
import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import _core

__all__ = [
    "CompressionState", "DenseState", "GradiVeQState", "QSGDState", "TwoBitState", "TopKState", "PowerSGDState",
    "FP16State", "BF16State", "HomomorphicState", "backward", "hook", "supports_all_reduce", "STATE_FORMAT",
    "GRADIVEQ_PLUS",
]

#: Version of the dict that ``state_dict()`` returns.
STATE_FORMAT = 1


#: torch dtype of the 16-bit elements of a sum round (Round.element).
_DTYPE_16 = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def supports_all_reduce(dtype: torch.dtype, process_group=None) -> bool:
    """Whether the process group's backend can all_reduce (SUM) a tensor of ``dtype``.

    A collective: every rank of the group must call it. gloo on torch 1.13, for
    example, has no bfloat16 sum, so ``BF16State`` cannot run there."""
    t = torch.zeros(2, dtype=dtype)
    try:
        dist.all_reduce(t, group=process_group)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


class CompressionState:
    """State of a gradcomp comm hook: one bucket layer per parameter, keyed by name.

    ``model``: the module (or the DDP wrapper) whose parameters the buckets hold.
    ``process_group``: the group of the collectives (None: the default group).
    ``seed``: mixed with each parameter's name and the rank into every rounding stream.
    ``small`` / ``small_below``: the codec of 1-D parameters and of those under
    ``small_below`` elements (plan_rules.small); ``options``: raw plan options
    (docs/python.md lists the keys).
    """

    codec = "dense"
    _aliases: Dict[str, str] = {}
    _default_small: Optional[str] = None  # None: the state's own codec
    _matrix_view = False  # 2-D weights as add_matrix (PowerSGD's rows x cols view) rather than add_dense

    def __init__(self, model: torch.nn.Module, process_group=None, *, seed: int = 0, small: Optional[str] = None,
                 small_below: Optional[int] = None, options: Optional[dict] = None, **codec_options):
        module = getattr(model, "module", model)
        self.process_group = process_group
        self._names: Dict[int, str] = {}
        for name, p in module.named_parameters():
            if p.requires_grad:
                self._names[id(p)] = name
        self._by_ptr: Optional[Dict[int, str]] = None
        self._module = module
        plan = {"conv": self.codec, "fallback": self.codec, "small": small or self._default_small or self.codec}
        if small_below is not None:
            plan["small_below"] = small_below
        for key, value in codec_options.items():
            if key not in self._aliases:
                raise _core.InvalidArgument(
                    f"gradcomp: {type(self).__name__} has no option '{key}' (options: {sorted(self._aliases)})")
            plan[self._aliases[key]] = value
        plan.update(options or {})
        self._plan_options = plan
        self._seed = int(seed)
        self._ex: Optional[_core.DDPBuckets] = None  # made at the first hook call (needs the rank)
        self._bucket_ids: Dict[tuple, int] = {}
        self._bucket_names: Dict[int, List[str]] = {}
        self._pending: Dict[str, bytes] = {}
        #: The ExchangeFailure the hook raised last (torch 1.x's DDP hands a hook's exception to
        #: backward() as a RuntimeError holding only its text: gradcomp.torch.backward re-raises this one).
        self.failure: Optional[_core.ExchangeFailure] = None
        self._rank: Optional[int] = None
        self._ranks: Optional[int] = None
        self._fit_sharing: Optional[_HostFits] = None  # GradiVeQState(fit_sharing="host") on a shared host
        self.stats = {"hook_calls": 0, "collectives": 0, "extra_collectives": 0, "bytes_sent": 0,
                      "hook_seconds": 0.0, "comm_seconds": 0.0}
        self._validate()

    # -- options --------------------------------------------------------------
    def _validate(self) -> None:
        """Builds every codec of the plan once, so that an invalid codec option
        raises gradcomp.InvalidArgument here rather than in the first backward()."""
        md = _core.ModelDescription()
        md.add_conv("gradcomp.validate.conv", 8, 8, 3, 3)
        md.add_dense("gradcomp.validate.dense", 8192, 2)
        md.add_dense("gradcomp.validate.bias", 8, 1)
        if self._matrix_view:
            md.add_matrix("gradcomp.validate.matrix", 64, 128)
        _core.BucketLayer(_core.Plan(md, dict(self._plan_options, seed=0)), 0, 2, "skip")

    # -- ranks and layers -----------------------------------------------------
    def _ensure_group(self) -> _core.DDPBuckets:
        if self._ex is None:
            self._rank = dist.get_rank(self.process_group)
            self._ranks = dist.get_world_size(self.process_group)
            self._ex = _core.DDPBuckets(self._plan_options, self._seed & 0xFFFFFFFFFFFFFFFF, self._rank, self._ranks,
                                        self._matrix_view, self._fit_sharing is not None)
            for name, blob in self._pending.items():
                self._ex.restore(name, blob)
            self._pending.clear()
        return self._ex

    def _name_of(self, p: torch.Tensor) -> str:
        name = self._names.get(id(p))
        if name is not None:
            return name
        if self._by_ptr is None:
            self._by_ptr = {q.data_ptr(): n for n, q in self._module.named_parameters()}
        name = self._by_ptr.get(p.data_ptr())
        if name is None:
            raise _core.LayoutError("gradcomp: a DDP bucket holds a parameter that is not in the model given to "
                                    f"{type(self).__name__} (shape {tuple(p.shape)})")
        return name

    def _bucket_id(self, params) -> int:
        """The C++ side's id of a DDP bucket (its parameters' names and shapes), cached by the
        parameters' identities: one dict lookup per hook call once known."""
        key = tuple(map(id, params))
        bid = self._bucket_ids.get(key)
        if bid is None:
            names = [self._name_of(p) for p in params]
            bid = self._ex.bucket(names, [list(p.shape) for p in params])
            self._bucket_ids[key] = bid
            self._bucket_names[bid] = names
        return bid

    # -- checkpoints ----------------------------------------------------------
    def state_dict(self) -> dict:
        """Every parameter's codec memory (its bucket layer's checkpoint), keyed by name."""
        params = dict(self._pending)
        if self._ex is not None:
            params.update(self._ex.save_states())
        return {"format": STATE_FORMAT, "codec": self.codec, "params": params}

    def load_state_dict(self, state: dict) -> None:
        """Restores a ``state_dict()`` of the same codec, options, world size and rank.

        A checkpoint of another codec or of parameters the model does not have raises
        gradcomp.LayoutError; of other options gradcomp.LayoutError (another plan),
        of another world size or rank gradcomp.OptionMismatch; damaged bytes
        gradcomp.WireError (parameters seen so far keep their state then)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or "params" not in state:
            raise _core.LayoutError("gradcomp: not a gradcomp.torch state_dict (format %r)" % (
                state.get("format") if isinstance(state, dict) else None))
        if state.get("codec") != self.codec:
            raise _core.LayoutError(f"gradcomp: a state_dict of codec '{state.get('codec')}' cannot be loaded into "
                                    f"{type(self).__name__} (codec '{self.codec}')")
        known = set(self._names.values())
        unknown = sorted(set(state["params"]) - known)
        if unknown:
            raise _core.LayoutError(f"gradcomp: the state_dict holds parameters the model does not have: {unknown[:5]}")
        for name, blob in state["params"].items():
            if self._ex is not None:
                self._ex.restore(name, bytes(blob))
            else:
                self._pending[name] = bytes(blob)
        if self._ex is not None:
            self._ex.clear_history()

    # -- the hook -------------------------------------------------------------
    def _run(self, bucket) -> torch.futures.Future:
        t0 = time.perf_counter()
        ex = self._ex if self._ex is not None else self._ensure_group()
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise _core.InvalidArgument(f"gradcomp: the hooks take float32 gradients, this bucket holds {buf.dtype}")
        bid = self._bucket_id(bucket.parameters())
        on_host = buf.device.type == "cpu"
        host = buf.detach() if on_host else buf.detach().cpu()  # CUDA: a host copy
        flat = host.numpy()
        comm = 0.0
        requests = ex.begin(bid, flat)  # one C++ call: checks and encodes every parameter of the bucket
        try:
            while requests:  # one collective per request, then one C++ call that absorbs them all
                gathered = None
                c0 = time.perf_counter()
                for op, element, array in requests:
                    if op == "all_gather":
                        gathered = self._all_gather(array)
                    else:
                        self._reduce(op, element, array)
                comm += time.perf_counter() - c0
                requests = ex.complete(gathered)
        except BaseException:
            ex.abandon()
            raise
        failed = ex.finish(flat)  # writes the mean into the bucket
        if failed is not None:
            self.failure = self._failure(bucket.index(), failed)
            raise self.failure
        if self._fit_sharing is not None:  # the fits this step's end of L_t left pending, shared on the host
            try:
                fitted, adopted = self._fit_sharing.run(ex)
                self.stats["fits_run"] += fitted
                self.stats["fits_adopted"] += adopted
            except _core.Error as e:
                self.failure = e
                raise
        if not on_host:  # (detach() is a new tensor object over the same memory: no copy on the host)
            buf.copy_(host)
        stats = self.stats
        stats["hook_calls"] += 1
        stats["hook_seconds"] += time.perf_counter() - t0
        stats["comm_seconds"] += comm
        stats["extra_collectives"] = ex.extra_collectives
        # a CUDA bucket's future names its device: it then records the current stream, on which the
        # copy back above ran, and a consumer on another stream waits for it (DDP itself uses the
        # current stream; a future without devices also passed the CUDA test, torch 2.11)
        fut = torch.futures.Future(devices=[buf.device]) if buf.device.type == "cuda" else torch.futures.Future()
        fut.set_result(buf)
        return fut

    def _reduce(self, op: str, element: str, joined: np.ndarray) -> None:
        """One all_reduce (SUM or MAX) of a round's concatenated buffers, in place, as ``element``."""
        reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
        if element == "float32":
            dist.all_reduce(torch.from_numpy(joined), op=reduce_op, group=self.process_group)
            wire = 4
        elif element in _DTYPE_16:
            # the cells are exactly representable in the 16-bit type: the conversion is exact, and the
            # process group sums in that type (rounding as its own 16-bit sum does)
            dtype = _DTYPE_16[element]
            t = torch.from_numpy(joined).to(dtype)
            try:
                dist.all_reduce(t, op=reduce_op, group=self.process_group)
            except RuntimeError as e:
                if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                    raise
                # the same on every rank (every rank issued the same collective); gradcomp.torch.backward
                # re-raises it as itself on torch 1.x, like an ExchangeFailure
                self.failure = _core.TransportError(
                    f"gradcomp: the process group cannot all_reduce {dtype} tensors "
                    f"(unsupported by its backend on torch {torch.__version__}?): {e}")
                raise self.failure from e
            joined[:] = t.to(torch.float32).numpy()
            wire = 2
        elif element == "int32_words":
            if op != "sum":
                raise _core.InvalidArgument(f"gradcomp: a {op} round of int32 words")
            # the cells hold uint32 bit patterns: a view (no value conversion), summed as int32 words;
            # two's complement wrap-around gives the codec's sum mod 2^32
            dist.all_reduce(torch.from_numpy(joined.view(np.int32)), op=reduce_op, group=self.process_group)
            wire = 4
        else:
            raise _core.InvalidArgument(f"gradcomp: a round of unknown element type '{element}'")
        self.stats["collectives"] += 1
        self.stats["bytes_sent"] += wire * joined.size

    def _all_gather(self, send: np.ndarray) -> list:
        """One all_gather of the padded byte array (size header + packed payloads); every rank's, rank order."""
        t = torch.from_numpy(send)
        out = [torch.empty_like(t) for _ in range(self._ranks)]
        dist.all_gather(out, t, group=self.process_group)
        self.stats["collectives"] += 1
        self.stats["bytes_sent"] += send.nbytes
        return [o.numpy() for o in out]

    def _failure(self, index: int, failed: list) -> _core.ExchangeFailure:
        """The same ExchangeFailure on every rank: built only from the agreed control blocks."""
        entries = []
        for name, failures, _ in failed:
            for rank, reason, _ in failures:
                entries.append((rank, reason, name))
        real = [e for e in entries if e[1] != "skip requested"] or entries
        rank, reason, name = real[0]
        who = f"rank {rank}" if rank >= 0 else "the sum"
        exc = _core.ExchangeFailure(f"gradcomp: DDP bucket {index} failed: {who}: {reason} in parameter '{name}'"
                                    + (f" (and {len(real) - 1} more)" if len(real) > 1 else ""))
        exc.rank = rank
        exc.reason = reason
        exc.parameter = name
        exc.failures = real
        exc.local_detail = "; ".join(detail for _, _, detail in failed if detail)
        return exc

    # -- reporting ------------------------------------------------------------
    def phases(self) -> Dict[str, str]:
        """The phase of every parameter's codec ('dense', 'gradiveq:compressed', ...)."""
        return dict(self._ex.phases()) if self._ex is not None else {}

    def overhead(self) -> dict:
        """Seconds spent in the hook, split: ``comm`` (waiting in the process group's collectives),
        ``encode`` / ``decode`` (gradcomp's C++: checks, encodes, absorbs, decodes, the mean, fits) and
        ``python`` (the rest: the hook's Python, tensor wrapping, 16-bit conversions); ``own`` is the hook's
        own cost, everything but ``comm``."""
        total, comm = self.stats["hook_seconds"], self.stats["comm_seconds"]
        enc = self._ex.encode_seconds if self._ex is not None else 0.0
        dec = self._ex.decode_seconds if self._ex is not None else 0.0
        return {"total": total, "comm": comm, "encode": enc, "decode": dec,
                "python": max(0.0, total - comm - enc - dec), "own": total - comm}

    def register(self, ddp_model) -> "CompressionState":
        """``ddp_model.register_comm_hook(self, hook)``; returns self."""
        ddp_model.register_comm_hook(self, hook)
        return self


def hook(state, bucket):  # no annotations: DDP checks them, and `from __future__ import annotations` makes strings
    """The comm hook of every gradcomp state: ``ddp.register_comm_hook(state, gradcomp.torch.hook)``."""
    return state._run(bucket)


def backward(loss: torch.Tensor, *states: CompressionState) -> None:
    """``loss.backward()`` that raises a hook's ``gradcomp.ExchangeFailure`` (or the
    ``gradcomp.TransportError`` of a 16-bit dtype the backend cannot sum) as itself.

    torch 2.x passes the exception a comm hook raised through ``backward()``
    unchanged; torch 1.13's DDP turns it into a ``RuntimeError`` carrying only
    its text. This re-raises the state's own exception object in that case."""
    for s in states:
        s.failure = None
    try:
        loss.backward()
    except RuntimeError as e:
        if isinstance(e, _core.Error):
            raise
        for s in states:
            if s.failure is not None:
                failure, s.failure = s.failure, None
                raise failure from e
        raise


def _host_key() -> str:
    """What identifies this machine (and its /dev/shm) to the other ranks: host name and boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _remove_files(directory: str, prefix: str) -> None:
    """Removes this rank's files (names starting with ``prefix``) from ``directory``, then the directory
    itself if it is empty (the last rank of the host to go removes it)."""
    try:
        for name in os.listdir(directory):
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass
        os.rmdir(directory)
    except OSError:
        pass


class _HostFits:
    """GradiVeQ fits shared by the ranks of one host (``GradiVeQState(fit_sharing="host")``).

    At the end of L_t every rank has the same samples, so every rank would fit the same bases. Here each
    pending parameter's fit is given to one rank of the host (``owners``: the same assignment on every
    rank, from the fits' ``work``, which every rank computes alike), that rank runs it (``DDPBuckets.fit``) and writes the
    bases to a file in a directory of its own host's ``/dev/shm``, and the others read them and adopt them
    (``DDPBuckets.adopt_fit``, which checks they are the fit it expects). A file is written under a temporary
    name and renamed, so a reader never sees half of one. A rank whose fit raised writes the error instead,
    one copy per other rank of the host under that rank's own name (the failing rank exits at once and
    removes its files; the copy stays until its reader has read it, or exits), and every rank of the host
    raises it. A rank that waits longer than ``timeout`` for another's file
    raises gradcomp.TimeoutError (that rank died, or hangs). Each rank removes its previous exchange's file
    when it writes the next (every rank of the host has read it by then: a collective of a later step
    needed them all), and its files when the state is garbage-collected or the process exits.
    """

    _MAGIC = b"GCFB"

    def __init__(self, process_group, timeout: float):
        rank = dist.get_rank(process_group)
        world = dist.get_world_size(process_group)
        key = _host_key()
        info: List = [None] * world
        dist.all_gather_object(info, (key, uuid.uuid4().hex if rank == 0 else None), group=process_group)
        token = info[0][1]
        members = [r for r, (k, _) in enumerate(info) if k == key]
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        self.directory = os.path.join(base, f"gradcomp-fits-{token}")
        self.timeout = timeout
        self.index = members.index(rank)
        self._prefix = f"m{self.index}-"
        self._seq = 0
        ok = True
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with open(os.path.join(self.directory, f"{self._prefix}probe"), "wb"):
                pass
        except OSError:
            ok = False
        seen: List = [None] * world
        dist.all_gather_object(seen, ok, group=process_group)
        if all(seen[r] for r in members):  # every member can write: can every member read the others' probes?
            visible = all(os.path.exists(os.path.join(self.directory, f"m{i}-probe")) for i in range(len(members)))
        else:
            visible = False
        dist.all_gather_object(seen, visible, group=process_group)
        if ok:
            os.unlink(os.path.join(self.directory, f"{self._prefix}probe"))
        # a host whose ranks do not all see one directory (another mount namespace) shares nothing
        self.members = members if all(seen[r] for r in members) else [rank]
        self._finalizer = weakref.finalize(self, _remove_files, self.directory, self._prefix)
        if len(self.members) == 1:
            self._finalizer()

    def _path(self, seq: int, index: int) -> str:
        return os.path.join(self.directory, f"m{index}-{seq}")

    def owners(self, pending, seq: int) -> Dict[str, int]:
        """Parameter name -> member index that fits it: largest fit first, to the least loaded member of
        this exchange (every rank waits for the slowest, so each exchange is balanced on its own), ties to
        the member after the one that took the largest fit last time (a bucket with one GradiVeQ parameter,
        or the largest layer, goes to another rank each time)."""
        m_count = len(self.members)
        load = [0.0] * m_count
        owner = {}
        for name, work in sorted(pending, key=lambda p: (-p[1], p[0])):
            m = min(range(m_count), key=lambda i: (load[i], (i - seq) % m_count))
            owner[name] = m
            load[m] += work
        return owner

    def run(self, ex) -> Tuple[int, int]:
        """Runs or adopts every pending fit; (fits run here, fits adopted)."""
        pending = ex.pending_fits()
        if not pending:
            return 0, 0
        seq, self._seq = self._seq, self._seq + 1
        owner = self.owners(pending, seq)
        mine, error = [], None
        for name, _ in pending:
            if owner[name] != self.index:
                continue
            try:
                mine.append((name, ex.fit(name)))
            except _core.Error as e:
                error = e
                break
        if error is not None:
            self._write_error(seq, error)
        elif mine:
            self._write(seq, mine)
        if seq > 0:
            try:
                os.unlink(self._path(seq - 1, self.index))
            except OSError:
                pass
        if error is not None:
            raise error
        adopted = 0
        for index in sorted({m for m in owner.values() if m != self.index}):
            for name, bases in self._read(seq, index):
                ex.adopt_fit(name, bases)
                adopted += 1
        if adopted + len(mine) != len(pending):
            raise _core.StateError(f"gradcomp: fit sharing: {len(pending)} fits were pending, {len(mine)} run here "
                                   f"and {adopted} adopted")
        return len(mine), adopted

    def _error_path(self, seq: int, reader: int, writer: int) -> str:
        """Where member `writer` leaves its error of exchange `seq` for member `reader`: under the reader's
        prefix, so that the writer's exit does not remove it before the reader has read it."""
        return os.path.join(self.directory, f"m{reader}-error-from-m{writer}-{seq}")

    def _encode(self, fits, error) -> bytes:
        parts = [self._MAGIC]
        if error is not None:
            kind, text = type(error).__name__.encode(), str(error).encode()
            parts.append(struct.pack("<BII", 1, len(kind), len(text)) + kind + text)
        else:
            parts.append(struct.pack("<BI", 0, len(fits)))
            for name, bases in fits:
                raw = name.encode()
                parts.append(struct.pack("<IQ", len(raw), len(bases)) + raw)
                parts.append(bases)
        return b"".join(parts)

    def _publish(self, final: str, data: bytes) -> None:
        """Writes under this rank's temporary name, then renames: a reader sees all of the file or none."""
        temporary = os.path.join(self.directory, f"{self._prefix}tmp")
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, final)

    def _write(self, seq: int, fits) -> None:
        self._publish(self._path(seq, self.index), self._encode(fits, None))

    def _write_error(self, seq: int, error) -> None:
        data = self._encode(None, error)
        for reader in range(len(self.members)):
            if reader != self.index:
                self._publish(self._error_path(seq, reader, self.index), data)

    def _read(self, seq: int, index: int):
        path, error_path = self._path(seq, index), self._error_path(seq, self.index, index)
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        while True:  # the error copy first: a rank whose fit raised writes only that
            if os.path.exists(error_path):
                path = error_path
                break
            if os.path.exists(path):
                break
            if time.monotonic() > deadline:
                raise _core.TimeoutError(
                    f"gradcomp: fit sharing waited {self.timeout:g} s for the bases of rank "
                    f"{self.members[index]} (host {_host_key()}, {path}): did it die?")
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        with open(path, "rb") as f:
            data = f.read()
        if path == error_path:  # this rank's copy: nobody else reads it
            os.unlink(path)
        where = f"gradcomp: fit sharing: the file of rank {self.members[index]} ({path})"
        if data[:4] != self._MAGIC or len(data) < 9:
            raise _core.WireError(f"{where} is not a gradcomp fit file")
        at = 4
        if data[at] == 1:
            klen, tlen = struct.unpack_from("<II", data, at + 1)
            at += 9
            kind, text = data[at:at + klen].decode(), data[at + klen:at + klen + tlen].decode()
            cls = getattr(_core, kind, None)
            raise (cls if isinstance(cls, type) and issubclass(cls, _core.Error) else _core.Error)(
                f"{text} (raised by rank {self.members[index]}, which fitted for this host)")
        (count,) = struct.unpack_from("<I", data, at + 1)
        at += 5
        out = []
        for _ in range(count):
            if at + 12 > len(data):
                raise _core.WireError(f"{where} is truncated")
            nlen, blen = struct.unpack_from("<IQ", data, at)
            at += 12
            if at + nlen + blen > len(data):
                raise _core.WireError(f"{where} is truncated")
            out.append((data[at:at + nlen].decode(), data[at + nlen:at + nlen + blen]))
            at += nlen + blen
        return out


class DenseState(CompressionState):
    """Uncompressed float32, summed by the process group's all_reduce (a reference)."""

    codec = "dense"


class GradiVeQState(CompressionState):
    """GradiVeQ (seed 002) on conv and matrix weights, dense 1-D and small
    parameters; its schedule (warm-up, L_t QSGD sampling, fit, L_c compressed
    steps whose coefficients the all_reduce sums, eq. 4) runs inside the state."""

    codec = "gradiveq"
    _default_small = "dense"
    _aliases = {
        "warmup_iterations": "warmup_iterations", "sampling_iterations": "sampling_iterations",
        "compressed_iterations": "compressed_iterations", "sampling_qsgd_bits": "sampling_qsgd_bits",
        "slice_size": "gradiveq_slice_size", "lambda_": "gradiveq_lambda", "reuse_factor": "gradiveq_reuse_factor",
        "max_dimension": "gradiveq_max_dimension", "min_samples": "gradiveq_min_samples",
        "stale_threshold": "stale_threshold", "patience": "patience", "adaptive_cycles": "adaptive_cycles",
        "min_compressed_iterations": "min_compressed_iterations",
        # beyond the paper (examples/train's gradiveq_plus): the basis of a layer fitted on up to
        # `pool_slices` of its slices per sample ('pooled') instead of the first one ('first_slice'),
        # and d chosen on the last `holdout_fraction` of the samples, held out of the fit
        "source": "gradiveq_source", "pool_slices": "gradiveq_pool_slices",
        "holdout_fraction": "gradiveq_holdout_fraction",
        # "float16": the fitted basis rounded to IEEE binary16 (half the bytes eqs. 3 and 5 read); "int8": each
        # column rounded to int8 values times a power of two (a quarter of them; docs/codecs.md)
        "basis_storage": "gradiveq_basis_storage",
        # error feedback: what the basis leaves out of a rank's gradient is kept and sent at the next
        # sampling step (docs/codecs.md)
        "error_feedback": "gradiveq_error_feedback",
        # from the second cycle on, the L_t sampling steps spread evenly over each L_t + L_c cycle
        # (the same bytes; with error_feedback the residual is sent every few steps)
        "spread_sampling": "gradiveq_spread_sampling",
        # with error_feedback and sampling_qsgd_norm="max": the L_t sampler's own rounding is kept and
        # sent too (bounded only under the max norm; docs/codecs.md)
        "sampling_error_feedback": "gradiveq_sampling_error_feedback",
        # the L_t sampler's QSGD scale, "l2" (eq. 3.1) or "max" (QSGDState's ``norm``)
        "sampling_qsgd_norm": "qsgd_norm",
    }

    def __init__(self, model: torch.nn.Module, process_group=None, *, fit_sharing: str = "none",
                 fit_timeout: Optional[float] = None, **kwargs):
        """``fit_sharing="host"``: the ranks that share a host fit the bases between them at the end of
        each L_t (every parameter's fit on one of them, balanced by cost) and pass them through files in
        ``/dev/shm``: the same bases bit for bit as every rank fitting all of them (``"none"``), at a
        fraction of the CPU time, with no bytes on the network. It needs ``torch.distributed``
        initialized: the constructor runs two ``all_gather_object`` on the group to find the ranks of
        each host and to check that they see each other's files (every rank must construct the state).
        ``fit_timeout``: seconds a rank waits for another's bases (default: 1800, torch's default
        process-group timeout); past it, gradcomp.TimeoutError."""
        super().__init__(model, process_group, **kwargs)
        if fit_sharing not in ("none", "host"):
            raise _core.InvalidArgument(f"gradcomp: fit_sharing must be 'none' or 'host', got {fit_sharing!r}")
        if fit_timeout is not None and not fit_timeout > 0:
            raise _core.InvalidArgument(f"gradcomp: fit_timeout must be a positive number of seconds, got {fit_timeout!r}")
        self.fit_sharing = fit_sharing
        self.stats.update(fits_run=0, fits_adopted=0)  # with fit sharing on a host of several ranks
        if fit_sharing == "host":
            if not dist.is_available() or not dist.is_initialized():
                raise _core.InvalidArgument(
                    "gradcomp: fit_sharing='host' needs torch.distributed initialized before GradiVeQState is made "
                    "(its constructor finds the ranks that share a host with all_gather_object)")
            sharing = _HostFits(process_group, 1800.0 if fit_timeout is None else float(fit_timeout))
            self._fit_sharing = sharing if len(sharing.members) > 1 else None
            self.fit_sharing_members = list(sharing.members)
        else:
            self.fit_sharing_members = []

    def compression_loss(self) -> Dict[str, Tuple[float, float]]:
        """Eq. 7 of this rank's last step: parameter name -> (loss, energy), ``loss`` the squared norm of
        what the basis left out of the rank's gradient (centred, as the codec codes it, at the samples' mean
        over the N ranks: it can exceed the energy), ``energy`` the gradient's squared norm, for every
        parameter GradiVeQ encoded in that step (L_c; empty in warm-up and sampling steps). ``loss /
        energy`` is the relative loss the stale vote compares with ``stale_threshold``; over the layers:
        ``relative_compression_loss()``."""
        return dict(self._ex.gradiveq_losses()) if self._ex is not None else {}

    def relative_compression_loss(self) -> Optional[float]:
        """``compression_loss()`` over every layer of the last step: the summed loss over the summed energy
        (0.0 for a zero gradient, as the stale vote counts it), or None when no layer was encoded (warm-up
        and sampling steps)."""
        report = self.compression_loss()
        if not report:
            return None
        energy = sum(e for _, e in report.values())
        return sum(l for l, _ in report.values()) / energy if energy > 0.0 else 0.0


#: examples/train's ``gradiveq_plus`` recipe (examples/train/config.cpp, docs/results.md "GradiVeQ: why the
#: paper's recipe misses the accuracy target"): the basis fitted on up to 16 pooled slices of a layer per
#: sample, QSGD 4-bit sampling, lambda 0.01, no hold-out, fixed L_c; its L_t is 1.5x the paper's (150 with
#: ``--full``'s warm-up 500 and L_c 400). Only conv weights are GradiVeQ there (the linear layer is dense:
#: pass ``options={"fallback": "dense"}``). ``GradiVeQState(model, **GRADIVEQ_PLUS, warmup_iterations=...,
#: sampling_iterations=..., compressed_iterations=...)``.
GRADIVEQ_PLUS = {"source": "pooled", "pool_slices": 16, "holdout_fraction": 0.0, "lambda_": 0.01,
                 "sampling_qsgd_bits": 4}


class QSGDState(CompressionState):
    """QSGD (``bits`` 2, 4 or 8): payloads all-gathered, decoded in rank order. ``norm`` scales each
    bucket's levels by its ``"l2"`` norm (QSGD eq. 3.1, the default) or its ``"max"`` |value| (same bytes,
    still unbiased, a variance never larger: docs/codecs.md)."""

    codec = "qsgd"
    _aliases = {"bits": "qsgd_bits", "levels": "qsgd_levels", "bucket_size": "qsgd_bucket_size",
                "norm": "qsgd_norm"}


class TwoBitState(CompressionState):
    """Two-bit quantizer with residual (seed 003): fixed ``threshold`` or ``auto_scale``."""

    codec = "two_bit"
    _aliases = {"threshold": "two_bit_threshold", "auto_scale": "two_bit_auto_scale"}


class TopKState(CompressionState):
    """Top-R% sparsifier with memory (``ratio_percent``; DGC momentum as an option)."""

    codec = "top_k"
    _aliases = {"ratio_percent": "top_k_ratio_percent", "mode": "top_k_mode", "scale": "top_k_scale",
                "dgc_momentum": "top_k_dgc_momentum", "momentum": "top_k_momentum"}


class PowerSGDState(CompressionState):
    """Rank-``rank`` PowerSGD (Vogels et al. 2019) on conv weights (viewed as
    C_out x (C_in k k), PyTorch's view) and linear weights (out x in): two sum
    rounds of float32 (the P's, then the Q's), both issued inside the hook, so
    every rank issues them in the same order. Dense for its first ``start_iter``
    steps, for matrices under ``min_elements`` and for 1-D parameters. Error
    feedback and the warm-start Q are its memory (``state_dict``)."""

    codec = "powersgd"
    _matrix_view = True
    _aliases = {"rank": "powersgd_rank", "start_iter": "powersgd_start_iter", "min_elements": "powersgd_min_elements",
                "error_feedback": "powersgd_error_feedback", "warm_start": "powersgd_warm_start"}


class FP16State(CompressionState):
    """IEEE float16: one sum round whose cells the hook converts to a ``torch.float16``
    tensor, sums with the process group's own 16-bit ``all_reduce`` and converts back."""

    codec = "fp16"


class BF16State(CompressionState):
    """bfloat16, as ``FP16State`` with ``torch.bfloat16`` (gloo on torch 1.13 cannot sum
    bfloat16: ``supports_all_reduce(torch.bfloat16)`` says whether the backend can)."""

    codec = "bf16"


class HomomorphicState(CompressionState):
    """The agreed-scale integer quantizer: a float32 MAX round (the scales of every
    ``block_size`` values), then a sum round of int32 words (``bits``-wide lanes, 0: from
    the world size) that the process group sums as ``torch.int32``."""

    codec = "homomorphic"
    _aliases = {"bits": "homomorphic_bits", "block_size": "homomorphic_block_size"}
