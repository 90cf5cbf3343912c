// Table, CSV, plot and RESULT lines (see report.hpp).
#include "report.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace train {
namespace {

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string bytes_human(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  while (b >= 1024.0 && i < 3) {
    b /= 1024.0;
    ++i;
  }
  return fixed(b, i == 0 ? 0 : 1) + " " + unit[i];
}

/// True if `program` is an executable on PATH.
bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + program;
    if (FILE* f = std::fopen(candidate.c_str(), "r")) {
      std::fclose(f);
      return true;
    }
  }
  return false;
}

std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else out += c;
  }
  return out + "'";
}

}  // namespace

void print_table(std::ostream& out, const std::vector<run_result>& results) {
  out << "\n"
      << std::left << std::setw(14) << "config" << std::right << std::setw(4) << "N" << std::setw(7) << "steps"
      << std::setw(9) << "test%" << std::setw(13) << "sent/wkr/stp" << std::setw(12) << "recv(PS)" << std::setw(9)
      << "ratio" << std::setw(16) << "target ratio" << std::setw(10) << "agg ms" << std::setw(11) << "compute ms"
      << std::setw(9) << "wall s" << "\n";
  out << std::string(114, '-') << "\n";
  for (const auto& r : results) {
    out << std::left << std::setw(14) << config_name(r.config) << std::right << std::setw(4) << r.workers
        << std::setw(7) << r.steps << std::setw(9) << fixed(r.final_accuracy, 2) << std::setw(13)
        << bytes_human(r.wire_bytes_per_step) << std::setw(12)
        << (r.recv_bytes_per_step > 0 ? bytes_human(r.recv_bytes_per_step) : std::string("-")) << std::setw(9)
        << (r.counters.encoded_bytes ? fixed(r.counters.ratio(), 2) + "x" : std::string("-")) << std::setw(16)
        << (r.counters.target_encoded_bytes
                ? fixed(r.counters.target_ratio(), 2) + "x " + r.target_label
                : std::string("-"))
        << std::setw(10) << fixed(r.aggregation_ms, 2) << std::setw(11) << fixed(r.compute_ms, 1) << std::setw(9)
        << fixed(r.wall_seconds, 1) << "\n";
    if (!r.note.empty()) out << "    note: " << r.note << "\n";
  }
  out << "\n"
         "test%         final accuracy on the full 10000-image test set\n"
         "sent/wkr/stp  bytes a worker hands to the transport per step, mean over workers (headers included)\n"
         "recv(PS)      bytes a worker receives from the parameter server per step (DGS only)\n"
         "ratio         float32 bytes of the whole gradient / payload bytes the worker's encoders produced\n"
         "target ratio  the same on the layers the codec compresses (conv: conv weights, weights: conv+fc weights)\n"
         "agg ms        time in the gradient exchange per step, worker 0 (synchronous configurations start it after a\n"
         "              barrier, so it holds no straggler wait; for dgs it includes waiting for the server's turn)\n"
         "compute ms    forward + backward per step, worker 0 (N worker threads share the cores)\n";
}

void print_result_lines(std::ostream& out, const std::vector<run_result>& results, const std::string& model_suffix) {
  for (const auto& r : results) {
    const std::string name = std::string(config_name(r.config)) + model_suffix;
    out << "RESULT " << name << "_accuracy " << fixed(r.final_accuracy, 2) << " %\n";
    const double ratio = r.counters.encoded_bytes ? r.counters.ratio() : 1.0;
    out << "RESULT " << name << "_ratio " << fixed(ratio, 2) << " x\n";
    for (const auto& [extra, value] : r.extra_ratios)
      out << "RESULT " << name << "_" << extra << " " << fixed(value, 2) << " x\n";
  }
}

void write_curves_csv(const std::string& path, const std::vector<run_result>& results) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << "config,step,epoch,train_loss,test_accuracy,test_samples,cumulative_bytes_per_worker,wall_seconds\n";
  f << std::setprecision(8);
  for (const auto& r : results)
    for (const auto& p : r.curve)
      f << config_name(r.config) << ',' << p.step << ',' << p.epoch << ',' << p.train_loss << ','
        << p.test_accuracy << ',' << p.test_samples << ',' << p.cumulative_bytes << ',' << p.wall_seconds << '\n';
  if (!f) throw std::runtime_error("error writing " + path);
}

