// libFuzzer target: arbitrary bytes as parameter-server frames
// (parameter_server.hpp), given to every party that parses them: the
// asynchronous server (sparse and dense uplinks), its workers, the
// synchronous server and its workers, and the control-message parser.
// Each must either accept or reject with a typed gradcomp error, never read
// out of bounds or over-allocate, and a rejected frame must leave the
// receiver's state (server model and copies, worker model, aggregate output)
// exactly as it was. Fuzz builds skip the CRC (wire.hpp), so mutated bodies
// reach the parsers.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <gradcomp/parameter_server.hpp>
#include <gradcomp/presets/parameter_server_rules.hpp>

namespace {

using namespace gradcomp;

const layer_partition& layers() {
  static const layer_partition L({7, 33});
  return L;
}
std::vector<float> theta0() {
  std::vector<float> t(layers().total());
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = float(int(i % 13) - 6) * 0.125f;
  return t;
}

template <class Server>
std::vector<float> snapshot(const Server& s) {
  std::vector<float> v(s.model().begin(), s.model().end());
  if (s.options().downlink == ps_downlink::model_difference)
    for (int k = 0; k < s.workers(); ++k) v.insert(v.end(), s.state().replica(k).begin(), s.state().replica(k).end());
  v.push_back(float(s.state().timestamp()));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class Server>
void to_server(Server& s, std::span<const std::byte> bytes) {
  const auto before = snapshot(s);
  const ps_handled h = s.handle(1, bytes);
  if (h.event == ps_event::rejected && !same_bits(before, snapshot(s))) std::abort();
  if (h.event != ps_event::left && h.reply.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  const auto t0 = theta0();

  // The control message on its own: what parses must round-trip.
  try {
    const auto c = wire::parse<ps_control>(bytes);
    const auto once = wire::serialize(c);
    if (wire::serialize(wire::parse<ps_control>(once)) != once) std::abort();
  } catch (const wire::wire_error&) {
  }

  // Asynchronous servers: sparse (DGS, secondary compression) and dense uplinks.
  {
    async_ps_options opt;
    opt.secondary_ratio = 20;
    async_ps_server<sa_momentum<>> s(layers(), t0, 2, dgs_rule<>{.ratio_percent = 10}, opt);
    to_server(s, bytes);
    async_ps_server<dense_codec<>> d(layers(), t0, 2, asgd_rule<>{});
    to_server(d, bytes);
  }

  // An asynchronous worker waiting for the reply to its first push.
  {
    async_ps_worker<sa_momentum<>> w(layers(), dgs_rule<>{.ratio_percent = 10});
    std::vector<float> g(layers().total(), 0.25f);
    (void)w.make_push(g, 0.1f);
    std::vector<float> model = t0;
    try {
      (void)w.apply_reply(bytes, model);
    } catch (const gradcomp::error&) {
      if (!same_bits(model, t0)) std::abort();
    }
  }

  // The synchronous server (a round with this frame from worker 0 and a valid push from worker 1)...
  {
    sync_ps_server<sparsifier_with_memory<>> s(layers(), 2, gd_async_rule<>{.ratio_percent = 50});
    sync_ps_worker<sparsifier_with_memory<>> w(layers(), gd_async_rule<>{.ratio_percent = 50});
    std::vector<float> g(layers().total(), 0.5f);
    std::vector<std::vector<std::byte>> frames = {std::vector<std::byte>(bytes.begin(), bytes.end()), w.make_push(g)};
    if (frames[0].empty()) frames[0].push_back(std::byte{0});
    const auto replies = s.round(frames);
    if (replies[1].empty()) std::abort();  // the valid worker is always answered
    // ...and its worker, given this frame as the aggregate.
    std::vector<float> out(layers().total(), 3.0f);
    const auto before = out;
    try {
      (void)w.apply_aggregate(bytes, out);
    } catch (const gradcomp::error&) {
      if (!same_bits(out, before)) std::abort();
    }
  }
  return 0;
}
