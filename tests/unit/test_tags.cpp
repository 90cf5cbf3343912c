// The tag registry (tags.hpp): disjoint ranges below MPI's guaranteed bound,
// and the run-time check of a user's tag_base.
#include <doctest/doctest.h>

#include <gradcomp/tags.hpp>

using namespace gradcomp;

namespace {
constexpr bool all_pairs_disjoint() {
  for (const auto& a : tags::registry)
    for (const auto& b : tags::registry)
      if (&a != &b && a.overlaps(b.first, b.count)) return false;
  return true;
}
static_assert(all_pairs_disjoint(), "every tag range is disjoint from every other");
static_assert(tags::registry.back().end() <= tags::mpi_tag_upper_bound + 1, "all tags fit in MPI's smallest MPI_TAG_UB");
static_assert(tags::registry.front().first == 0);
}  // namespace

TEST_CASE("tags: the registry's ranges are increasing, disjoint and inside [0, 32767]") {
  CHECK(tags::registry_is_valid());
  for (std::size_t i = 1; i < tags::registry.size(); ++i) {
    CHECK(tags::registry[i - 1].end() <= tags::registry[i].first);
    CHECK(tags::registry[i].end() <= 32768);
  }
}

TEST_CASE("tags: a piece may stay in its own range or move to the user range") {
  CHECK_NOTHROW(tags::check_tag_base(tags::ring, tags::ring.first, 2, "ring"));
  CHECK_NOTHROW(tags::check_tag_base(tags::ring, tags::ring.end() - 2, 2, "ring"));
  CHECK_NOTHROW(tags::check_tag_base(tags::ring, 100, 2, "ring"));
  CHECK_NOTHROW(tags::check_tag_base(tags::lgc, 0, 20, "lgc"));
  CHECK_NOTHROW(tags::check_tag_base(tags::ring, 32766, 2, "ring"));  // past the ring's range, still below 32767
}

TEST_CASE("tags: a tag_base that collides with another piece or leaves [0, 32767] is refused") {
  // Inside the parameter server's range.
  CHECK_THROWS_AS(tags::check_tag_base(tags::ring, tags::parameter_server.first, 2, "ring"), invalid_argument_error);
  // Straddling the end of the user range into the exchange's.
  CHECK_THROWS_AS(tags::check_tag_base(tags::lgc, tags::user.end() - 5, 20, "lgc"), invalid_argument_error);
  CHECK_THROWS_AS(tags::check_tag_base(tags::ring, -1, 2, "ring"), invalid_argument_error);
  CHECK_THROWS_AS(tags::check_tag_base(tags::ring, 32767, 2, "ring"), invalid_argument_error);
  CHECK_THROWS_AS(tags::check_tag_base(tags::ring, 0, 0, "ring"), invalid_argument_error);
  try {
    tags::check_tag_base(tags::ring, 31000, 2, "ring_allreduce");
    FAIL("collision accepted");
  } catch (const invalid_argument_error& e) {
    const std::string what = e.what();
    CHECK(what.find("ring_allreduce") != std::string::npos);
    CHECK(what.find("parameter servers") != std::string::npos);
  }
}
