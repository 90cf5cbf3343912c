#include "lgc_bench_layout.hpp"

#include <vector>

#include <gradcomp/autoencoder.hpp>

#include "../common.hpp"
#include "../resnet50_model.hpp"

namespace gradcomp::bench {

lgc_bench_shape lgc_resnet50_shape() {
  std::vector<std::size_t> sizes;  // the weight tensors (rank >= 2), as bench_lgc
  for (const auto& l : resnet50_model().layers())
    if (l.tensor_rank >= 2) sizes.push_back(l.shape.size());
  const lgc_options o;  // alpha 0.1%, window 1024, Tables I-II
  const lgc_layout layout(sizes, o);
  lgc_bench_shape s;
  s.weights = layout.total;
  s.mu = layout.mu;
  s.window = o.window;
  s.windows = layout.windows(o.window);
  s.architecture = o.architecture;
  return s;
}

lgc_cpu_times lgc_cpu_encode_decode(const lgc_bench_shape& s, std::size_t rounds) {
  const lgc_network net(lgc_form::ring, 1, s.window, s.architecture, 1);
  nn1d::tensor<float> x, code, y;
  x.resize(1, nn1d::index_type(s.window), nn1d::index_type(s.windows));
  const auto stream = gradcomp::detail::counter_rng(7).stream(0);
  for (nn1d::index_type i = 0; i < x.data.size(); ++i) x.data.data()[i] = 2.0f * stream.uniform_float(std::uint64_t(i)) - 1.0f;
  lgc_network::workspace ws;
  net.encode(x, code, ws);
  const auto t = interleaved_best(int(rounds), {[&] { net.encode(x, code, ws); },
                                                [&] { net.decode(0, code, nullptr, y, ws); }});
  return {t[0], t[1]};
}

}  // namespace gradcomp::bench
