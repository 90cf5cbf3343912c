"""gradcomp._core (the bucket layer on numpy buffers) and the error hierarchy, in one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradcomp
import gradcomp.torch as gt
from ddp_harness import Net


def _model():
    m = gradcomp.ModelDescription()
    m.add_conv("conv", 8, 4, 3, 3).add_dense("fc", 5000).add_dense("bias", 8, 1)
    return m


def _run_step(layers, grads):
    """Drives the rounds of every rank's layer by hand (sum, max, all_gather), each round's cells reduced
    as the process group reduces them (_reduce_as)."""
    for layer, g in zip(layers, grads):
        layer.begin_step(g)
    while True:
        rounds = [layer.next_round() for layer in layers]
        if rounds[0] is None:
            assert all(r is None for r in rounds)
            break
        if rounds[0].op == "all_gather":
            payloads = [r.payload for r in rounds]
            for layer in layers:
                layer.complete_round(payloads)
        else:
            total = _reduce_as(rounds[0].element, rounds[0].op, [r.buffer for r in rounds])
            for r in rounds:
                r.buffer[:] = total
            for layer in layers:
                layer.complete_round()
    return [layer.finish_step(g) for layer, g in zip(layers, grads)]


def _reduce_as(element, op, bufs):
    """The reduction a process group does on a round's cells of `element` (as gradcomp.torch does)."""
    if element == "int32_words":
        assert op == "sum"
        ts = [torch.from_numpy(b.copy().view(np.int32)) for b in bufs]
        total = ts[0].clone()
        for t in ts[1:]:
            total += t  # int32 wrap-around
        return total.numpy().view(np.float32)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[element]
    ts = [torch.from_numpy(b.copy()).to(dtype) for b in bufs]
    assert all(torch.equal(t.to(torch.float32), torch.from_numpy(b)) for t, b in zip(ts, bufs))  # exact cells
    total = ts[0].clone()
    for t in ts[1:]:
        total = total + t if op == "sum" else torch.maximum(total, t)
    return total.to(torch.float32).numpy()


@pytest.mark.parametrize("codec,rounds", [
    ("fp16", [("sum", "float16")]),
    ("bf16", [("sum", "bfloat16")]),
    ("homomorphic", [("max", "float32"), ("sum", "int32_words")]),
    ("powersgd", [("sum", "float32"), ("sum", "float32")]),
])
def test_rounds_say_their_element(codec, rounds):
    m = gradcomp.ModelDescription()
    m.add_conv("conv", 16, 8, 3, 3).add_matrix("fc", 64, 96).add_dense("bias", 8, 1)
    plan = gradcomp.Plan(m, {"conv": codec, "fallback": codec, "small": codec, "powersgd_start_iter": 0,
                             "powersgd_rank": 2, "homomorphic_bits": 12})
    layers = [gradcomp.BucketLayer(plan, r, 3) for r in range(3)]
    rng = np.random.default_rng(1)
    grads = [[rng.standard_normal(n).astype(np.float32) for _, n, _ in m.layers] for _ in range(3)]
    want = [np.mean([g[i] for g in grads], axis=0) for i in range(3)]
    for layer, g in zip(layers, grads):
        layer.begin_step(g)
    seen = []
    while True:
        rs = [layer.next_round() for layer in layers]
        if rs[0] is None:
            break
        assert len({(r.op, r.element) for r in rs}) == 1
        if not seen or rs[0].bucket == 0:
            seen.append((rs[0].op, rs[0].element))
        total = _reduce_as(rs[0].element, rs[0].op, [r.buffer for r in rs])
        for r in rs:
            r.buffer[:] = total
        for layer in layers:
            layer.complete_round()
    assert seen[:len(rounds)] == rounds
    reports = [layer.finish_step(g) for layer, g in zip(layers, grads)]
    assert all(not r["skipped"] for r in reports), reports
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            assert np.array_equal(a, b)
    if codec in ("fp16", "bf16", "homomorphic"):  # a quantized mean, near the true one
        tol = {"fp16": 2e-3, "bf16": 2e-2, "homomorphic": 5e-3}[codec]
        for a, b in zip(grads[0], want):
            np.testing.assert_allclose(a, b, atol=tol)


