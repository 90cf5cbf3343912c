// examples/train: data-parallel training of a small ResNet on Fashion-MNIST
// with every gradcomp configuration side by side (issue 8).
//
// libtorch computes the gradients; gradcomp (exchange.cpp) compresses,
// exchanges and aggregates them, one codec per layer per worker; the
// aggregate goes back into .grad and momentum SGD takes the step.
// See examples/train/README.md for the build and run commands.

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gradcomp/errors.hpp>
#include <gradcomp/transport/inproc.hpp>
#if defined(GRADCOMP_HAS_MPI)
#include <gradcomp/transport/mpi.hpp>
#endif

#include "common.hpp"
#include "data.hpp"
#include "exchange.hpp"
#include "model.hpp"
#include "report.hpp"
#include "transport.hpp"

namespace train {
namespace {

// Control tags (evaluation, checksums, barriers): below the data tags and
// MPI's guaranteed MPI_TAG_UB.
constexpr int tag_eval = 100, tag_checksum = 101, tag_barrier = 102, tag_final = 103;

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// A bad command line or option value: message, exit code 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Fisher-Yates with splitmix64: the same permutation on every platform.
void shuffle(std::vector<std::uint32_t>& v, std::uint64_t seed) {
  std::uint64_t state = seed;
  for (std::size_t i = v.size(); i > 1; --i) {
    const std::size_t j = splitmix64(state) % i;
    std::swap(v[i - 1], v[j]);
  }
}

/// Which training images worker r sees: the subset is a seeded permutation
/// of the training set cut to train_samples; shard r holds every N-th image
/// of it, reshuffled each epoch. msgd_single concatenates the N shards'
/// batches, so it sees exactly the global batches of the N-worker runs.
struct data_plan {
  std::size_t shards = 1;
  std::size_t batch = 1;  // per shard
  std::size_t steps_per_epoch = 0;
  std::vector<std::vector<std::uint32_t>> shard;  // per shard, base order
  std::uint64_t seed = 0;

  data_plan(std::size_t train_count, const run_options& o) : shards(std::size_t(o.workers)), batch(o.batch), seed(o.seed) {
    std::vector<std::uint32_t> all(train_count);
    std::iota(all.begin(), all.end(), 0u);
    shuffle(all, seed ^ 0x5EED5EEDull);
    const std::size_t subset = o.train_samples ? o.train_samples : train_count;
    shard.resize(shards);
    for (std::size_t i = 0; i < subset; ++i) shard[i % shards].push_back(all[i]);
    std::size_t smallest = shard.back().size();
    for (auto& s : shard) smallest = std::min(smallest, s.size());
    steps_per_epoch = smallest / batch;
  }
  /// The order of shard r in epoch e.
  std::vector<std::uint32_t> epoch_order(std::size_t r, std::size_t e) const {
    auto v = shard[r];
    std::uint64_t k = seed * 0x100000001B3ull + e * 0x9E3779B97F4A7C15ull + r * 0xD1B54A32D192ED03ull;
    shuffle(v, splitmix64(k));
    return v;
  }
};

/// A batch tensor pair from image indices.
std::pair<torch::Tensor, torch::Tensor> make_batch(const image_set& s, std::span<const std::uint32_t> idx) {
  const auto b = static_cast<std::int64_t>(idx.size());
  const std::size_t px = s.pixels_per_image();
  auto x = torch::empty({b, 1, std::int64_t(s.rows), std::int64_t(s.cols)}, torch::kFloat32);
  auto y = torch::empty({b}, torch::kInt64);
  float* xp = x.data_ptr<float>();
  std::int64_t* yp = y.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < idx.size(); ++i) {
    std::memcpy(xp + i * px, s.pixels.data() + std::size_t(idx[i]) * px, px * sizeof(float));
    yp[i] = s.labels[idx[i]];
  }
  return {x, y};
}

/// FNV-1a over the parameters' bytes: equal iff the replicas are bit-identical (w.h.p.).
std::uint64_t parameter_checksum(small_resnet& net) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const auto& p : net->parameters()) {
    auto c = p.detach().contiguous();
    const auto* b = reinterpret_cast<const unsigned char*>(c.data_ptr<float>());
    const std::size_t n = std::size_t(c.numel()) * sizeof(float);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  }
  return h;
}

/// Learning rate of step t of T: linear warm-up over the first 3% of the
/// steps, then cosine decay to 0.
double learning_rate(const run_options& o, std::size_t t, std::size_t total) {
  const double warm = std::max(1.0, 0.03 * double(total));
  const double w = std::min(1.0, double(t + 1) / warm);
  return o.lr * w * 0.5 * (1.0 + std::cos(M_PI * double(t) / double(total)));
}

/// Everything a worker needs, shared read-only between the worker threads.
struct run_context {
  config_id config;
  const run_options* options;
  const fashion_mnist* data;
  const data_plan* plan;
  const small_resnet* prototype;
  std::vector<layer_desc> layers;
  std::vector<std::vector<float>> initial;  ///< the prototype's parameters, per layer
  std::size_t total_steps = 0;
  std::size_t eval_interval = 0;
  int torch_threads = 1;
  std::ostream* log = nullptr;
};

/// What worker 0 reports back.
struct worker_report {
  run_result result;
};

