// gradcomp._core: the Python binding of the whole-model exchange's bucket
// layer (include/gradcomp/exchange/bucket_layer.hpp), with nanobind. It takes
// gradients as float32 buffers (numpy arrays, or torch's tensor.numpy()
// views); it does not link libtorch, so one build serves every torch version.
// C++ errors become the gradcomp.Error hierarchy (docs/python.md).
//
// The wheel builds this file once per instruction-set variant (python/CMakeLists.txt):
// GRADCOMP_PY_MODULE names the module (_core_generic, _core_x86_64_v3, ...), and
// gradcomp/_core.py imports the best one the CPU runs as gradcomp._core.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <gradcomp/errors.hpp>
#include <gradcomp/exchange/bucket_layer.hpp>
#include <gradcomp/exchange/model.hpp>
#include <gradcomp/wire.hpp>

namespace nb = nanobind;
namespace gx = gradcomp::exchange;
using namespace nb::literals;

namespace {

// ---- exceptions -----------------------------------------------------------

struct error_classes {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* size_mismatch = nullptr;
  PyObject* non_finite = nullptr;
  PyObject* state = nullptr;
  PyObject* option_mismatch = nullptr;
  PyObject* layout = nullptr;
  PyObject* transport = nullptr;
  PyObject* timeout = nullptr;
  PyObject* wire = nullptr;
  PyObject* exchange_failure = nullptr;
};
error_classes errors;

PyObject* new_error(nb::module_& m, const char* name, PyObject* base, PyObject* builtin, const char* doc) {
  const std::string full = std::string("gradcomp._core.") + name;
  PyObject* bases = builtin ? PyTuple_Pack(2, base, builtin) : PyTuple_Pack(1, base);
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

// Raises `cls(message)` with extra attributes.
void raise_with(PyObject* cls, const char* message, const std::vector<std::pair<const char*, nb::object>>& attrs) {
  nb::object exc = nb::steal(PyObject_CallFunction(cls, "s", message));
  if (!exc.is_valid()) return;  // the call set its own error
  for (const auto& [k, v] : attrs) nb::setattr(exc, k, v);
  PyErr_SetObject(cls, exc.ptr());
}

nb::list failure_list(const std::vector<gx::rank_failure>& failures) {
  nb::list out;
  for (const auto& f : failures)
    out.append(nb::make_tuple(f.rank, std::string(gx::to_string(f.reason)), static_cast<long long>(f.layer)));
  return out;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const gx::exchange_failure_error& e) {
    raise_with(errors.exchange_failure, e.what(),
               {{"rank", nb::int_(e.rank())},
                {"reason", nb::str(gx::to_string(e.reason()))},
                {"failures", failure_list(e.failures())}});
  } catch (const gradcomp::wire::wire_error& e) {
    raise_with(errors.wire, e.what(), {{"code", nb::int_(static_cast<int>(e.code()))}});
  } catch (const gradcomp::option_mismatch_error& e) {
    PyErr_SetString(errors.option_mismatch, e.what());
  } catch (const gradcomp::timeout_error& e) {
    PyErr_SetString(errors.timeout, e.what());
  } catch (const gradcomp::transport_error& e) {
    PyErr_SetString(errors.transport, e.what());
  } catch (const gradcomp::state_error& e) {
    PyErr_SetString(errors.state, e.what());
  } catch (const gradcomp::invalid_argument_error& e) {
    PyErr_SetString(errors.invalid_argument, e.what());
  } catch (const gradcomp::size_mismatch_error& e) {
    PyErr_SetString(errors.size_mismatch, e.what());
  } catch (const gradcomp::non_finite_error& e) {
    PyErr_SetString(errors.non_finite, e.what());
  } catch (const gradcomp::layout_error& e) {
    PyErr_SetString(errors.layout, e.what());
  } catch (const gradcomp::error& e) {
    PyErr_SetString(errors.error, e.what());
  }
}

[[noreturn]] void invalid(const std::string& what) { throw gradcomp::invalid_argument_error("gradcomp: " + what); }

// ---- plan options from a dict ---------------------------------------------

gx::codec_kind kind_of(const std::string& s) {
  if (s == "dense") return gx::codec_kind::dense;
  if (s == "gradiveq") return gx::codec_kind::gradiveq;
  if (s == "two_bit") return gx::codec_kind::two_bit;
  if (s == "qsgd") return gx::codec_kind::qsgd;
  if (s == "top_k" || s == "topk") return gx::codec_kind::top_k;
  if (s == "fp16") return gx::codec_kind::fp16;
  if (s == "bf16") return gx::codec_kind::bf16;
  if (s == "homomorphic") return gx::codec_kind::homomorphic;
  if (s == "powersgd") return gx::codec_kind::powersgd;
  invalid("unknown codec '" + s + "' (dense, gradiveq, two_bit, qsgd, top_k, fp16, bf16, homomorphic, powersgd)");
}

template <class T>
T number(nb::handle v, const std::string& key) {
  try {
    return nb::cast<T>(v);
  } catch (const nb::cast_error&) {
    invalid("option '" + key + "' has the wrong type");
  }
}

std::size_t count(nb::handle v, const std::string& key) {
  const long long x = number<long long>(v, key);
  if (x < 0) invalid("option '" + key + "' must be >= 0");
  return static_cast<std::size_t>(x);
}

// Every key of plan_options that the binding exposes; an unknown key is an
// InvalidArgument (a typo must not be silently ignored).
gx::plan_options options_from(const nb::dict& d) {
  gx::plan_options o;
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "conv") o.rules.conv = kind_of(nb::cast<std::string>(v));
    else if (key == "small") o.rules.small = kind_of(nb::cast<std::string>(v));
    else if (key == "fallback") o.rules.fallback = kind_of(nb::cast<std::string>(v));
    else if (key == "small_below") o.rules.small_below = count(v, key);
    else if (key == "explicit") {
      for (auto [name, kind] : nb::cast<nb::dict>(v))
        o.rules.explicit_choices.emplace_back(nb::cast<std::string>(name), kind_of(nb::cast<std::string>(kind)));
    } else if (key == "bucket_bytes") o.bucket_bytes = count(v, key);
    else if (key == "seed") o.seed = number<std::uint64_t>(v, key);
    else if (key == "average") o.average = number<bool>(v, key);
    else if (key == "qsgd_bits") o.qsgd.bits = static_cast<unsigned>(count(v, key));
    else if (key == "qsgd_levels") o.qsgd.levels = static_cast<unsigned>(count(v, key));
    else if (key == "qsgd_bucket_size") o.qsgd.bucket_size = count(v, key);
    else if (key == "qsgd_seed") o.qsgd.seed = number<std::uint64_t>(v, key);
    else if (key == "qsgd_norm") {
      const auto m = number<std::string>(v, key);
      if (m == "l2") o.qsgd.norm = gradcomp::execution::qsgd_norm::l2;
      else if (m == "max") o.qsgd.norm = gradcomp::execution::qsgd_norm::max;
      else invalid("qsgd_norm must be 'l2' or 'max', got '" + m + "'");
    }
    else if (key == "two_bit_threshold") o.two_bit = gradcomp::two_bit_options::fixed(number<float>(v, key));
    else if (key == "two_bit_auto_scale") {
      o.two_bit.mode = gradcomp::two_bit_threshold_mode::automatic;
      o.two_bit.auto_scale = number<float>(v, key);
    } else if (key == "top_k_ratio_percent") o.top_k.ratio_percent = number<double>(v, key);
    else if (key == "top_k_mode") {
      const auto m = nb::cast<std::string>(v);
      if (m == "exact") o.top_k.mode = gradcomp::threshold_mode::exact;
      else if (m == "sampled") o.top_k.mode = gradcomp::threshold_mode::sampled;
      else invalid("top_k_mode must be 'exact' or 'sampled'");
    } else if (key == "top_k_scale") o.top_k.scale = number<float>(v, key);
    else if (key == "top_k_dgc_momentum") o.top_k.dgc_momentum = number<bool>(v, key);
    else if (key == "top_k_momentum") o.top_k.momentum = number<float>(v, key);
    else if (key == "top_k_seed") o.top_k.seed = number<std::uint64_t>(v, key);
    else if (key == "gradiveq_slice_size") o.gradiveq.slice_size = count(v, key);
    else if (key == "gradiveq_lambda") o.gradiveq.lambda = number<double>(v, key);
    else if (key == "gradiveq_reuse_factor") o.gradiveq.reuse_factor = count(v, key);
    else if (key == "gradiveq_max_dimension") o.gradiveq.max_dimension = count(v, key);
    else if (key == "gradiveq_min_samples") o.gradiveq.min_samples = count(v, key);
    else if (key == "gradiveq_source") {  // beyond the paper: examples/train's gradiveq_plus fits on pooled slices
      const auto src = number<std::string>(v, key);
      if (src == "first_slice") o.gradiveq.source = gradcomp::basis_source::first_slice;
      else if (src == "pooled") o.gradiveq.source = gradcomp::basis_source::pooled;
      else invalid("gradiveq_source must be 'first_slice' or 'pooled'");
    } else if (key == "gradiveq_basis_storage") {  // beyond the paper: the basis rounded to binary16 or int8 after the fit
      const auto b = number<std::string>(v, key);
      if (b == "float32") o.gradiveq.basis_storage = gradcomp::basis_precision::float32;
      else if (b == "float16") o.gradiveq.basis_storage = gradcomp::basis_precision::float16;
      else if (b == "int8") o.gradiveq.basis_storage = gradcomp::basis_precision::int8;
      else invalid("gradiveq_basis_storage must be 'float32', 'float16' or 'int8'");
    } else if (key == "gradiveq_pool_slices") o.gradiveq.pool_slices = count(v, key);
    else if (key == "gradiveq_holdout_fraction") o.gradiveq.holdout_fraction = number<double>(v, key);
    else if (key == "warmup_iterations") o.gradiveq_schedule.warmup_iterations = count(v, key);
    else if (key == "sampling_iterations") o.gradiveq_schedule.sampling_iterations = count(v, key);
    else if (key == "compressed_iterations") o.gradiveq_schedule.compressed_iterations = count(v, key);
    else if (key == "sampling_qsgd_bits") o.gradiveq_schedule.qsgd_bits = static_cast<unsigned>(count(v, key));
    else if (key == "sampling_uncompressed") {
      if (number<bool>(v, key)) o.gradiveq_schedule.sampling = gradcomp::sampling_aggregation::uncompressed;
    } else if (key == "stale_threshold") o.gradiveq_schedule.stale_threshold = number<double>(v, key);
    else if (key == "patience") o.gradiveq_schedule.patience = count(v, key);
    else if (key == "adaptive_cycles") o.gradiveq_schedule.adaptive_cycles = number<bool>(v, key);
    else if (key == "min_compressed_iterations") o.gradiveq_schedule.min_compressed_iterations = count(v, key);
    else if (key == "gradiveq_error_feedback") o.gradiveq_schedule.error_feedback = number<bool>(v, key);
    else if (key == "gradiveq_spread_sampling") o.gradiveq_schedule.spread_sampling = number<bool>(v, key);
    else if (key == "gradiveq_sampling_error_feedback")
      o.gradiveq_schedule.sampling_error_feedback = number<bool>(v, key);
    else if (key == "powersgd_rank") o.powersgd.rank = count(v, key);
    else if (key == "powersgd_start_iter") o.powersgd.start_iter = count(v, key);
    else if (key == "powersgd_min_elements") o.powersgd.min_elements = count(v, key);
    else if (key == "powersgd_error_feedback") o.powersgd.error_feedback = number<bool>(v, key);
    else if (key == "powersgd_warm_start") o.powersgd.warm_start = number<bool>(v, key);
    else if (key == "homomorphic_bits") o.homomorphic.bits = static_cast<unsigned>(count(v, key));
    else if (key == "homomorphic_block_size") o.homomorphic.block_size = count(v, key);
    else invalid("unknown plan option '" + key + "'");
  }
  return o;
}

