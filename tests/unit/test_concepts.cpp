// Static concept tests: positive and negative archetypes for every concept.
#include <doctest/doctest.h>

#include <gradcomp/concepts.hpp>
#include <gradcomp/dense.hpp>

namespace {

using namespace gradcomp;

// A payload with everything the wire format needs.
struct toy_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::user_first;
  std::vector<float> v;
  std::uint64_t element_count() const { return v.size(); }
  std::size_t body_size() const { return v.size() * 4; }
  void write_body(wire::writer& w) const { w.put_array<float>(v); }
  static toy_payload read_body(wire::reader& r, const wire::header& h) { return {r.get_vector<float>(h.element_count)}; }
};

struct minimal_codec {
  using payload_type = toy_payload;
  void encode(std::span<const float> in, payload_type& p) { p.v.assign(in.begin(), in.end()); }
  void decode(const payload_type& p, std::span<float> out) const { std::copy(p.v.begin(), p.v.end(), out.begin()); }
  std::size_t encoded_bytes(const payload_type& p) const { return wire::serialized_size(p); }
};

// Same, but claims linearity through the trait specialisation instead of the member alias.
struct trait_linear_codec : minimal_codec {
  void accumulate(payload_type& a, const payload_type& b) const {
    for (std::size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
  }
};

// Has accumulate() but never opts in: must not be a LinearCodec.
struct unclaimed_linear_codec : trait_linear_codec {};

struct stateful_codec : minimal_codec {
  std::vector<std::byte> save_state() const { return {}; }
  void restore_state(std::span<const std::byte>) {}
};

// Negative archetypes.
struct not_a_codec {};
struct codec_without_decode {
  using payload_type = toy_payload;
  void encode(std::span<const float>, payload_type&) {}
  std::size_t encoded_bytes(const payload_type&) const { return 0; }
};
struct payload_without_wire {
  std::vector<float> v;
};
struct codec_with_unserialisable_payload {
  using payload_type = payload_without_wire;
  void encode(std::span<const float>, payload_type&) {}
  void decode(const payload_type&, std::span<float>) const {}
  std::size_t encoded_bytes(const payload_type&) const { return 0; }
};

struct fake_send { void wait() {} bool test() { return true; } };
struct fake_recv { message wait() { return {}; } bool test() { return true; } };
struct fake_transport {
  int rank() const { return 0; }
  int size() const { return 1; }
  fake_send isend(int, int, std::vector<std::byte>&&) { return {}; }
  fake_recv irecv(int, int) { return {}; }
};
struct transport_without_recv {
  int rank() const { return 0; }
  int size() const { return 1; }
  fake_send isend(int, int, std::vector<std::byte>&&) { return {}; }
};

struct custom_policy : execution::simd {};
struct stateful_policy : execution::seq { int x = 0; };
struct unrelated_policy {};

}  // namespace

template <>
inline constexpr bool gradcomp::enable_linear_codec<trait_linear_codec> = true;

static_assert(Codec<minimal_codec>);
static_assert(Codec<dense_codec<>>);
static_assert(Codec<dense_codec<execution::simd>>);
static_assert(!Codec<not_a_codec>);
static_assert(!Codec<codec_without_decode>);
static_assert(!Codec<codec_with_unserialisable_payload>);
static_assert(!Codec<int>);

static_assert(LinearCodec<dense_codec<>>);
static_assert(LinearCodec<trait_linear_codec>);
static_assert(!LinearCodec<unclaimed_linear_codec>, "accumulate() alone must not make a codec linear");
static_assert(!LinearCodec<minimal_codec>);

static_assert(DecodeAddCodec<dense_codec<>>);
static_assert(!DecodeAddCodec<minimal_codec>);

static_assert(StatefulCodec<stateful_codec>);
static_assert(!StatefulCodec<minimal_codec>);

static_assert(Transport<fake_transport>);
static_assert(!Transport<transport_without_recv>);
static_assert(!Transport<not_a_codec>);

static_assert(ExecutionPolicy<execution::seq>);
static_assert(ExecutionPolicy<execution::simd>);
static_assert(ExecutionPolicy<custom_policy>);
static_assert(!ExecutionPolicy<stateful_policy>, "policies are empty tags");
static_assert(!ExecutionPolicy<unrelated_policy>, "policies derive from execution::seq");

static_assert(wire::WirePayload<dense_payload>);
static_assert(!wire::WirePayload<payload_without_wire>);

TEST_CASE("linearity_defect is ~0 for dense_codec and large for a non-linear codec") {
  std::vector<std::vector<float>> xs = {{1, 2, 3}, {-4, 5, 0.5f}, {7, -8, 9}};
  dense_codec<> d;
  CHECK(linearity_defect(d, d, std::span<const std::vector<float>>(xs)) == doctest::Approx(0.0));

  // A codec that claims linearity but squares its input: the helper must catch it.
  struct squaring : trait_linear_codec {
    using codec_concept = linear_codec_tag;
    void encode(std::span<const float> in, payload_type& p) {
      p.v.resize(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) p.v[i] = in[i] * in[i];
    }
  };
  squaring s;
  CHECK(linearity_defect(s, s, std::span<const std::vector<float>>(xs)) > 1.0);
}

TEST_CASE("linearity_defect rejects inputs of different lengths") {
  std::vector<std::vector<float>> xs = {{1, 2, 3}, {1, 2}};
  dense_codec<> d;
  CHECK_THROWS_AS(linearity_defect(d, d, std::span<const std::vector<float>>(xs)), size_mismatch_error);
}