/// Test-set evaluation shared across the ranks: rank r takes images r, r+n, ...
/// of the first `count`; returns accuracy in percent (identical on every rank).
double evaluate(small_resnet& net, const image_set& test, std::size_t count, counted_transport& ctl) {
  torch::NoGradGuard no_grad;
  net->eval();
  const int n = ctl.size(), r = ctl.rank();
  std::vector<std::uint32_t> mine;
  for (std::size_t i = std::size_t(r); i < count; i += std::size_t(n)) mine.push_back(std::uint32_t(i));
  double correct = 0;
  constexpr std::size_t chunk = 500;
  for (std::size_t at = 0; at < mine.size(); at += chunk) {
    const std::size_t len = std::min(chunk, mine.size() - at);
    auto [x, y] = make_batch(test, std::span<const std::uint32_t>(mine).subspan(at, len));
    auto pred = net->forward(x).argmax(1);
    correct += double(pred.eq(y).sum().item<std::int64_t>());
  }
  net->train();
  const double local[2] = {correct, double(mine.size())};
  auto all = allgather_doubles(ctl, local, tag_eval);
  double c = 0, total = 0;
  for (auto& v : all) {
    c += v[0];
    total += v[1];
  }
  return total > 0 ? 100.0 * c / total : 0.0;
}

std::string bytes_short(double b) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  if (b >= 1 << 20) s << b / double(1 << 20) << " MiB";
  else if (b >= 1 << 10) s << b / double(1 << 10) << " KiB";
  else s << std::setprecision(0) << b << " B";
  return s.str();
}