// ---- the bucket layer -------------------------------------------------------

using farray = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using carray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
// execution::simd: the xsimd kernels when the module is built with xsimd
// (python/CMakeLists.txt, GRADCOMP_PYTHON_SIMD), the generic ones otherwise.
using layer_t = gx::bucket_layer<gradcomp::execution::simd>;

const char* op_name(gx::round_op op) {
  switch (op) {
    case gx::round_op::sum: return "sum";
    case gx::round_op::max: return "max";
    case gx::round_op::all_gather: return "all_gather";
  }
  return "unknown";
}

/// A round handed to Python: its metadata, and (sum/max) a writable float32
/// view of the buffer to reduce in place, or (all_gather) this rank's payload.
struct py_round {
  std::size_t bucket = 0;
  std::size_t index = 0;
  std::string op;
  std::string element;  // sum/max: 'float32', 'float16', 'bfloat16' or 'int32_words'; '' for all_gather
  bool carries_control = false;
  std::size_t length = 0;
  nb::object buffer;   // numpy float32 view (sum/max), None for all_gather
  nb::object payload;  // bytes (all_gather), None for sum/max
};

class py_bucket_layer {
 public:
  py_bucket_layer(const gx::plan& p, int rank, int ranks, const std::string& on_failure)
      : layer_(p, rank, ranks, policy(on_failure)) {}

