#pragma once
/// \file data.hpp
/// Fashion-MNIST loader: the gzip'd idx files of Debian's dataset-fashion-mnist,
/// read with zlib, every header field validated. No libtorch here.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// A data set problem (missing file, bad magic, wrong size): the message says
/// what and where, and main() turns it into a non-zero exit.
class data_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Images as normalised floats [count][rows*cols], labels 0..9.
struct image_set {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<float> pixels;          ///< (x/255 - mean) / std
  std::vector<std::uint8_t> labels;   ///< one per image, < 10
  std::size_t pixels_per_image() const noexcept { return rows * cols; }
};

/// The two halves of the data set.
struct fashion_mnist {
  image_set train;
  image_set test;
};

/// Default location of the Debian package's files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

/// Loads train-{images-idx3,labels-idx1}-ubyte.gz and t10k-... from `dir`.
/// Throws data_error naming the file and the package dataset-fashion-mnist if
/// a file is missing, and naming the defect if a file is malformed (magic
/// number, dimensions, image/label count mismatch, truncated or trailing data,
/// label outside 0..9).
fashion_mnist load_fashion_mnist(const std::string& dir);

/// Reads one gzip'd idx file; `expected_dims` is 3 for images, 1 for labels.
/// Returns the dimensions and the raw bytes (exactly prod(dims) of them).
struct idx_file {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> bytes;
};
idx_file read_idx_gz(const std::string& path, int expected_dims);

}  // namespace train
