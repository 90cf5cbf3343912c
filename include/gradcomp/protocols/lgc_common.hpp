#pragma once
/// \file protocols/lgc_common.hpp
/// Pieces the two LGC protocol forms share (protocols/lgc_ring.hpp,
/// protocols/lgc_ps.hpp): byte counting, DGC accumulation, the per-layer
/// innovation, message helpers.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/autoencoder.hpp>
#include <gradcomp/concepts.hpp>
#include <gradcomp/errors.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/sparsify.hpp>
#include <gradcomp/wire.hpp>

namespace gradcomp {

namespace detail {
GRADCOMP_ABI_NAMESPACE_BEGIN

/// A Transport that counts the bytes handed to isend (for lgc_traffic::wire_bytes).
template <Transport T>
class lgc_counting_transport {
 public:
  lgc_counting_transport(T& t, std::uint64_t& bytes) : t_(&t), bytes_(&bytes) {}
  int rank() const { return static_cast<int>(t_->rank()); }
  int size() const { return static_cast<int>(t_->size()); }
  auto isend(int peer, int tag, std::vector<std::byte>&& b) {
    *bytes_ += b.size();
    return t_->isend(peer, tag, std::move(b));
  }
  auto irecv(int peer, int tag) { return t_->irecv(peer, tag); }

 private:
  T* t_;
  std::uint64_t* bytes_;
};

/// Per-node accumulation with DGC momentum correction (Section V-A, [20]):
/// u <- m u + g, v <- v + u (m = 0: v <- v + g); the sent entries of v and u
/// are cleared (momentum-factor masking). Dense layers keep only u (their
/// contribution is u, or g when m = 0).
template <class Policy>
struct lgc_accumulator {
  std::vector<std::vector<float>> u, v;
  float m = 0.0f;

  void reset(const lgc_layout& layout, float momentum) {
    m = momentum;
    u.assign(layout.sizes.size(), {});
    v.assign(layout.sizes.size(), {});
    for (std::size_t l = 0; l < layout.sizes.size(); ++l) {
      if (m > 0.0f) u[l].assign(layout.sizes[l], 0.0f);
      if (layout.roles[l] != lgc_layer_role::dense) v[l].assign(layout.sizes[l], 0.0f);
    }
  }
  /// The contribution of a layer sent dense (phase 1, or a dense layer).
  void dense(std::size_t l, std::span<const float> g, std::vector<float>& out) {
    if (m > 0.0f) {
      axpby_update(Policy{}, std::span<float>(u[l]), g, m, 1.0f);
      out.insert(out.end(), u[l].begin(), u[l].end());
    } else {
      out.insert(out.end(), g.begin(), g.end());
    }
  }
  /// Folds g into the accumulation of a sparsified layer.
  void accumulate(std::size_t l, std::span<const float> g) {
    if (m > 0.0f) {
      axpby_update(Policy{}, std::span<float>(u[l]), g, m, 1.0f);
      axpby_update(Policy{}, std::span<float>(v[l]), std::span<const float>(u[l]), 1.0f, 1.0f);
    } else {
      axpby_update(Policy{}, std::span<float>(v[l]), g, 1.0f, 1.0f);
    }
  }
  /// Appends v[idx] to out and clears v and u there.
  void take(std::size_t l, std::span<const std::uint32_t> idx, std::vector<float>& out) {
    auto& vl = v[l];
    for (std::uint32_t i : idx) {
      out.push_back(vl[i]);
      vl[i] = 0.0f;
    }
    if (m > 0.0f)
      for (std::uint32_t i : idx) u[l][i] = 0.0f;
  }
};

/// Throws unless `layers` matches the layout and every value is finite.
template <class Policy>
void lgc_check_gradients(const lgc_layout& layout, std::span<const std::span<float>> layers, const char* who) {
  if (layers.size() != layout.sizes.size()) throw size_mismatch_error(std::string(who) + ": layers", layout.sizes.size(), layers.size());
  std::size_t offset = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].size() != layout.sizes[l])
      throw size_mismatch_error(std::string(who) + ": layer " + std::to_string(l), layout.sizes[l], layers[l].size());
    if (const auto bad = find_non_finite(Policy{}, std::span<const float>(layers[l])); bad != layers[l].size())
      throw non_finite_error(std::string(who) + " (index over all layers)", offset + bad);
    offset += layers[l].size();
  }
}

/// Per-layer innovation (Alg. 1): in each autoencoder layer, the
/// innovation_percent largest magnitudes among that layer's top-k values.
/// `positions` are increasing positions in the layout's concatenated space,
/// `values` their values; returns the selected (position, value) pairs.
template <class Policy>
void lgc_innovation(Policy, const lgc_layout& layout, double percent, std::span<const std::uint32_t> positions,
                    std::span<const float> values, std::vector<std::uint32_t>& out_pos, std::vector<float>& out_val,
                    execution::topk_workspace& ws) {
  out_pos.clear();
  out_val.clear();
  std::vector<std::uint32_t> sel;
  std::size_t j = 0;
  for (std::size_t l = 0; l < layout.sizes.size(); ++l) {
    if (layout.roles[l] != lgc_layer_role::autoencoder) continue;
    const std::size_t end_pos = layout.space_offset[l] + layout.sizes[l];
    std::size_t e = j;
    while (e < positions.size() && positions[e] < end_pos) ++e;
    const std::size_t cnt = e - j;
    if (cnt > 0) {
      const std::size_t kk = sparse_selection_count(cnt, percent);
      topk_exact(Policy{}, values.subspan(j, cnt), kk, sel, ws);
      for (std::uint32_t s : sel) {
        out_pos.push_back(positions[j + s]);
        out_val.push_back(values[j + s]);
      }
    }
    j = e;
  }
}

/// Values of a sparse (position, value) list at the increasing `slots`
/// positions (0 where absent), and the entries whose position is not a slot.
inline void lgc_map_to_slots(std::span<const std::uint32_t> slots, std::span<const std::uint32_t> pos,
                             std::span<const float> val, std::vector<float>& at_slots,
                             std::vector<std::uint32_t>* outside_pos, std::vector<float>* outside_val) {
  at_slots.assign(slots.size(), 0.0f);
  std::size_t s = 0;
  for (std::size_t j = 0; j < pos.size(); ++j) {
    while (s < slots.size() && slots[s] < pos[j]) ++s;
    if (s < slots.size() && slots[s] == pos[j]) {
      at_slots[s] = val[j];
    } else if (outside_pos) {
      outside_pos->push_back(pos[j]);
      outside_val->push_back(val[j]);
    }
  }
}

/// Receives one message and parses it as P (wire-validated).
template <class P, class T>
P lgc_receive(T& t, int peer, int tag) {
  message m = t.irecv(peer, tag).wait();
  return wire::parse<P>(m.bytes);
}

template <class P, class T>
std::size_t lgc_send(T& t, int peer, int tag, const P& p) {
  auto bytes = wire::serialize(p);
  const std::size_t n = bytes.size();
  t.isend(peer, tag, std::move(bytes)).wait();
  return n;
}

/// Wire bytes of a dense_payload of n floats (0 when nothing is sent).
inline std::size_t lgc_dense_bytes(std::size_t n) { return n ? wire::header_size + 4 * n : 0; }

GRADCOMP_ABI_NAMESPACE_END
}  // namespace detail

}  // namespace gradcomp
