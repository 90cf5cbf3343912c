// wire.hpp: round trips, and every rejection path gives its own wire_errc.
#include <doctest/doctest.h>

#include <gradcomp/dense.hpp>
#include <gradcomp/gradiveq/payload.hpp>
#include <gradcomp/wire.hpp>

#include <support/random_vectors.hpp>
#include <support/wire_checks.hpp>

#include <cstring>
#include <random>

using namespace gradcomp;
using wire::wire_errc;

namespace {

// n draws of Normal(0, 1) from a fresh std::mt19937(seed).
std::vector<float> random_floats(std::size_t n, unsigned seed) { return gradcomp::test_support::mt_normal(seed, n); }

wire_errc parse_error(std::span<const std::byte> bytes, const wire::parse_limits& limits = {}) {
  return test_support::parse_error_of<dense_payload>(bytes, limits);
}

// Recomputes the checksum after a deliberate edit, so the test reaches the
// check behind it instead of stopping at checksum_mismatch (CRC in host
// order: little-endian in CI; see the endian test below).
using test_support::reseal;

template <class T>
void poke(std::vector<std::byte>& bytes, std::size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

// A payload whose body claims a count it does not carry (for malformed_body).
struct counted_payload {
  static constexpr wire::codec_id wire_codec = wire::codec_id::user_first;
  std::vector<float> v;
  std::uint64_t element_count() const { return v.size(); }
  std::size_t body_size() const { return 8 + v.size() * 4; }
  void write_body(wire::writer& w) const {
    w.put<std::uint64_t>(v.size());
    w.put_array<float>(v);
  }
  static counted_payload read_body(wire::reader& r, const wire::header&) {
    const auto n = r.get<std::uint64_t>();
    return {r.get_vector<float>(n)};
  }
};

}  // namespace

TEST_CASE("dense payload round-trips bit-exactly, for every length") {
  for (std::size_t n : {0u, 1u, 2u, 7u, 1000u, 4097u}) {
    dense_payload p{random_floats(n, unsigned(n))};
    auto bytes = wire::serialize(p);
    CHECK(bytes.size() == wire::serialized_size(p));
    CHECK(bytes.size() == wire::header_size + 4 * n);
    auto q = wire::parse<dense_payload>(bytes);
    REQUIRE(q.values.size() == n);
    // Bitwise comparison (NaN-safe); memcmp is not called on empty (null) buffers.
    CHECK((n == 0 || std::memcmp(q.values.data(), p.values.data(), 4 * n) == 0));
  }
}

TEST_CASE("serialize_append writes each message as serialize does, after what the buffer holds") {
  std::vector<std::byte> out = {std::byte{7}, std::byte{8}, std::byte{9}};
  std::vector<std::vector<std::byte>> alone;
  std::vector<std::size_t> starts;
  for (std::size_t n : {0u, 1u, 17u, 5000u}) {
    const dense_payload p{random_floats(n, unsigned(n) + 3)};
    alone.push_back(wire::serialize(p));
    starts.push_back(out.size());
    wire::serialize_append(p, out);
    CHECK(out.size() - starts.back() == wire::serialized_size(p));
  }
  CHECK(out[0] == std::byte{7});  // what was there stays
  CHECK(out[2] == std::byte{9});
  for (std::size_t i = 0; i < alone.size(); ++i) {
    CAPTURE(i);
    const auto view = std::span<const std::byte>(out).subspan(starts[i], alone[i].size());
    CHECK(std::equal(view.begin(), view.end(), alone[i].begin(), alone[i].end()));  // header, body and CRC alike
    CHECK(wire::parse<dense_payload>(view).values == wire::parse<dense_payload>(alone[i]).values);
  }
}

TEST_CASE("header layout is the documented little-endian one") {
  dense_payload p{{1.0f, -2.0f, 3.5f}};
  auto bytes = wire::serialize(p);
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  CHECK(b[0] == 'G');
  CHECK(b[1] == 'C');
  CHECK(b[2] == 'W');
  CHECK(b[3] == '1');
  CHECK(b[4] == 1);  // version, low byte first
  CHECK(b[5] == 0);
  CHECK(b[6] == 1);  // codec_id::dense
  CHECK(b[8] == 1);  // float32
  CHECK(b[9] == 0);  // flags
  CHECK(b[12] == 3); // element_count low byte
  CHECK(b[20] == 12); // body_length low byte
  // 1.0f = 0x3F800000 little-endian at the start of the body.
  CHECK(b[32] == 0x00);
  CHECK(b[35] == 0x3F);
  const auto h = wire::parse_header(bytes);
  CHECK(h.element_count == 3);
  CHECK(h.body_length == 12);
}

TEST_CASE("CRC-32C matches the standard check value and the software path") {
  const char* text = "123456789";
  auto span = std::as_bytes(std::span(text, 9));
  CHECK(wire::crc32c(0, span) == 0xE3069283u);
  // Incremental == one shot.
  CHECK(wire::crc32c(wire::crc32c(0, span.first(4)), span.subspan(4)) == 0xE3069283u);
  // Software table path agrees with whatever crc32c() used, on odd lengths too.
  auto data = random_floats(1001, 3);
  auto bytes = std::as_bytes(std::span(data)).first(4001);
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  CHECK(~wire::detail::crc32c_update_soft(~0u, p, bytes.size()) == wire::crc32c(0, bytes));
  // Large buffers (three chains joined, on CPUs with the instruction), any
  // length and starting value, agree with the table path too.
  auto big = random_floats(70001, 4);
  for (std::size_t n : {std::size_t(16383), std::size_t(16384), std::size_t(49153), std::size_t(200003), std::size_t(280004)}) {
    CAPTURE(n);
    auto b = std::as_bytes(std::span(big)).first(n);
    auto* q = reinterpret_cast<const unsigned char*>(b.data());
    CHECK(~wire::detail::crc32c_update_soft(~0u, q, n) == wire::crc32c(0, b));
    CHECK(~wire::detail::crc32c_update_soft(~0x1234567u, q, n) == wire::crc32c(0x1234567u, b));
    CHECK(wire::crc32c(wire::crc32c(0, b.first(n / 2)), b.subspan(n / 2)) == wire::crc32c(0, b));
  }
  // The join: CRC(A then B) from CRC(A) and B's CRC from a zero running value.
  auto a = std::as_bytes(std::span(big)).first(1000);
  auto rest = std::as_bytes(std::span(big)).subspan(1000, 777);
  const std::uint32_t joined = wire::detail::crc32c_join(
      wire::detail::crc32c_update_soft(~0u, reinterpret_cast<const unsigned char*>(a.data()), a.size()),
      wire::detail::crc32c_update_soft(0u, reinterpret_cast<const unsigned char*>(rest.data()), rest.size()), rest.size());
  CHECK(~joined == wire::crc32c(wire::crc32c(0, a), rest));
}

TEST_CASE("each defect gives its own error code") {
  dense_payload p{random_floats(64, 1)};
  const auto good = wire::serialize(p);

  SUBCASE("truncated: every prefix is rejected as truncated") {
    test_support::check_truncations_rejected<dense_payload>(good);
  }
  SUBCASE("oversized: trailing bytes") {
    auto bytes = good;
    bytes.push_back(std::byte{0});
    CHECK(parse_error(bytes) == wire_errc::oversized);
  }
  SUBCASE("oversized: declared sizes above the limits, before any allocation") {
    wire::parse_limits small;
    small.max_element_count = 10;
    CHECK(parse_error(good, small) == wire_errc::oversized);
    wire::parse_limits tiny_body;
    tiny_body.max_body_length = 16;
    CHECK(parse_error(good, tiny_body) == wire_errc::oversized);
  }
  SUBCASE("bad magic") {
    auto bytes = good;
    bytes[0] = std::byte{'X'};
    CHECK(parse_error(bytes) == wire_errc::bad_magic);
  }
  SUBCASE("unsupported version") {
    auto bytes = good;
    poke<std::uint16_t>(bytes, 4, 2);
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::unsupported_version);
  }
  SUBCASE("wrong codec") {
    auto bytes = good;
    poke<std::uint16_t>(bytes, 6, static_cast<std::uint16_t>(wire::codec_id::two_bit));
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::wrong_codec);
  }
  SUBCASE("wrong element type") {
    auto bytes = good;
    bytes[8] = std::byte{7};
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::wrong_element_type);
  }
  SUBCASE("unknown flags and reserved bits are malformed headers") {
    auto bytes = good;
    bytes[9] = std::byte{0x80};
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::malformed_header);
    bytes = good;
    bytes[10] = std::byte{1};
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::malformed_header);
  }
  SUBCASE("a state where a payload is expected") {
    auto bytes = good;
    bytes[9] = std::byte{wire::flag_codec_state};
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::wrong_kind);
  }
  SUBCASE("corruption anywhere is caught by the checksum") {
    for (std::size_t at : {std::size_t{12}, std::size_t{20}, std::size_t{28}, std::size_t{40}, good.size() - 1}) {
      auto bytes = good;
      bytes[at] ^= std::byte{0x10};
      const auto code = parse_error(bytes);
      // Corrupting a length field may be seen first as a size defect; body and checksum bytes are checksum errors.
      if (at >= 28)
        CHECK(code == wire_errc::checksum_mismatch);
      else
        CHECK((code == wire_errc::checksum_mismatch || code == wire_errc::truncated || code == wire_errc::oversized));
    }
  }
  SUBCASE("body inconsistent with header") {
    auto bytes = good;
    poke<std::uint64_t>(bytes, 12, 63);  // element count 63 but 64 floats of body
    reseal(bytes);
    CHECK(parse_error(bytes) == wire_errc::malformed_body);
  }
}