@pytest.mark.parametrize("codec", ["dense", "qsgd", "two_bit", "top_k"])
def test_bucket_layer_means_over_ranks(codec):
    plan = gradcomp.Plan(_model(), {"conv": codec, "fallback": codec, "small": codec, "top_k_ratio_percent": 100.0,
                                    "qsgd_bits": 8, "two_bit_auto_scale": 1.0})
    layers = [gradcomp.BucketLayer(plan, r, 3) for r in range(3)]
    rng = np.random.default_rng(0)
    grads = [[rng.standard_normal(n).astype(np.float32) for _, n, _ in _model().layers] for _ in range(3)]
    want = [np.mean([g[i] for g in grads], axis=0) for i in range(3)]
    reports = _run_step(layers, grads)
    assert all(not r["skipped"] and r["step"] == 1 for r in reports)
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            assert np.array_equal(a, b)  # every rank the same result
    if codec in ("dense", "top_k"):  # exact (top-k at 100% sends everything)
        for a, b in zip(grads[0], want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_non_finite_gradient_is_agreed_and_state_round_trips():
    plan = gradcomp.Plan(_model(), {"fallback": "two_bit", "conv": "two_bit"})
    layers = [gradcomp.BucketLayer(plan, r, 2, "throw") for r in range(2)]
    grads = [[np.ones(n, np.float32) for _, n, _ in _model().layers] for _ in range(2)]
    _run_step(layers, grads)
    saved = layers[1].save_state()
    grads = [[np.ones(n, np.float32) for _, n, _ in _model().layers] for _ in range(2)]
    grads[1][1][7] = np.nan
    for layer, g in zip(layers, grads):
        layer.begin_step(g)
    rounds = [layer.next_round() for layer in layers]
    caught = []
    for layer in layers:
        with pytest.raises(gradcomp.ExchangeFailure) as e:
            layer.complete_round([r.payload for r in rounds]) if rounds[0].op == "all_gather" else \
                layer.complete_round()
        caught.append(e.value)
    assert [(e.rank, e.reason) for e in caught] == [(1, "non-finite gradient")] * 2
    assert str(caught[0]) == str(caught[1]) and "layer 'fc'" in str(caught[0])
    assert layers[1].save_state() == saved  # rolled back
    other = gradcomp.BucketLayer(plan, 0, 2)
    with pytest.raises(gradcomp.OptionMismatch):
        other.restore_state(saved)  # rank 1's checkpoint on rank 0
    with pytest.raises(gradcomp.WireError):
        layers[1].restore_state(saved[:-3] + b"xyz")
    with pytest.raises(gradcomp.LayoutError):
        gradcomp.BucketLayer(gradcomp.Plan(_model(), {"fallback": "qsgd"}), 1, 2).restore_state(saved)


def test_errors_form_a_hierarchy():
    for cls in (gradcomp.InvalidArgument, gradcomp.LayoutError, gradcomp.NonFinite, gradcomp.ExchangeFailure,
                gradcomp.WireError, gradcomp.OptionMismatch, gradcomp.SizeMismatch, gradcomp.TransportError):
        assert issubclass(cls, gradcomp.Error)
    assert issubclass(gradcomp.InvalidArgument, ValueError)
    assert issubclass(gradcomp.OptionMismatch, gradcomp.StateError)


@pytest.mark.parametrize("make", [
    lambda m: gt.QSGDState(m, bits=3),
    lambda m: gt.TopKState(m, ratio_percent=0.0),
    lambda m: gt.TwoBitState(m, threshold=-1.0),
    lambda m: gt.GradiVeQState(m, sampling_iterations=1),
    lambda m: gt.QSGDState(m, bitz=4),
    lambda m: gt.QSGDState(m, norm="inf"),
    lambda m: gt.QSGDState(m, norm=2),
    lambda m: gt.DenseState(m, small="no-such-codec"),
    lambda m: gt.PowerSGDState(m, rank=0),
    lambda m: gt.PowerSGDState(m, rnak=2),
    lambda m: gt.HomomorphicState(m, block_size=0),
    lambda m: gt.FP16State(m, options={"powersgd_rnk": 1}),
    lambda m: gt.BF16State(m, bits=8),
])
def test_invalid_codec_parameter_raises_invalid_argument(make):
    with pytest.raises(gradcomp.InvalidArgument):
        make(Net())


def test_load_state_dict_of_another_configuration():
    model = Net()
    with pytest.raises(gradcomp.LayoutError):
        gt.QSGDState(model).load_state_dict({"format": gt.STATE_FORMAT, "codec": "two_bit", "params": {}})
    with pytest.raises(gradcomp.LayoutError):
        gt.QSGDState(model).load_state_dict({"format": gt.STATE_FORMAT, "codec": "qsgd",
                                             "params": {"no.such.weight": b""}})
    with pytest.raises(gradcomp.LayoutError):
        gt.QSGDState(model).load_state_dict({"weights": torch.zeros(1)})


def _compressed_sum_length(options, steps=6, seed=3):
    """Drives a GradiVeQ conv layer at 2 ranks through L_t = 4 sampling steps and one compressed step
    (warm-up 0); returns the float32 length of the compressed step's sum round (d coefficients per slice,
    plus the control block), and checks the ranks agree on every step."""
    m = gradcomp.ModelDescription()
    m.add_conv("conv", 8, 4, 3, 3)  # slices of K = W*D*F = 96, 3 of them
    plan = gradcomp.Plan(m, dict({"conv": "gradiveq", "warmup_iterations": 0, "sampling_iterations": 4,
                                  "compressed_iterations": 10, "gradiveq_lambda": 1e-6}, **options))
    layers = [gradcomp.BucketLayer(plan, r, 2, "throw") for r in range(2)]
    rng = np.random.default_rng(seed)
    length = None
    for step in range(steps):
        grads = [[rng.standard_normal(288).astype(np.float32)] for _ in range(2)]
        for layer, g in zip(layers, grads):
            layer.begin_step(g)
        while True:
            rounds = [layer.next_round() for layer in layers]
            if rounds[0] is None:
                break
            if rounds[0].op == "all_gather":
                for layer in layers:
                    layer.complete_round([r.payload for r in rounds])
            else:
                if step == 4:
                    length = rounds[0].length
                total = rounds[0].buffer + rounds[1].buffer
                for r in rounds:
                    r.buffer[:] = total
                for layer in layers:
                    layer.complete_round()
        for layer, g in zip(layers, grads):
            layer.finish_step(g)
        assert np.array_equal(grads[0][0], grads[1][0])
        if step == 4:
            assert layers[0].phase == ["gradiveq:compressed"]
    return length


def test_gradiveq_pooled_source_reaches_the_codec():
    # the first slice of 4 samples spans at most 3 directions; 3 pooled slices a sample span up to 11
    # (random gradients and a tiny lambda keep d at that bound)
    first = _compressed_sum_length({"gradiveq_source": "first_slice"})
    pooled = _compressed_sum_length({"gradiveq_source": "pooled"})
    pool2 = _compressed_sum_length({"gradiveq_source": "pooled", "gradiveq_pool_slices": 2})
    assert first == _compressed_sum_length({})  # the default is the paper's first slice
    assert first < pool2 < pooled
    assert (pooled - first) == 3 * (11 - 3)  # 3 slices of d coefficients each
    assert (pool2 - first) == 3 * (7 - 3)
    assert _compressed_sum_length({"gradiveq_source": "pooled", "gradiveq_holdout_fraction": 0.25}) > first
    # a hold-out of 0.9 of the 12 pooled samples leaves fewer than 2 to fit: the fit refuses
    with pytest.raises(gradcomp.Error, match="hold-out"):
        _compressed_sum_length({"gradiveq_source": "pooled", "gradiveq_holdout_fraction": 0.9})


def test_gradiveq_plus_options_and_their_errors():
    model = Net()
    state = gt.GradiVeQState(model, **gt.GRADIVEQ_PLUS, warmup_iterations=5, sampling_iterations=6,
                             compressed_iterations=4, min_compressed_iterations=2)
    opts = state._plan_options
    assert opts["gradiveq_source"] == "pooled" and opts["gradiveq_pool_slices"] == 16
    assert opts["min_compressed_iterations"] == 2
    a = gradcomp.Plan(_model(), {"conv": "gradiveq"}).fingerprint
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_source": "pooled"}).fingerprint != a
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_holdout_fraction": 0.2}).fingerprint != a
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "min_compressed_iterations": 3}).fingerprint != a
    for bad in ({"source": "all"}, {"source": 3}, {"holdout_fraction": 1.0}, {"holdout_fraction": -0.1},
                {"pool_slices": -1}, {"min_compressed_iterations": 0}):
        with pytest.raises(gradcomp.InvalidArgument):
            gt.GradiVeQState(model, **bad)