  void begin_step(const std::vector<carray>& gradients, bool request_skip) {
    std::vector<std::span<const float>> spans;
    spans.reserve(gradients.size());
    for (const auto& g : gradients) spans.emplace_back(g.data(), g.size());
    held_ = gradients;  // the buffers must outlive the step (the layer keeps spans)
    try {
      layer_.begin_step(spans, request_skip);
    } catch (...) {
      held_.clear();
      throw;
    }
  }

  std::optional<py_round> next_round(nb::handle self) {
    gx::pending_round* r = layer_.next_round();
    if (!r) return std::nullopt;
    py_round out;
    out.bucket = r->bucket;
    out.index = r->index;
    out.op = op_name(r->spec.op);
    out.element = r->spec.op == gx::round_op::all_gather ? std::string() : std::string(gradcomp::summable::to_string(r->spec.element));
    out.carries_control = r->carries_control;
    out.length = r->spec.length;
    if (r->spec.op == gx::round_op::all_gather) {
      out.payload = nb::bytes(reinterpret_cast<const char*>(r->payload.data()), r->payload.size());
      out.buffer = nb::none();
    } else {
      const std::size_t shape[1] = {r->buffer.size()};
      out.buffer = nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(r->buffer.data(), 1, shape, self));
      out.payload = nb::none();
    }
    return out;
  }

  void complete_reduce() { guarded([&] { layer_.complete_round(); }); }

  void complete_gather(const std::vector<nb::bytes>& gathered) {
    std::vector<std::vector<std::byte>> g;
    g.reserve(gathered.size());
    for (const auto& b : gathered) {
      const auto* p = static_cast<const std::byte*>(b.data());
      g.emplace_back(p, p + b.size());
    }
    guarded([&] { layer_.complete_round(std::move(g)); });
  }

  nb::dict finish_step(const std::vector<farray>& outputs) {
    std::vector<std::span<float>> spans;
    for (const auto& o : outputs) spans.emplace_back(const_cast<float*>(o.data()), o.size());
    gx::step_report rep;
    guarded([&] { rep = layer_.finish_step(spans); });
    held_.clear();
    nb::dict d;
    d["skipped"] = rep.skipped;
    d["failures"] = failure_list(rep.failures);
    d["local_detail"] = rep.local_detail;
    d["stale_votes"] = rep.stale_votes;
    d["step"] = rep.step;
    d["layer_bytes"] = rep.layer_bytes;
    d["bucket_bytes"] = rep.bucket_bytes;
    d["bucket_phase"] = rep.bucket_phase;
    d["rounds"] = rep.rounds;
    d["encode_seconds"] = rep.encode_seconds;
    d["decode_seconds"] = rep.decode_seconds;
    return d;
  }

  nb::bytes save_state() const {
    const auto s = layer_.save_state();
    return nb::bytes(reinterpret_cast<const char*>(s.data()), s.size());
  }
  void restore_state(const nb::bytes& b) {
    layer_.restore_state(std::span<const std::byte>(static_cast<const std::byte*>(b.data()), b.size()));
  }

  const layer_t& layer() const { return layer_; }

 private:
  static gx::bucket_layer_options policy(const std::string& s) {
    gx::bucket_layer_options o;
    if (s == "skip") o.on_failure = gx::failure_policy::skip;
    else if (s == "throw") o.on_failure = gx::failure_policy::throw_error;
    else invalid("on_failure must be 'skip' or 'throw'");
    return o;
  }
  // A throw ends the step inside the layer: drop the held buffers with it.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      held_.clear();
      throw;
    }
  }

  layer_t layer_;
  std::vector<carray> held_;
};