TEST_CASE("a lying count inside the body cannot make the parser over-read or over-allocate") {
  counted_payload p{random_floats(8, 2)};
  auto bytes = wire::serialize(p);
  CHECK(wire::parse<counted_payload>(bytes).v.size() == 8);
  poke<std::uint64_t>(bytes, wire::header_size, std::uint64_t{1} << 60);
  reseal(bytes);
  CHECK(test_support::parse_error_of<counted_payload>(bytes) == wire_errc::truncated);
  poke<std::uint64_t>(bytes, wire::header_size, 7);  // fewer than present: leftover bytes
  reseal(bytes);
  CHECK(test_support::parse_error_of<counted_payload>(bytes) == wire_errc::malformed_body);
}

TEST_CASE("varints round-trip and malformed ones are rejected") {
  std::vector<std::byte> buf;
  wire::writer w(buf);
  const std::uint64_t values[] = {0, 1, 127, 128, 300, 1u << 21, (std::uint64_t{1} << 63) + 5, ~std::uint64_t{0}};
  for (auto v : values) w.put_varint(v);
  std::size_t expected_size = 0;
  for (auto v : values) expected_size += wire::varint_size(v);
  CHECK(buf.size() == expected_size);
  wire::reader r(buf);
  for (auto v : values) CHECK(r.get_varint() == v);
  r.expect_end();

  std::vector<std::byte> too_long(11, std::byte{0x80});
  wire::reader r2(too_long);
  CHECK_THROWS_AS(r2.get_varint(), wire::wire_error);
  std::vector<std::byte> unterminated(3, std::byte{0x80});
  wire::reader r3(unterminated);
  try {
    r3.get_varint();
    FAIL("accepted an unterminated varint");
  } catch (const wire::wire_error& e) {
    CHECK(e.code() == wire_errc::truncated);
  }
}