/// One worker's training run. `single` means msgd_single: this (only) worker
/// trains on the concatenation of all shards' batches.
void worker_main(const run_context& ctx, counted_transport& data, counted_transport& ctl, worker_report* report) {
  const run_options& o = *ctx.options;
  const bool single = ctx.config == config_id::msgd_single;
  const int rank = ctl.rank();
  const bool leader = rank == 0;
  torch::set_num_threads(ctx.torch_threads);

  // The replica: same initial parameters as the prototype on every worker.
  small_resnet net(o.width);
  {
    torch::NoGradGuard no_grad;
    auto src = ctx.prototype->get()->parameters();
    auto dst = net->parameters();
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  }
  auto params = net->parameters();
  if (params.size() != ctx.layers.size()) throw std::logic_error("parameter list and layer list differ");
  auto ex = make_exchanger(ctx.config, o, data, ctx.layers, ctx.initial, ctx.total_steps);
  // With DGC momentum correction the codec carries the momentum.
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(o.lr)
                                          .momentum(ex->momentum_in_codec() ? 0.0 : o.momentum)
                                          .weight_decay(o.weight_decay));
  std::vector<std::vector<float>> grads(params.size());
  std::vector<std::span<float>> spans(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    grads[i].resize(std::size_t(params[i].numel()));
    spans[i] = grads[i];
  }

  const data_plan& plan = *ctx.plan;
  const image_set& train_set = ctx.data->train;
  std::vector<std::vector<std::uint32_t>> order(plan.shards);
  std::size_t current_epoch = std::size_t(-1);

  const auto t_start = clock_type::now();
  double compute_s = 0, aggregation_s = 0;
  double loss_sum = 0, loss_interval_sum = 0;
  std::size_t loss_count = 0, loss_interval_count = 0;
  std::vector<curve_point> curve;
  const std::size_t eval_count_mid = o.eval_samples ? o.eval_samples : ctx.data->test.count;

  auto record_point = [&](std::size_t step, bool final_point) {
    const std::size_t count = final_point ? ctx.data->test.count : eval_count_mid;
    const double acc = evaluate(net, ctx.data->test, count, ctl);
    const double local[3] = {loss_sum, double(loss_count), double(data.bytes_sent())};
    auto all = allgather_doubles(ctl, local, tag_eval);
    double ls = 0, lc = 0, bytes = 0;
    for (auto& v : all) {
      ls += v[0];
      lc += v[1];
      bytes += v[2];
    }
    loss_sum = 0;
    loss_count = 0;
    curve_point p;
    p.step = step;
    p.epoch = double(step) / double(plan.steps_per_epoch);
    p.train_loss = lc > 0 ? ls / lc : std::nan("");
    p.test_accuracy = acc;
    p.test_samples = count;
    p.cumulative_bytes = bytes / double(all.size());
    p.wall_seconds = seconds_since(t_start);
    curve.push_back(p);
    if (leader) {
      std::ostringstream line;
      line << "[" << config_name(ctx.config) << "] epoch " << std::fixed << std::setprecision(2) << p.epoch
           << " step " << step << "/" << ctx.total_steps << " | train loss ";
      if (std::isnan(p.train_loss)) line << "-";
      else line << std::setprecision(4) << p.train_loss;
      line << " | test acc " << std::setprecision(2) << acc << "% (" << count << " images) | sent/worker "
           << bytes_short(p.cumulative_bytes) << " | " << std::setprecision(1) << p.wall_seconds << " s";
      if (auto ph = ex->phase(); !ph.empty()) line << " | " << ph;
      *ctx.log << line.str() << std::endl;
    }
    return acc;
  };

  bool in_sync = ex->synchronous();  // asynchronous replicas agree only after finish()
  auto check_replicas = [&](std::size_t step) {
    if (ctl.size() == 1 || !in_sync) return;
    const std::uint64_t h = parameter_checksum(net);
    std::vector<std::byte> b(sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    auto all = allgather_bytes(ctl, std::move(b), tag_checksum);
    for (std::size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0]) {
        std::uint64_t h0, hr;
        std::memcpy(&h0, all[0].data(), 8);
        std::memcpy(&hr, all[r].data(), 8);
        std::ostringstream m;
        m << "replicas diverged after step " << step << ": worker " << r << " has parameter checksum " << std::hex
          << hr << ", worker 0 has " << h0;
        throw std::runtime_error(m.str());
      }
  };

  record_point(0, false);
  for (std::size_t step = 0; step < ctx.total_steps; ++step) {
    const std::size_t epoch = step / plan.steps_per_epoch, in_epoch = step % plan.steps_per_epoch;
    if (epoch != current_epoch) {
      current_epoch = epoch;
      for (std::size_t r = 0; r < plan.shards; ++r)
        if (single || r == std::size_t(rank)) order[r] = plan.epoch_order(r, epoch);
    }
    std::vector<std::uint32_t> idx;
    if (single) {
      for (std::size_t r = 0; r < plan.shards; ++r)
        idx.insert(idx.end(), order[r].begin() + std::ptrdiff_t(in_epoch * plan.batch),
                   order[r].begin() + std::ptrdiff_t((in_epoch + 1) * plan.batch));
    } else {
      const auto& mine = order[std::size_t(rank)];
      idx.assign(mine.begin() + std::ptrdiff_t(in_epoch * plan.batch),
                 mine.begin() + std::ptrdiff_t((in_epoch + 1) * plan.batch));
    }
    auto [x, y] = make_batch(train_set, idx);

    const auto t0 = clock_type::now();
    net->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    const double loss_value = loss.item<double>();
    if (!std::isfinite(loss_value))
      throw std::runtime_error(std::string(config_name(ctx.config)) + ": loss is not finite at step " +
                               std::to_string(step) + " (diverged; try a smaller --lr)");
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].grad().contiguous();
      std::memcpy(grads[i].data(), g.data_ptr<float>(), grads[i].size() * sizeof(float));
    }
    compute_s += seconds_since(t0);

    const double lr = learning_rate(o, step, ctx.total_steps);
    if (ctl.size() > 1 && ex->synchronous()) barrier(ctl, tag_barrier);  // exchange time excludes stragglers
    const auto t1 = clock_type::now();
    ex->exchange(step, lr, spans);
    aggregation_s += seconds_since(t1);

    {
      torch::NoGradGuard no_grad;
      if (ex->kind() == update_kind::gradient) {
        for (std::size_t i = 0; i < params.size(); ++i) {
          auto g = params[i].mutable_grad();
          std::memcpy(g.data_ptr<float>(), grads[i].data(), grads[i].size() * sizeof(float));
        }
        for (auto& group : optimizer.param_groups())
          static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr * ex->lr_multiplier());
        optimizer.step();
      } else {  // update_kind::model: the new parameters
        for (std::size_t i = 0; i < params.size(); ++i)
          params[i].copy_(torch::from_blob(grads[i].data(), params[i].sizes(), torch::kFloat32));
      }
    }

    loss_sum += loss_value;
    ++loss_count;
    loss_interval_sum += loss_value;
    ++loss_interval_count;
    const std::size_t done = step + 1;
    if (leader && o.log_every && done % o.log_every == 0 && done % ctx.eval_interval != 0) {
      *ctx.log << "[" << config_name(ctx.config) << "] epoch " << std::fixed << std::setprecision(2)
               << double(done) / double(plan.steps_per_epoch) << " step " << done << "/" << ctx.total_steps
               << " | loss " << std::setprecision(4) << loss_interval_sum / double(loss_interval_count)
               << " (worker 0) | lr " << std::setprecision(4) << lr << " | agg " << std::setprecision(2)
               << 1e3 * aggregation_s / double(done) << " ms/step";
      if (auto ph = ex->phase(); !ph.empty()) *ctx.log << " | " << ph;
      *ctx.log << std::endl;
      loss_interval_sum = 0;
      loss_interval_count = 0;
    }
    if (o.check_every && done % o.check_every == 0) check_replicas(done);
    if (done % ctx.eval_interval == 0 && done != ctx.total_steps) record_point(done, false);
  }
  // The training traffic, before any final synchronisation.
  const double sent_training = double(data.bytes_sent());
  if (ex->finish(ctl, spans)) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i].copy_(torch::from_blob(grads[i].data(), params[i].sizes(), torch::kFloat32));
    in_sync = true;
  }
  check_replicas(ctx.total_steps);
  const double final_acc = record_point(ctx.total_steps, true);
  const double wall = seconds_since(t_start);

  // Bytes per worker per step, mean over the workers.
  const double local[2] = {sent_training, double(ex->counters.received_bytes)};
  auto all = allgather_doubles(ctl, local, tag_final);
  double sent = 0, recv = 0;
  for (auto& v : all) {
    sent += v[0];
    recv += v[1];
  }
  if (leader && report) {
    run_result& r = report->result;
    r.config = ctx.config;
    r.workers = single ? 1 : ctl.size();
    r.steps = ctx.total_steps;
    r.global_batch = plan.batch * plan.shards;
    r.final_accuracy = final_acc;
    r.wire_bytes_per_step = sent / double(all.size()) / double(ctx.total_steps);
    r.recv_bytes_per_step = recv / double(all.size()) / double(ctx.total_steps);
    r.counters = ex->counters;
    r.target_label = ex->target_label();
    r.aggregation_ms = 1e3 * aggregation_s / double(ctx.total_steps);
    r.compute_ms = 1e3 * compute_s / double(ctx.total_steps);
    r.wall_seconds = wall;
    r.curve = std::move(curve);
    r.note = ex->summary();
    r.extra_ratios = ex->extra_ratios();
  }
}

