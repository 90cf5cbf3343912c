#pragma once
/// \file report.hpp
/// The end of a run: the table, the CSV of the curves, the gnuplot PNG and
/// the RESULT lines. No libtorch.

#include <ostream>
#include <string>
#include <vector>

#include "common.hpp"

namespace train {

/// The final table (one row per configuration run).
void print_table(std::ostream& out, const std::vector<run_result>& results);

/// `RESULT <config>_accuracy <value> %` and `RESULT <config>_ratio <value> x` per result.
void print_result_lines(std::ostream& out, const std::vector<run_result>& results, const std::string& model_suffix);

/// Writes the curves of every configuration to `path` (one row per point).
void write_curves_csv(const std::string& path, const std::vector<run_result>& results);

/// Writes the per-configuration summary to `path`.
void write_summary_csv(const std::string& path, const std::vector<run_result>& results);

/// Plots test accuracy against epoch and against cumulative bytes per worker
/// from the curves CSV into `png_path` with gnuplot (a subprocess). Returns
/// "" on success, otherwise why no plot was made (gnuplot missing, failed).
std::string plot_curves(const std::string& csv_path, const std::string& png_path,
                        const std::vector<run_result>& results);

}  // namespace train