TEST_CASE("saved states use the same container with the state flag") {
  auto bytes = wire::serialize_state(wire::codec_id::two_bit, 5, [](wire::writer& w) {
    w.put<float>(0.5f);
    w.put<std::uint32_t>(42);
  });
  wire::header h;
  auto r = wire::parse_state(bytes, wire::codec_id::two_bit, &h);
  CHECK(h.is_state());
  CHECK(h.element_count == 5);
  CHECK(r.get<float>() == 0.5f);
  CHECK(r.get<std::uint32_t>() == 42);
  r.expect_end();
  CHECK_THROWS_AS(wire::parse_state(bytes, wire::codec_id::qsgd), wire::wire_error);
  // A payload is not a state.
  auto payload = wire::serialize(dense_payload{{1.0f}});
  try {
    wire::parse_state(payload, wire::codec_id::dense);
    FAIL("payload accepted as state");
  } catch (const wire::wire_error& e) {
    CHECK(e.code() == wire_errc::wrong_kind);
  }
}

TEST_CASE("wire errors are gradcomp errors and std::error_codes") {
  std::vector<std::byte> nothing;
  try {
    (void)wire::parse<dense_payload>(nothing);
    FAIL("accepted empty buffer");
  } catch (const gradcomp::error& e) {
    auto* w = dynamic_cast<const wire::wire_error*>(&e);
    REQUIRE(w != nullptr);
    std::error_code ec = w->code();
    CHECK(ec == wire_errc::truncated);
    CHECK(ec.category().name() == std::string("gradcomp.wire"));
    CHECK(std::string(e.what()).find("truncated") != std::string::npos);
  }
}

