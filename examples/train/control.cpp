// The demo's small collectives over the control transport (evaluation,
// checksums, barriers; exchange.hpp): not counted as gradient traffic.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gradcomp/errors.hpp>

#include "exchange.hpp"

namespace train {

std::vector<std::vector<std::byte>> allgather_bytes(counted_transport& t, std::vector<std::byte> mine, int tag) {
  const int n = t.size(), r = t.rank();
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(n));
  all[static_cast<std::size_t>(r)] = mine;
  if (n == 1) return all;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Step s forwards the block of rank (r - s) mod n.
  std::vector<any_send_handle> sends;
  sends.push_back(t.isend(next, tag, std::move(mine)));
  for (int s = 1; s < n; ++s) {
    gradcomp::message m = t.irecv(prev, tag).wait();
    const int owner = ((r - s) % n + n) % n;
    all[static_cast<std::size_t>(owner)] = m.bytes;
    if (s + 1 < n) sends.push_back(t.isend(next, tag, std::move(m.bytes)));
  }
  for (auto& h : sends) h.wait();
  return all;
}

std::vector<std::vector<double>> allgather_doubles(counted_transport& t, std::span<const double> mine, int tag) {
  std::vector<std::byte> bytes(mine.size_bytes());
  if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  auto all = allgather_bytes(t, std::move(bytes), tag);
  std::vector<std::vector<double>> out(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].size() != mine.size_bytes())
      throw gradcomp::transport_error("allgather_doubles: rank " + std::to_string(i) + " sent " +
                                      std::to_string(all[i].size()) + " bytes, expected " +
                                      std::to_string(mine.size_bytes()));
    out[i].resize(mine.size());
    if (!mine.empty()) std::memcpy(out[i].data(), all[i].data(), all[i].size());
  }
  return out;
}

void barrier(counted_transport& t, int tag) { allgather_bytes(t, {}, tag); }

}  // namespace train
