"""DistributedDataParallel comm hooks over gradcomp's bucket layer (docs/python.md).

One state object per codec (``DenseState``, ``GradiVeQState``, ``QSGDState``,
``TwoBitState``, ``TopKState``, ``PowerSGDState``, ``FP16State``, ``BF16State``,
``HomomorphicState``), registered with::

    ddp.register_comm_hook(state, gradcomp.torch.hook)

How a DDP bucket is exchanged:

- Every parameter has its own ``gradcomp.BucketLayer`` (a one-layer plan whose
  seed is mixed from the parameter's name), so codec memory (residuals, QSGD
  streams, GradiVeQ bases and schedule) is keyed by parameter name and does not
  depend on how DDP groups parameters into buckets: a bucket rebuild keeps it.
- The hook runs the rounds of every parameter of the bucket together: per round
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

import struct
import time
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from . import _core

__all__ = [
    "CompressionState", "DenseState", "GradiVeQState", "QSGDState", "TwoBitState", "TopKState", "PowerSGDState",
    "FP16State", "BF16State", "HomomorphicState", "backward", "hook", "supports_all_reduce", "STATE_FORMAT",
]

#: Version of the dict that ``state_dict()`` returns.
STATE_FORMAT = 1
_HISTORY = 16  # steps of packed all-gather sizes that set the capacity
_SIZE_HEADER = 8


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


def _name_seed(seed: int, name: str) -> int:
    """A 64-bit seed from the plan seed and the parameter name (FNV-1a)."""
    h = 0xCBF29CE484222325 ^ (seed & 0xFFFFFFFFFFFFFFFF)
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _round_up(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


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
        self._layers: Dict[str, _core.BucketLayer] = {}
        self._pending: Dict[str, bytes] = {}
        self._history: Dict[tuple, List[int]] = {}
        #: The ExchangeFailure the hook raised last (torch 1.x's DDP hands a hook's exception to
        #: backward() as a RuntimeError holding only its text: gradcomp.torch.backward re-raises this one).
        self.failure: Optional[_core.ExchangeFailure] = None
        self._rank: Optional[int] = None
        self._ranks: Optional[int] = None
        self.stats = {"hook_calls": 0, "collectives": 0, "extra_collectives": 0, "bytes_sent": 0,
                      "hook_seconds": 0.0}
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
    def _ensure_group(self) -> None:
        if self._rank is None:
            self._rank = dist.get_rank(self.process_group)
            self._ranks = dist.get_world_size(self.process_group)

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

    def _layer(self, name: str, p: torch.Tensor) -> _core.BucketLayer:
        layer = self._layers.get(name)
        if layer is not None:
            return layer
        md = _core.ModelDescription()
        if p.dim() == 4:
            md.add_conv(name, *p.shape)
        elif p.dim() == 2 and self._matrix_view:
            md.add_matrix(name, *p.shape)
        else:
            md.add_dense(name, p.numel(), 1 if p.dim() <= 1 else 2)
        plan = _core.Plan(md, dict(self._plan_options, seed=_name_seed(self._seed, name)))
        layer = _core.BucketLayer(plan, self._rank, self._ranks, "skip")
        saved = self._pending.pop(name, None)
        if saved is not None:
            layer.restore_state(saved)
        self._layers[name] = layer
        return layer

    # -- checkpoints ----------------------------------------------------------
    def state_dict(self) -> dict:
        """Every parameter's codec memory (its bucket layer's checkpoint), keyed by name."""
        params = dict(self._pending)
        params.update({name: layer.save_state() for name, layer in self._layers.items()})
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
            if name in self._layers:
                self._layers[name].restore_state(bytes(blob))
            else:
                self._pending[name] = bytes(blob)
        self._history.clear()

    # -- the hook -------------------------------------------------------------
    def _run(self, bucket) -> torch.futures.Future:
        t0 = time.perf_counter()
        self._ensure_group()
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise _core.InvalidArgument(f"gradcomp: the hooks take float32 gradients, this bucket holds {buf.dtype}")
        params = bucket.parameters()
        names = [self._name_of(p) for p in params]
        host = buf.detach() if buf.device.type == "cpu" else buf.detach().cpu()  # CUDA: a host copy
        flat = host.numpy()
        sizes = [p.numel() for p in params]
        if sum(sizes) != flat.size:
            raise _core.LayoutError(f"gradcomp: bucket {bucket.index()} holds {flat.size} floats for parameters of "
                                    f"{sum(sizes)}")
        views, at = [], 0
        for n in sizes:
            views.append(flat[at:at + n])
            at += n
        layers = [self._layer(name, p) for name, p in zip(names, params)]
        flag = not bool(torch.isfinite(host).all())  # one bad value flags the whole bucket on this rank
        for layer, view in zip(layers, views):
            layer.begin_step([view], flag)
        self._exchange(tuple(names), layers, sizes)
        reports = [layer.finish_step([view]) for layer, view in zip(layers, views)]
        if any(r["skipped"] for r in reports):
            self.failure = self._failure(bucket.index(), names, reports)
            raise self.failure
        if host is not buf:
            buf.copy_(host)
        self.stats["hook_calls"] += 1
        self.stats["hook_seconds"] += time.perf_counter() - t0
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def _exchange(self, key: tuple, layers: list, sizes: list) -> None:
        """Runs the rounds of the bucket's layers in lock step, one collective per kind of round."""
        while True:
            live = []
            for layer, n in zip(layers, sizes):
                r = layer.next_round()
                if r is not None:
                    live.append((layer, r, n))
            if not live:
                return
            kinds = []  # (op, element) in first-seen order: the same on every rank (same plans, same rounds)
            for _, r, _ in live:
                if r.op != "all_gather" and (r.op, r.element) not in kinds:
                    kinds.append((r.op, r.element))
            for op, element in kinds:
                group = [(layer, r) for layer, r, _ in live if r.op == op and r.element == element]
                self._reduce(op, element, group)
            group = [(layer, r, n) for layer, r, n in live if r.op == "all_gather"]
            if group:
                self._gather(key, group)

    def _reduce(self, op: str, element: str, group: list) -> None:
        bufs = [r.buffer for _, r in group]
        joined = bufs[0] if len(bufs) == 1 else np.concatenate(bufs)
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
        if len(bufs) > 1:
            at = 0
            for b in bufs:
                b[:] = joined[at:at + b.size]
                at += b.size
        for layer, _ in group:
            layer.complete_round()

    def _gather(self, key: tuple, group: list) -> None:
        payloads = [r.payload for _, r, _ in group]
        k = len(payloads)
        packed = struct.pack(f"<{k}I", *(len(p) for p in payloads)) + b"".join(payloads)
        names = key + (len(group),)
        history = self._history.setdefault(names, [])
        if history:
            capacity = _round_up(max(history[-_HISTORY:]) + max(history[-_HISTORY:]) // 16)
        else:  # agreed without a collective: the dense size of the layers plus headers and control block
            capacity = _round_up(4 * k + sum(4 * n + 256 + 12 * self._ranks for _, _, n in group))
        out, sizes = self._gather_padded(packed, capacity)
        need = max(sizes)
        if need > capacity:  # some rank's payloads did not fit: every rank saw it, all repeat once
            self.stats["extra_collectives"] += 1
            out, sizes = self._gather_padded(packed, _round_up(need))
        history.append(need)
        del history[:-_HISTORY]
        per_rank = []
        for r in range(self._ranks):
            data = out[r][_SIZE_HEADER:_SIZE_HEADER + sizes[r]].tobytes()
            lengths = struct.unpack_from(f"<{k}I", data)
            at, parts = 4 * k, []
            for n in lengths:
                parts.append(data[at:at + n])
                at += n
            per_rank.append(parts)
        for j, (layer, _, _) in enumerate(group):
            layer.complete_round([per_rank[r][j] for r in range(self._ranks)])

    def _gather_padded(self, packed: bytes, capacity: int):
        send = np.zeros(_SIZE_HEADER + capacity, dtype=np.uint8)
        send[:_SIZE_HEADER] = np.frombuffer(struct.pack("<Q", len(packed)), dtype=np.uint8)
        if len(packed) <= capacity:
            send[_SIZE_HEADER:_SIZE_HEADER + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
        out = [torch.empty_like(torch.from_numpy(send)) for _ in range(self._ranks)]
        dist.all_gather(out, torch.from_numpy(send), group=self.process_group)
        self.stats["collectives"] += 1
        self.stats["bytes_sent"] += send.nbytes
        arrays = [o.numpy() for o in out]
        sizes = [int(struct.unpack_from("<Q", a[:_SIZE_HEADER].tobytes())[0]) for a in arrays]
        return arrays, sizes

    def _failure(self, index: int, names: list, reports: list) -> _core.ExchangeFailure:
        """The same ExchangeFailure on every rank: built only from the agreed control blocks."""
        entries = []
        for name, rep in zip(names, reports):
            for rank, reason, _ in rep["failures"]:
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
        exc.local_detail = "; ".join(r["local_detail"] for r in reports if r["local_detail"])
        return exc

    # -- reporting ------------------------------------------------------------
    def phases(self) -> Dict[str, str]:
        """The phase of every parameter's codec ('dense', 'gradiveq:compressed', ...)."""
        return {name: layer.phase[0] for name, layer in self._layers.items()}

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
    }


class QSGDState(CompressionState):
    """QSGD (``bits`` 2, 4 or 8): payloads all-gathered, decoded in rank order."""

    codec = "qsgd"
    _aliases = {"bits": "qsgd_bits", "levels": "qsgd_levels", "bucket_size": "qsgd_bucket_size"}


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