/// Layer list of the model, in parameters() order.
std::vector<layer_desc> describe_layers(small_resnet& net) {
  std::vector<layer_desc> out;
  for (const auto& item : net->named_parameters()) {
    const auto& t = item.value();
    layer_desc d;
    d.name = item.key();
    d.dims = int(t.dim());
    if (t.dim() == 4)
      d.shape = gradcomp::layer_shape::conv(std::size_t(t.size(0)), std::size_t(t.size(1)), std::size_t(t.size(2)),
                                            std::size_t(t.size(3)));
    else if (t.dim() == 2)  // a linear weight [out, in]: PowerSGD's matrix view (dense for the others)
      d.shape = gradcomp::layer_shape::matrix(std::size_t(t.size(0)), std::size_t(t.size(1)));
    else
      d.shape = gradcomp::layer_shape::dense(std::size_t(t.numel()));
    out.push_back(d);
  }
  return out;
}

/// Runs one configuration on the in-process transport and returns worker 0's
/// report. A parameter-server configuration gets one more rank, rank 0, for
/// the server; its workers are ranks 1..N and run their own collectives
/// (evaluation, checksums) over the view of ranks 1..N.
run_result run_inproc(const run_context& ctx) {
  worker_report report;
  std::string server_summary;
  const int n = ctx.config == config_id::msgd_single ? 1 : ctx.options->workers;
  const bool ps = uses_parameter_server(ctx.config);
  gradcomp::transport::inproc_options topt;
  topt.recv_timeout = std::chrono::minutes(10);
  gradcomp::transport::run_workers(
      ps ? n + 1 : n,
      [&](gradcomp::transport::inproc_endpoint& ep) {
        counted_transport data(ep);
        if (!ps) {
          counted_transport ctl(ep);
          worker_main(ctx, data, ctl, ep.rank() == 0 ? &report : nullptr);
        } else if (ep.rank() == 0) {
          server_summary = run_dgs_server(data, *ctx.options, ctx.layers, ctx.initial, ctx.total_steps);
        } else {
          rank_offset_view<gradcomp::transport::inproc_endpoint> workers(ep, 1, n);
          counted_transport ctl(workers);
          worker_main(ctx, data, ctl, ep.rank() == 1 ? &report : nullptr);
        }
      },
      topt);
  if (!server_summary.empty())
    report.result.note += (report.result.note.empty() ? "" : "; ") + server_summary;
  return report.result;
}

#if defined(GRADCOMP_HAS_MPI)
/// True when this process was started by mpirun / mpiexec (Open MPI, PMI, PMIx).
bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

/// Runs one configuration with one worker per MPI process (this process is
/// one of them); returns worker 0's report on process 0 (empty elsewhere).
/// msgd_single runs on process 0 alone. DGS needs a server: it runs on the
/// last process and the other W-1 processes are its workers (worker 0 on
/// process 0), so DGS trains with N = W-1 workers under MPI.
run_result run_mpi(const run_context& ctx, const run_context& dgs_ctx) {
  worker_report report;
  const int world_rank = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  if (ctx.config == config_id::msgd_single) {
    // The others wait without spinning (MPI_Barrier busy-polls and would
    // take the cores from process 0): a transport barrier, whose waits poll
    // with a sleeping back-off while a timeout is set.
    gradcomp::transport::mpi_transport_options patient;
    patient.timeout = std::chrono::hours(24);
    gradcomp::transport::mpi_transport idle(MPI_COMM_WORLD, patient);
    if (world_rank == 0) report.result = run_inproc(ctx);
    counted_transport ctl(idle);
    barrier(ctl, tag_barrier);
    return report.result;
  }
  gradcomp::transport::mpi_transport_options mo;
  mo.timeout = std::chrono::minutes(10);
  gradcomp::transport::mpi_transport mt(MPI_COMM_WORLD, mo);
  counted_transport data_world(mt);
  if (!uses_parameter_server(ctx.config)) {
    counted_transport ctl(mt);
    worker_main(ctx, data_world, ctl, world_rank == 0 ? &report : nullptr);
    return report.result;
  }
  const int w = mt.size();
  rotated_view<gradcomp::transport::mpi_transport> ps(mt, w - 1);  // logical 0 (server) = process w-1
  counted_transport data(ps);
  if (ps.rank() == 0) {
    const std::string summary = run_dgs_server(data, *dgs_ctx.options, dgs_ctx.layers, dgs_ctx.initial, dgs_ctx.total_steps);
    // Process 0 prints the table: hand it the server's line.
    std::vector<std::byte> b(summary.size());
    std::memcpy(b.data(), summary.data(), summary.size());
    ps.isend(1, tag_final + 1, std::move(b)).wait();
    return {};
  }
  rank_offset_view<rotated_view<gradcomp::transport::mpi_transport>> workers(ps, 1, w - 1);
  counted_transport ctl(workers);
  worker_main(dgs_ctx, data, ctl, world_rank == 0 ? &report : nullptr);
  if (world_rank == 0) {
    auto m = ps.irecv(0, tag_final + 1).wait();
    report.result.note += "; " + std::string(reinterpret_cast<const char*>(m.bytes.data()), m.bytes.size());
  }
  return report.result;
}
#endif