TEST_CASE("serialize_into reuses the buffer and replaces its content") {
  std::vector<std::byte> buf;
  wire::serialize_into(dense_payload{random_floats(100, 5)}, buf);
  const auto cap = buf.capacity();
  wire::serialize_into(dense_payload{random_floats(10, 6)}, buf);
  CHECK(buf.size() == wire::header_size + 40);
  CHECK(buf.capacity() == cap);
  CHECK(wire::parse<dense_payload>(buf).values.size() == 10);
}

TEST_CASE("a GradiVeQ payload with NaN or Inf anywhere is rejected at parse, extreme finite values are not") {
  gradiveq_payload p;
  p.fingerprint = 7;
  p.count = 1;
  p.slice_size = 4;
  p.length = 4 * 300 + 3;
  p.coefficients = random_floats(1000, 9);
  p.tail = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::denorm_min(), -0.0f};
  p.coefficients[3] = -std::numeric_limits<float>::max();
  CHECK(wire::parse<gradiveq_payload>(wire::serialize(p)).coefficients == p.coefficients);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const std::size_t at : {std::size_t(0), std::size_t(17), std::size_t(999)}) {
      auto q = p;
      q.coefficients[at] = bad;
      CHECK(test_support::parse_error_of<gradiveq_payload>(wire::serialize(q)) == wire::wire_errc::malformed_body);
    }
    auto q = p;
    q.tail[2] = bad;
    CHECK(test_support::parse_error_of<gradiveq_payload>(wire::serialize(q)) == wire::wire_errc::malformed_body);
  }
}

TEST_CASE("parse_into gives parse's payload and keeps the buffers of one that has read_body_into") {
  gradiveq_payload p;
  p.fingerprint = 0xC0FFEEu;
  p.count = 2;
  p.slice_size = 4;
  p.offset = 8;
  p.length = 10;  // two slices and a tail of 2
  p.coefficients = {1.5f, -2.0f, 0.25f};
  p.tail = {3.0f, -4.0f};
  const auto bytes = wire::serialize(p);
  gradiveq_payload q;
  wire::parse_into(bytes, q);
  CHECK(q.coefficients == p.coefficients);
  CHECK(q.tail == p.tail);
  CHECK(q.fingerprint == p.fingerprint);
  CHECK(q.count == 2);
  CHECK(q.offset == 8);
  CHECK(q.length == 10);
  const float* kept = q.coefficients.data();
  p.coefficients = {7.0f, 8.0f, 9.0f};
  wire::parse_into(wire::serialize(p), q);
  CHECK(q.coefficients.data() == kept);  // same size: the same buffer, no allocation
  CHECK(q.coefficients == p.coefficients);
  // The parse checks hold as in parse(): a non-finite value, a truncated body.
  p.coefficients[1] = std::numeric_limits<float>::infinity();
  const auto bad = wire::serialize(p);
  auto into_error = [&](std::span<const std::byte> b) {
    try {
      wire::parse_into(b, q);
    } catch (const wire::wire_error& e) {
      return e.code();
    }
    FAIL("parse_into accepted bytes it should reject");
    return wire::wire_errc::truncated;
  };
  CHECK(into_error(bad) == wire::wire_errc::malformed_body);
  CHECK(test_support::parse_error_of<gradiveq_payload>(bad) == wire::wire_errc::malformed_body);
  CHECK(into_error(std::span<const std::byte>(bytes).first(bytes.size() - 1)) == wire::wire_errc::truncated);
  // A payload without read_body_into is assigned parse's result.
  dense_payload d{{1.0f, 2.0f}};
  wire::parse_into(wire::serialize(dense_payload{random_floats(5, 3)}), d);
  CHECK(d.values == random_floats(5, 3));
}