def test_gradiveq_basis_storage_float16_and_int8_are_plan_options():
    # the basis rounded to binary16, or to int8 times a power of two per column, after the fit: each
    # its own plan fingerprint, the same payload sizes, every rank the same sum (checked by the
    # helper), and a typed error for an unknown storage
    a = gradcomp.Plan(_model(), {"conv": "gradiveq"}).fingerprint
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_basis_storage": "float32"}).fingerprint == a
    narrow = {gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_basis_storage": s}).fingerprint
              for s in ("float16", "int8")}
    assert len(narrow) == 2 and a not in narrow
    for storage in ("float16", "int8"):
        assert _compressed_sum_length({"gradiveq_basis_storage": storage}) == _compressed_sum_length({})
        assert gt.GradiVeQState(Net(), basis_storage=storage)._plan_options["gradiveq_basis_storage"] == storage
    for bad in ("half", "bf16", 16, "uint8", "int4"):
        with pytest.raises(gradcomp.InvalidArgument):
            gt.GradiVeQState(Net(), basis_storage=bad)


def test_gradiveq_error_feedback_is_a_plan_option():
    # error feedback: its own plan fingerprint, the same payload sizes, the ranks agree
    a = gradcomp.Plan(_model(), {"conv": "gradiveq"}).fingerprint
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_error_feedback": False}).fingerprint == a
    assert gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_error_feedback": True}).fingerprint != a
    assert _compressed_sum_length({"gradiveq_error_feedback": True}, steps=7) == _compressed_sum_length({}, steps=7)
    state = gt.GradiVeQState(Net(), error_feedback=True)
    assert state._plan_options["gradiveq_error_feedback"] is True
    with pytest.raises(gradcomp.InvalidArgument):
        gt.GradiVeQState(Net(), error_feedback="yes")
    # spread sampling: its own fingerprint; it needs a fixed L_c
    b = gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_spread_sampling": True}).fingerprint
    assert b != a
    assert gt.GradiVeQState(Net(), spread_sampling=True)._plan_options["gradiveq_spread_sampling"] is True
    with pytest.raises(gradcomp.InvalidArgument, match="fixed L_c"):
        gradcomp.Plan(_model(), {"conv": "gradiveq", "gradiveq_spread_sampling": True, "stale_threshold": 0.5})
    # the sampler's rounding fed back: with error feedback and the max-norm sampler only
    ok = {"conv": "gradiveq", "gradiveq_error_feedback": True, "qsgd_norm": "max"}
    c = gradcomp.Plan(_model(), {**ok, "gradiveq_sampling_error_feedback": True}).fingerprint
    assert c != gradcomp.Plan(_model(), ok).fingerprint
    state = gt.GradiVeQState(Net(), error_feedback=True, sampling_qsgd_norm="max", sampling_error_feedback=True)
    assert state._plan_options["gradiveq_sampling_error_feedback"] is True
    with pytest.raises(gradcomp.InvalidArgument, match="max-norm"):
        gt.GradiVeQState(Net(), error_feedback=True, sampling_error_feedback=True)
    with pytest.raises(gradcomp.InvalidArgument, match="needs error_feedback"):
        gt.GradiVeQState(Net(), sampling_qsgd_norm="max", sampling_error_feedback=True)