std::string join_names() {
  std::string s;
  for (auto c : all_configs) s += (s.empty() ? "" : ", ") + std::string(config_name(c));
  return s;
}

/// Exit code of an exception (see main()).
int exit_code_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const usage_error& x) {
    std::cerr << "train: error: " << x.what() << "\n";
    return 2;
  } catch (const data_error& x) {
    std::cerr << "train: data error: " << x.what() << "\n";
    return 3;
  } catch (const gradcomp::invalid_argument_error& x) {
    std::cerr << "train: invalid parameter: " << x.what() << "\n";
    return 2;
  } catch (const std::exception& x) {
    std::cerr << "train: error: " << x.what() << "\n";
    return 1;
  }
}

int run_program(int argc, char** argv, int world_rank, int world_size, bool mpi_mode);

int real_main(int argc, char** argv) {
  // Under mpirun: one worker per process (MPI initialised before parsing).
  int world_rank = 0, world_size = 1;
  bool mpi_mode = false;
#if defined(GRADCOMP_HAS_MPI)
  std::optional<gradcomp::transport::mpi_environment> mpi_env;
  if (launched_by_mpirun()) {
    mpi_env.emplace(&argc, &argv);  // MPI_THREAD_SINGLE: every MPI call is made on this thread (libtorch's threads make none)
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    mpi_mode = world_size > 1;
  }
  if (mpi_mode) {
    // An error on one process must not leave the others waiting: abort the job.
    try {
      return run_program(argc, argv, world_rank, world_size, mpi_mode);
    } catch (...) {
      std::cerr << "[process " << world_rank << "] ";
      const int code = exit_code_of(std::current_exception());
      MPI_Abort(MPI_COMM_WORLD, code);
      return code;
    }
  }
#endif
  return run_program(argc, argv, world_rank, world_size, mpi_mode);
}