using u8array = nb::ndarray<const std::uint8_t, nb::c_contig, nb::device::cpu>;

}  // namespace

#include "ddp_buckets.hpp"

#ifndef GRADCOMP_PY_MODULE
#define GRADCOMP_PY_MODULE _core_generic
#endif
// One level of indirection: NB_MODULE pastes its argument, which would not expand the macro.
#define GRADCOMP_NB_MODULE(name, m) NB_MODULE(name, m)
GRADCOMP_NB_MODULE(GRADCOMP_PY_MODULE, m) {
  m.doc() = "gradcomp's bucket layer (the whole-model exchange without a transport), on float32 buffers";
  // How this module was built (python/CMakeLists.txt): whether the layers run xsimd
  // kernels, and the ABI tag (the instruction sets the compiler could use).
  m.attr("simd") = gradcomp::execution::simd_available;
  m.attr("abi_tag") = gradcomp::execution::abi_tag;

  errors.error = new_error(m, "Error", PyExc_Exception, nullptr, "Base class of every gradcomp error.");
  errors.invalid_argument = new_error(m, "InvalidArgument", errors.error, PyExc_ValueError,
                                      "An invalid argument or codec option (gradcomp::invalid_argument_error).");
  errors.size_mismatch = new_error(m, "SizeMismatch", errors.error, PyExc_ValueError,
                                   "A buffer of the wrong size (gradcomp::size_mismatch_error).");
  errors.non_finite = new_error(m, "NonFinite", errors.error, PyExc_ValueError,
                                "A NaN or Inf where finite values are required (gradcomp::non_finite_error).");
  errors.state = new_error(m, "StateError", errors.error, PyExc_RuntimeError,
                           "A call in the wrong state, or a state that does not fit (gradcomp::state_error).");
  errors.option_mismatch = new_error(m, "OptionMismatch", errors.state, nullptr,
                                     "A saved state made with other options (gradcomp::option_mismatch_error).");
  errors.layout = new_error(m, "LayoutError", errors.error, PyExc_ValueError,
                            "Gradients or a checkpoint laid out for another model or plan (gradcomp::layout_error).");
  errors.transport = new_error(m, "TransportError", errors.error, PyExc_RuntimeError,
                               "A transport failed (gradcomp::transport_error).");
  errors.timeout = new_error(m, "TimeoutError", errors.transport, nullptr, "A transport timed out.");
  errors.wire = new_error(m, "WireError", errors.error, PyExc_ValueError,
                          "Damaged or foreign bytes (gradcomp::wire::wire_error); `code` is the wire_errc.");
  errors.exchange_failure = new_error(
      m, "ExchangeFailure", errors.error, PyExc_RuntimeError,
      "A step failed on some rank; raised identically on every rank (gradcomp::exchange::exchange_failure_error). "
      "`rank` and `reason` name the first failed rank, `failures` lists (rank, reason, layer).");
  nb::register_exception_translator(translate);

  nb::class_<gx::model_description>(m, "ModelDescription", "The layers of a model, in gradient order.")
      .def(nb::init<>())
      .def(
          "add_conv",
          [](gx::model_description& d, std::string name, std::size_t f, std::size_t c, std::size_t h, std::size_t w)
              -> gx::model_description& { return d.add_conv(std::move(name), f, c, h, w); },
          "name"_a, "filters"_a, "depth"_a, "height"_a, "width"_a, nb::rv_policy::reference_internal,
          "A conv weight [F, D, H, W] (GradiVeQ flattens it, Fig. 3a of seed 002).")
      .def(
          "add_matrix",
          [](gx::model_description& d, std::string name, std::size_t rows, std::size_t cols)
              -> gx::model_description& { return d.add_matrix(std::move(name), rows, cols); },
          "name"_a, "rows"_a, "cols"_a, nb::rv_policy::reference_internal,
          "A 2-D weight [rows, cols] (a linear layer's [out, in]): PowerSGD views it as a rows x cols matrix.")
      .def(
          "add_dense",
          [](gx::model_description& d, std::string name, std::size_t n, std::size_t tensor_rank)
              -> gx::model_description& { return d.add_dense(std::move(name), n, tensor_rank); },
          "name"_a, "size"_a, "tensor_rank"_a = 2, nb::rv_policy::reference_internal,
          "A tensor of `size` elements (tensor_rank 1 for a bias or norm weight).")
      .def("__len__", &gx::model_description::size)
      .def_prop_ro(
          "layers",
          [](const gx::model_description& d) {
            nb::list out;
            for (const auto& l : d.layers()) out.append(nb::make_tuple(l.name, l.shape.size(), l.tensor_rank));
            return out;
          },
          "(name, elements, tensor_rank) of every layer.");

  nb::class_<gx::plan>(m, "Plan", "The codec of every layer and the buckets (exchange::plan).")
      .def(
          "__init__",
          [](gx::plan* p, const gx::model_description& model, const nb::dict& options) {
            new (p) gx::plan(model, options_from(options));
          },
          "model"_a, "options"_a = nb::dict())
      .def_prop_ro("fingerprint", &gx::plan::fingerprint)
      .def("kind", [](const gx::plan& p, std::size_t i) { return std::string(gx::to_string(p.kind(i))); })
      .def_prop_ro("buckets", [](const gx::plan& p) {
        nb::list out;
        for (const auto& b : p.buckets()) out.append(nb::make_tuple(std::string(gx::to_string(b.kind)), b.layers));
        return out;
      });

  nb::class_<py_round>(m, "Round", "One collective of a step (docs/exchange.md, the bucket contract).")
      .def_ro("bucket", &py_round::bucket)
      .def_ro("index", &py_round::index)
      .def_ro("op", &py_round::op, "'sum', 'max' or 'all_gather'")
      .def_ro("element", &py_round::element,
              "sum/max: how the float32 cells are reduced: 'float32'; 'float16' / 'bfloat16' (cells exactly "
              "representable in that type, summed in it); 'int32_words' (uint32 bit patterns, summed mod 2^32); "
              "'' for all_gather")
      .def_ro("carries_control", &py_round::carries_control)
      .def_ro("length", &py_round::length, "floats of the buffer (control block included); 0 for all_gather")
      .def_ro("buffer", &py_round::buffer, "sum/max: float32 array to reduce in place across ranks")
      .def_ro("payload", &py_round::payload, "all_gather: this rank's bytes");

  nb::class_<py_bucket_layer>(m, "BucketLayer", "exchange::bucket_layer: the rounds of a step, no transport.")
      .def(nb::init<const gx::plan&, int, int, const std::string&>(), "plan"_a, "rank"_a, "ranks"_a,
           "on_failure"_a = "skip")
      .def("begin_step", &py_bucket_layer::begin_step, "gradients"_a, "request_skip"_a = false,
           "Checks and encodes (one contiguous float32 array per layer, model order); the arrays must stay "
           "alive and unchanged until finish_step.")
      .def(
          "next_round", [](nb::pointer_and_handle<py_bucket_layer> self) { return self.p->next_round(self.h); },
          "The next Round, or None when the step needs no more.")
      .def("complete_round", &py_bucket_layer::complete_reduce, "After reducing a sum/max round's buffer in place.")
      .def("complete_round", &py_bucket_layer::complete_gather, "gathered"_a,
           "An all_gather round's result: every rank's payload, in rank order.")
      .def("finish_step", &py_bucket_layer::finish_step, "outputs"_a,
           "Writes the mean (or sum) into `outputs`; returns the step report as a dict.")
      .def("save_state", &py_bucket_layer::save_state)
      .def("restore_state", &py_bucket_layer::restore_state, "state"_a)
      .def_prop_ro("steps", [](const py_bucket_layer& l) { return l.layer().steps(); })
      .def_prop_ro("rank", [](const py_bucket_layer& l) { return l.layer().rank(); })
      .def_prop_ro("ranks", [](const py_bucket_layer& l) { return l.layer().ranks(); })
      .def_prop_ro("phase", [](const py_bucket_layer& l) {
        std::vector<std::string> out;
        for (std::size_t b = 0; b < l.layer().layout().buckets().size(); ++b) out.push_back(l.layer().bucket(b).phase());
        return out;
      });

  nb::class_<ddp_buckets>(m, "DDPBuckets",
                          "Every parameter's bucket layer (keyed by name) and the DDP buckets over them: one call per "
                          "DDP bucket and round (gradcomp.torch's hooks; docs/python.md).")
      .def(nb::init<const nb::dict&, std::uint64_t, int, int, bool, bool>(), "plan_options"_a, "seed"_a, "rank"_a,
           "ranks"_a, "matrix_view"_a = false, "defer_fits"_a = false,
           "`plan_options`: gradcomp.Plan's keys; each parameter's seed mixes `seed` and its name (FNV-1a); "
           "`matrix_view`: 2-D parameters as matrices (PowerSGD) rather than dense; `defer_fits`: GradiVeQ fits "
           "are left pending after finish, for fit() on one rank and adopt_fit() on the others.")
      .def("bucket", &ddp_buckets::bucket, "names"_a, "shapes"_a,
           "Registers a DDP bucket (its parameters' names and shapes, bucket order); returns its id.")
      .def(
          "begin",
          [](nb::pointer_and_handle<ddp_buckets> self, std::size_t id, farray flat) {
            return self.p->begin(self.h, id, flat);
          },
          "bucket"_a, "flat"_a,
          "Checks and encodes every parameter of the bucket (`flat`: its float32 values, alive and unchanged until "
          "finish); returns the first round's requests [(op, element, array)].")
      .def(
          "complete",
          [](nb::pointer_and_handle<ddp_buckets> self, std::optional<std::vector<u8array>> gathered) {
            return self.p->complete(self.h, std::move(gathered));
          },
          "gathered"_a = nb::none(),
          "After the requests' collectives (sum/max arrays reduced in place; `gathered`: every rank's all-gather "
          "array, rank order): the next requests, [] when the step needs no more.")
      .def("finish", &ddp_buckets::finish, "flat"_a,
           "Writes the mean into `flat`; None, or [(name, failures, local_detail)] when the step was skipped.")
      .def("abandon", &ddp_buckets::abandon,
           "Drops a bucket step that cannot finish (a collective raised); its parameters' layers restart fresh.")
      .def("save_states", &ddp_buckets::save_states, "name -> checkpoint bytes of every parameter's layer.")
      .def("restore", &ddp_buckets::restore, "name"_a, "state"_a,
           "Restores a parameter's checkpoint now, or when its layer is made.")
      .def("clear_history", &ddp_buckets::clear_history, "Forgets the all-gather sizes (the capacity restarts dense).")
      .def("phases", &ddp_buckets::phases, "name -> phase of every parameter's codec.")
      .def("gradiveq_losses", &ddp_buckets::gradiveq_losses,
           "name -> (eq. 7 loss, energy) of this rank's last step, GradiVeQ layers encoded in it (L_c).")
      .def("pending_fits", &ddp_buckets::pending_fits,
           "[(name, work)] of the parameters whose GradiVeQ fit is pending (defer_fits), name order; work: the "
           "fit's relative cost, the same on every rank.")
      .def("fit", &ddp_buckets::fit, "name"_a,
           "Runs a parameter's pending fit; returns its bases (bytes) for adopt_fit on the other ranks.")
      .def("adopt_fit", &ddp_buckets::adopt_fit, "name"_a, "bases"_a,
           "Instead of fit: another rank's fit() bytes for the same parameter and step (checked; nothing changes "
           "on an error).")
      .def_prop_ro("running", &ddp_buckets::running)
      .def_prop_ro("encode_seconds", &ddp_buckets::encode_seconds, "checks, encodes, buffer fills (sum over steps)")
      .def_prop_ro("decode_seconds", &ddp_buckets::decode_seconds, "absorbs, decodes, the mean, fits (sum over steps)")
      .def_prop_ro("extra_collectives", &ddp_buckets::extra_collectives,
                   "all-gathers repeated because some rank's payloads outgrew the agreed capacity");
}