def test_qsgd_max_norm_is_a_plan_option_with_its_own_fingerprint():
    base = gradcomp.Plan(_model(), {"fallback": "qsgd", "conv": "qsgd"}).fingerprint
    l2 = gradcomp.Plan(_model(), {"fallback": "qsgd", "conv": "qsgd", "qsgd_norm": "l2"}).fingerprint
    mx = gradcomp.Plan(_model(), {"fallback": "qsgd", "conv": "qsgd", "qsgd_norm": "max"}).fingerprint
    assert l2 == base and mx != base  # l2 is the default, and plans that keep it keep their fingerprints
    assert gt.QSGDState(Net(), norm="max")._plan_options["qsgd_norm"] == "max"
    assert gt.GradiVeQState(Net(), sampling_qsgd_norm="max")._plan_options["qsgd_norm"] == "max"
    # max-norm QSGD means over ranks: every rank the same, near the true mean (8 bits)
    plan = gradcomp.Plan(_model(), {"conv": "qsgd", "fallback": "qsgd", "small": "qsgd", "qsgd_bits": 8,
                                    "qsgd_norm": "max"})
    layers = [gradcomp.BucketLayer(plan, r, 3) for r in range(3)]
    rng = np.random.default_rng(1)
    grads = [[rng.standard_normal(n).astype(np.float32) for _, n, _ in _model().layers] for _ in range(3)]
    want = [np.mean([g[i] for g in grads], axis=0) for i in range(3)]
    _run_step(layers, grads)
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            assert np.array_equal(a, b)
    for a, b in zip(grads[0], want):
        np.testing.assert_allclose(a, b, atol=0.05)


def test_fit_sharing_options_are_checked():
    """fit_sharing takes "none" or "host"; "host" needs torch.distributed initialized (its constructor
    finds the host's ranks with a collective); fit_timeout must be positive; none of them is a plan option."""
    import torch.distributed as dist
    assert not dist.is_initialized()
    state = gt.GradiVeQState(Net())
    assert state.fit_sharing == "none" and state.fit_sharing_members == [] and state._fit_sharing is None
    assert "fit_sharing" not in state._plan_options
    with pytest.raises(gradcomp.InvalidArgument, match="'none' or 'host'"):
        gt.GradiVeQState(Net(), fit_sharing="node")
    with pytest.raises(gradcomp.InvalidArgument, match="torch.distributed initialized"):
        gt.GradiVeQState(Net(), fit_sharing="host")
    with pytest.raises(gradcomp.InvalidArgument, match="fit_timeout"):
        gt.GradiVeQState(Net(), fit_timeout=0)
    with pytest.raises(gradcomp.InvalidArgument):  # only GradiVeQ fits a basis
        gt.QSGDState(Net(), fit_sharing="host")