int run_program(int argc, char** argv, int world_rank, int world_size, bool mpi_mode) {
  // Only process 0 prints (errors are printed by every process).
  std::ostringstream discard;
  std::ostream& out = world_rank == 0 ? std::cout : static_cast<std::ostream&>(discard);
  run_options o;
  o.data_dir = default_data_dir;
  bool full = false, list = false;
  std::vector<std::string> config_list;
  std::string out_dir = "train-results";
  std::optional<std::size_t> train_samples, eval_samples;
  std::optional<double> epochs;

  CLI::App app{
      "gradcomp end-to-end demo: data-parallel training of a small ResNet on Fashion-MNIST with every gradient "
      "codec side by side.\nWith no configuration flag, every configuration runs."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::pair<config_id, bool>> flags;
  flags.reserve(all_configs.size());
  for (auto c : all_configs) flags.emplace_back(c, false);
  for (auto& [c, on] : flags) {
    std::string name(config_name(c));
    std::string flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_flag(flag == "--" + name ? flag : flag + ",--" + name, on, "Run " + name + ": " + std::string(config_description(c)));
  }
  app.add_option("--configs", config_list, "Comma-separated configurations to run (" + join_names() + ")")
      ->delimiter(',');
  app.add_flag("--list", list, "List the configurations and whether this build can run them, then exit");
  app.add_flag("--full", full, "Train long enough for the accuracies to settle (all 60000 images, 10 epochs)");
  std::string model_name = "small";
  app.add_option("--model", model_name,
                 "small: the 78k-parameter ResNet (16-32-64 channels); wide: the same with 4x the channels "
                 "(64-128-256, 1.24M parameters); RESULT names of wide runs end in _wide")
      ->check(CLI::IsMember({"small", "wide"}))
      ->capture_default_str();
  auto* workers_option =
      app.add_option("-n,--workers", o.workers,
                     "Number of workers N (threads over the in-process transport; under mpirun: the process count)")
          ->capture_default_str();
  app.add_option("--batch", o.batch, "Batch size per worker (the global batch is N x this)")->capture_default_str();
  app.add_option("--epochs", epochs, "Epochs over the training subset (default 3, --full: 10)");
  app.add_option("--train-samples", train_samples, "Training images used (default 20000, --full: 60000)");
  app.add_option("--eval-samples", eval_samples,
                 "Test images of the intermediate evaluations (default 2000, --full: 10000); the final one uses all");
  app.add_option("--lr", o.lr, "Peak learning rate (warm-up, then cosine decay)")->capture_default_str();
  app.add_option("--momentum", o.momentum, "Momentum of SGD")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the data order, the initial model and every codec")->capture_default_str();
  app.add_option("--threads", o.torch_threads, "libtorch intra-op threads per worker (0: 1)")
      ->capture_default_str();
  app.add_option("--evals-per-epoch", o.evals_per_epoch, "Test evaluations per epoch (curve points)")
      ->capture_default_str();
  app.add_option("--check-every", o.check_every, "Steps between replica checksums (0: only at the end)")
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "Steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Folder of the Fashion-MNIST .gz files")->capture_default_str();
  app.add_option("--out-dir", out_dir, "Folder for the CSV files and the PNG plot")->capture_default_str();
  app.add_option("--gradiveq-warmup", o.gradiveq_warmup, "GradiVeQ: uncompressed warm-up steps")
      ->capture_default_str();
  app.add_option("--gradiveq-lt", o.gradiveq_lt, "GradiVeQ: L_t sampling steps per cycle")->capture_default_str();
  app.add_option("--gradiveq-lc", o.gradiveq_lc, "GradiVeQ: L_c compressed steps per cycle")->capture_default_str();
  app.add_option("--gradiveq-lambda", o.gradiveq_lambda, "GradiVeQ: PCA loss threshold lambda (eq. 6)")
      ->capture_default_str();
  app.add_option("--gradiveq-plus-pool", o.gradiveq_plus_pool,
                 "gradiveq_plus: slices pooled per PCA sample (0: the paper's first slice)")
      ->capture_default_str();
  app.add_option("--gradiveq-plus-lt", o.gradiveq_plus_lt,
                 "gradiveq_plus: L_t sampling steps per cycle (default 1.5 x the paper's: 38, --full: 150)")
      ->capture_default_str();
  app.add_option("--gradiveq-plus-holdout", o.gradiveq_plus_holdout,
                 "gradiveq_plus: fraction of the samples held out to choose d (0: off)")
      ->capture_default_str();
  app.add_option("--gradiveq-plus-stale", o.gradiveq_plus_stale,
                 "gradiveq_plus: eq. 7 relative-loss threshold that ends L_c early (0: fixed L_c)")
      ->capture_default_str();
  app.add_option("--qsgd-bits", o.qsgd_bits, "QSGD: bits per value")->capture_default_str();
  app.add_option("--qsgd-bucket", o.qsgd_bucket, "QSGD: bucket size")->capture_default_str();
  app.add_option("--two-bit-threshold", o.two_bit_threshold,
                 "Two-bit: fixed threshold, or <= 0 for the automatic mode")
      ->capture_default_str();
  app.add_option("--topk-percent", o.topk_percent, "Sparsifier: percent of each layer sent")->capture_default_str();
  app.add_option("--topk-momentum", o.topk_momentum,
                 "Sparsifier and momentum: dgc (correction + masking in the codec), plain (SGD at lr/(1-m)), optimizer")
      ->capture_default_str();
  app.add_option("--two-bit-momentum", o.two_bit_momentum,
                 "Two-bit and momentum: plain (SGD at lr/(1-m)), local (velocity quantized), optimizer")
      ->capture_default_str();
  app.add_option("--two-bit-scale", o.two_bit_scale, "Two-bit automatic mode: threshold = scale * mean |r + g|")
      ->capture_default_str();
  app.add_option("--dgs-sparsity", o.dgs_sparsity, "DGS: percent of each layer NOT sent")->capture_default_str();
  app.add_option("--dgs-momentum", o.dgs_momentum, "DGS: SAMomentum coefficient")->capture_default_str();
  app.add_option("--dgs-secondary", o.dgs_secondary, "DGS: sparsify the server's model difference too")
      ->capture_default_str();
  app.add_option("--lgc-topk-percent", o.lgc_topk_percent, "LGC: percent of each layer kept by top-k (0: lgc 1, lgc_ps 0.8)")
      ->capture_default_str();
  app.add_option("--lgc-phase1", o.lgc_phase1, "LGC: dense warm-up steps")->capture_default_str();
  app.add_option("--lgc-momentum", o.lgc_momentum,
                 "LGC and momentum: dgc (in the node), plain (SGD at lr/(1-m)), phased (momentum SGD in phase 1, "
                 "plain after)")
      ->capture_default_str();
  app.add_option("--lgc-feedback", o.lgc_feedback,
                 "LGC: add each node's autoencoder reconstruction error back to its accumulator (beyond the paper)")
      ->capture_default_str();
  app.add_option("--powersgd-start-percent", o.powersgd_start_percent,
                 "PowerSGD: uncompressed start period, percent of the run's steps")
      ->capture_default_str();
  app.add_option("--powersgd-min-elements", o.powersgd_min_elements, "PowerSGD: smaller matrices stay dense")
      ->capture_default_str();
  app.add_option("--homomorphic-bits", o.homomorphic_bits, "Homomorphic quantizer: lane width (0: from N)")
      ->capture_default_str();
  app.add_option("--homomorphic-block", o.homomorphic_block, "Homomorphic quantizer: values per agreed scale")
      ->capture_default_str();
  app.add_option("--lgc-phase2", o.lgc_phase2, "LGC: top-k steps while the autoencoder trains")
      ->capture_default_str();
  app.add_option("--lgc-optimizer", o.lgc_optimizer, "LGC: the autoencoder's optimiser, sgd (the paper) or adam")
      ->capture_default_str();
  app.add_option("--lgc-ae-lr", o.lgc_ae_lr, "LGC: the autoencoder's learning rate (the paper: 1e-3)")
      ->capture_default_str();
  app.add_option("--lgc-feedback-aggregate", o.lgc_feedback_aggregate,
                 "LGC ring: every node adds x_k - D(average code) back (they sum to the aggregate's error)")
      ->capture_default_str();
  app.add_option("--lgc-feedback-max-error", o.lgc_feedback_max_error,
                 "LGC: with --lgc-feedback, feed back only on steps whose relative reconstruction error is at most this")
      ->capture_default_str();
  app.add_option("--lgc-retrain-period", o.lgc_retrain_period,
                 "LGC ring: keep training the autoencoder in phase 3 and send its weights every this many steps (0: "
                 "frozen, the paper)")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (list) {
    for (auto c : all_configs) {
      const auto why = config_unavailable(c);
      out << std::left << std::setw(14) << config_name(c) << (why.empty() ? "available    " : "UNAVAILABLE  ")
                << config_description(c) << (why.empty() ? "" : "\n              " + why) << "\n";
    }
    return 0;
  }

  // Which configurations.
  std::vector<config_id> selected;
  for (const auto& name : config_list) {
    auto c = parse_config(name);
    if (!c) throw usage_error("unknown configuration '" + name + "' (known: " + join_names() + ")");
    selected.push_back(*c);
  }
  for (auto& [c, on] : flags)
    if (on) selected.push_back(c);
  if (selected.empty()) selected.assign(all_configs.begin(), all_configs.end());
  {
    std::vector<config_id> unique;
    for (auto c : all_configs)
      if (std::find(selected.begin(), selected.end(), c) != selected.end()) unique.push_back(c);
    selected = unique;
  }

  o.width = model_name == "wide" ? 4 : 1;
  // Defaults of the short and the --full run.
  o.train_samples = train_samples.value_or(full ? 60000 : 20000);
  o.eval_samples = eval_samples.value_or(full ? 10000 : 2000);
  o.epochs = epochs.value_or(full ? 10.0 : 3.0);
  if (full) {
    // The paper-scale schedules, shortened to this run's length; a value
    // given on the command line wins.
    auto full_default = [&](const char* flag, std::size_t& value, std::size_t full_value) {
      if (app.count(flag) == 0) value = full_value;
    };
    full_default("--gradiveq-warmup", o.gradiveq_warmup, 500);
    full_default("--gradiveq-lt", o.gradiveq_lt, 100);
    full_default("--gradiveq-lc", o.gradiveq_lc, 400);
    full_default("--gradiveq-plus-lt", o.gradiveq_plus_lt, 150);
    full_default("--lgc-phase1", o.lgc_phase1, 500);
    full_default("--lgc-phase2", o.lgc_phase2, 500);
  }

  if (mpi_mode) {
    if (workers_option->count() > 0 && o.workers != world_size)
      throw usage_error("--workers " + std::to_string(o.workers) + " disagrees with the " +
                        std::to_string(world_size) + " MPI processes (under mpirun N is the process count)");
    o.workers = world_size;
  }

  // Validate before loading anything.
  if (o.workers < 1 || o.workers > 256) throw usage_error("--workers must be in [1, 256], got " + std::to_string(o.workers));
  if (o.batch < 1 || o.batch > 4096) throw usage_error("--batch must be in [1, 4096]");
  if (!(o.epochs > 0) || o.epochs > 1000) throw usage_error("--epochs must be in (0, 1000]");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw usage_error("--lr must be a positive number");
  if (!(o.momentum >= 0 && o.momentum < 1)) throw usage_error("--momentum must be in [0, 1)");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay)) throw usage_error("--weight-decay must be >= 0");
  if (o.torch_threads < 0 || o.torch_threads > 256) throw usage_error("--threads must be in [0, 256]");
  if (o.evals_per_epoch < 1 || o.evals_per_epoch > 100) throw usage_error("--evals-per-epoch must be in [1, 100]");
  if (o.train_samples < 1 || o.train_samples > 60000) throw usage_error("--train-samples must be in [1, 60000]");
  if (o.eval_samples < 1 || o.eval_samples > 10000) throw usage_error("--eval-samples must be in [1, 10000]");
  const std::size_t per_worker = o.train_samples / std::size_t(o.workers);
  if (per_worker < o.batch)
    throw usage_error("N = " + std::to_string(o.workers) + " workers with batch " + std::to_string(o.batch) +
                      " need at least " + std::to_string(std::size_t(o.workers) * o.batch) +
                      " training images (one batch per worker), --train-samples is " +
                      std::to_string(o.train_samples) + ": lower --workers or --batch, or raise --train-samples");

  // The model and its layers (fixed seed), and the codecs' parameter check.
  torch::manual_seed(o.seed);
  small_resnet prototype(o.width);
  const auto layers = describe_layers(prototype);
  std::vector<std::vector<float>> initial;
  for (const auto& p : prototype->parameters()) {
    auto c = p.detach().contiguous();
    initial.emplace_back(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  for (auto c : selected)
    if (config_unavailable(c).empty()) validate_codec_options(c, o, layers);

  out << "loading Fashion-MNIST from " << o.data_dir << std::endl;
  const fashion_mnist data = load_fashion_mnist(o.data_dir);
  if (o.train_samples > data.train.count)
    throw usage_error("--train-samples " + std::to_string(o.train_samples) + " exceeds the " +
                      std::to_string(data.train.count) + " training images");
  if (o.eval_samples > data.test.count)
    throw usage_error("--eval-samples exceeds the " + std::to_string(data.test.count) + " test images");
  const data_plan plan(data.train.count, o);

  std::size_t params = 0, conv_params = 0;
  for (const auto& l : layers) {
    params += l.shape.size();
    if (l.shape.kind == gradcomp::layer_kind::conv) conv_params += l.shape.size();
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t total_steps =
      std::max<std::size_t>(1, std::size_t(std::llround(o.epochs * double(plan.steps_per_epoch))));
  out << "model: " << (o.width == 1 ? "small" : "wide (4x channels)") << ", " << layers.size() << " tensors, " << params << " parameters (" << std::fixed
            << std::setprecision(1) << 100.0 * double(conv_params) / double(params) << "% in convolutions)\n"
            << "data: " << o.train_samples << " training images in " << o.workers << " shards, batch " << o.batch
            << " per worker (global " << std::size_t(o.workers) * o.batch << "), " << plan.steps_per_epoch
            << " steps per epoch, " << total_steps << " steps (" << std::setprecision(2) << o.epochs
            << " epochs); test " << data.test.count << " images\n"
            << "machine: " << cores << " hardware threads"
            << (mpi_mode ? ", " + std::to_string(world_size) + " MPI processes (one worker each)" : std::string())
            << "\n";

  std::vector<run_result> results;
  std::vector<std::string> skipped;
  for (auto c : selected) {
    if (auto why = config_unavailable(c); !why.empty()) {
      out << "\n[" << config_name(c) << "] UNAVAILABLE in this build: " << why << " -- skipped, no result\n";
      skipped.push_back(std::string(config_name(c)) + ": " + why);
      continue;
    }
    run_context ctx{c, &o, &data, &plan, &prototype, layers, initial, total_steps, 0, 1, &out};
    if (mpi_mode && c == config_id::dgs)
      out << "\n[dgs] under mpirun: the parameter server runs on process " << world_size - 1 << ", "
          << world_size - 1 << " workers" << std::endl;
    ctx.eval_interval =
        std::max<std::size_t>(1, plan.steps_per_epoch / std::size_t(o.evals_per_epoch));
    const int n = c == config_id::msgd_single ? 1 : (mpi_mode && uses_parameter_server(c)) ? world_size - 1 : o.workers;
    // One intra-op thread per worker by default: with N workers on the cores
    // that is what the issue asks, and for the single worker a second OpenMP
    // thread measured ~9x slower on the loaded 2-core VM (spinning workers).
    ctx.torch_threads = o.torch_threads ? o.torch_threads : 1;
    out << "\n[" << config_name(c) << "] " << config_description(c) << " (" << n << " worker"
              << (n > 1 ? "s" : "") << ", " << ctx.torch_threads << " libtorch thread" << (ctx.torch_threads > 1 ? "s" : "")
              << " each)" << std::endl;
#if defined(GRADCOMP_HAS_MPI)
    if (mpi_mode) {
      // DGS under MPI: the last process is the server, N = W-1 workers.
      run_options o_dgs = o;
      o_dgs.workers = world_size - 1;
      const data_plan plan_dgs(data.train.count, o_dgs);
      run_context dgs_ctx = ctx;
      dgs_ctx.options = &o_dgs;
      dgs_ctx.plan = &plan_dgs;
      dgs_ctx.total_steps =
          std::max<std::size_t>(1, std::size_t(std::llround(o.epochs * double(plan_dgs.steps_per_epoch))));
      dgs_ctx.eval_interval = std::max<std::size_t>(1, plan_dgs.steps_per_epoch / std::size_t(o.evals_per_epoch));
      if (uses_parameter_server(c) && world_size < 2)
        throw usage_error("dgs under mpirun needs at least 2 processes (a server and a worker)");
      run_result r = run_mpi(ctx, dgs_ctx);
      if (world_rank == 0) results.push_back(std::move(r));
      continue;
    }
#endif
    results.push_back(run_inproc(ctx));
  }
  if (world_rank != 0) return 0;

  print_table(out, results);
  std::filesystem::create_directories(out_dir);
  const std::string curves = out_dir + "/curves.csv", summary = out_dir + "/summary.csv",
                    png = out_dir + "/accuracy.png";
  write_curves_csv(curves, results);
  write_summary_csv(summary, results);
  out << "\ncurves:  " << curves << "\nsummary: " << summary << "\n";
  if (auto why = plot_curves(curves, png, results); why.empty())
    out << "plot:    " << png << "\n";
  else
    out << "plot:    not written: " << why << "\n";
  for (const auto& s : skipped) out << "skipped: " << s << "\n";
  out << "\n";
  print_result_lines(out, results, o.width == 1 ? "" : "_wide");
  return 0;
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  // Exit codes: 0 success, 1 training error, 2 bad command line or parameter,
  // 3 data set missing or malformed.
  try {
    return train::real_main(argc, argv);
  } catch (...) {
    return train::exit_code_of(std::current_exception());
  }
}