void write_summary_csv(const std::string& path, const std::vector<run_result>& results) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << "config,workers,steps,global_batch,test_accuracy,sent_bytes_per_worker_step,recv_bytes_per_worker_step,"
       "ratio,target_ratio,target,aggregation_ms,compute_ms,wall_seconds\n";
  f << std::setprecision(8);
  for (const auto& r : results)
    f << config_name(r.config) << ',' << r.workers << ',' << r.steps << ',' << r.global_batch << ','
      << r.final_accuracy << ',' << r.wire_bytes_per_step << ',' << r.recv_bytes_per_step << ','
      << r.counters.ratio() << ',' << r.counters.target_ratio() << ',' << r.target_label << ','
      << r.aggregation_ms << ',' << r.compute_ms << ',' << r.wall_seconds << '\n';
  if (!f) throw std::runtime_error("error writing " + path);
}

std::string plot_curves(const std::string& csv_path, const std::string& png_path,
                        const std::vector<run_result>& results) {
  if (results.empty()) return "nothing to plot";
  if (!on_path("gnuplot"))
    return "gnuplot not found on PATH (Debian package gnuplot-nox): no PNG, the curves are in " + csv_path;
  // gnuplot reads one data block per configuration (blocks separated by two
  // blank lines, selected with `index`), written next to the PNG.
  const std::string data_path = png_path + ".dat", script_path = png_path + ".gp";
  {
    std::ofstream d(data_path);
    if (!d) return "cannot write " + data_path;
    d << std::setprecision(8);
    for (const auto& r : results) {
      d << "# " << config_name(r.config) << "\n# step epoch loss accuracy bytes\n";
      for (const auto& p : r.curve)
        d << p.step << ' ' << p.epoch << ' ' << p.train_loss << ' ' << p.test_accuracy << ' '
          << p.cumulative_bytes << '\n';
      d << "\n\n";
    }
  }
  {
    std::ofstream g(script_path);
    if (!g) return "cannot write " + script_path;
    g << "set terminal pngcairo size 1500,560 font ',10'\n"
      << "set output " << gnuplot_quote(png_path) << "\n"
      << "set termoption noenhanced\nset key bottom right\nset grid\n"
      << "set multiplot layout 1,2 title 'Fashion-MNIST, small ResNet: test accuracy per configuration'\n"
      << "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\n";
    auto plot_all = [&](int xcol, bool skip_without_bytes) {
      g << "plot ";
      bool first = true;
      for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        if (skip_without_bytes && (r.curve.empty() || r.curve.back().cumulative_bytes <= 0)) continue;
        if (!first) g << ", \\\n     ";
        first = false;
        // The same line type for a configuration in both panels; on the
        // log-scale bytes axis the points before the first byte are left out.
        const std::string x = skip_without_bytes ? "($" + std::to_string(xcol) + " > 0 ? $" + std::to_string(xcol) + " : 1/0)"
                                                 : std::to_string(xcol);
        g << gnuplot_quote(data_path) << " index " << i << " using " << x << ":4 with linespoints lt " << i + 1 << " pt " << i + 1
          << " title '" << config_name(r.config) << "'";
      }
      if (first) g << "NaN title 'no configuration sent bytes'";
      g << "\n";
    };
    plot_all(2, false);
    g << "set xlabel 'cumulative bytes sent per worker'\nset logscale x\nset format x '%.0e'\n";
    plot_all(5, true);
    g << "unset multiplot\n";
  }
  std::string quoted = "'";
  for (char c : script_path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string cmd = "gnuplot " + quoted + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "cannot start gnuplot";
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) output += buf;
  const int status = ::pclose(p);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return "gnuplot failed: " + output;
  std::remove(script_path.c_str());
  std::remove(data_path.c_str());
  return {};
}

}  // namespace train
