// Fashion-MNIST idx loader (see data.hpp).
#include "data.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <memory>

namespace train {
namespace {

struct gz_closer {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};
using gz_ptr = std::unique_ptr<gzFile_s, gz_closer>;

/// Reads exactly n bytes (or fewer at end of file); throws data_error on a zlib error.
std::size_t read_some(gzFile f, std::uint8_t* out, std::size_t n, const std::string& path) {
  std::size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw data_error(path + ": gzip read error: " + (msg ? msg : "unknown"));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

std::uint32_t big_endian_u32(const std::uint8_t* p) noexcept {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
}

std::string missing_message(const std::string& path) {
  return "Fashion-MNIST file not found: " + path +
         "\n  install the Debian package dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist)"
         "\n  or point --data-dir at a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,"
         "\n  t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
}

image_set load_pair(const std::string& dir, const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  idx_file images = read_idx_gz(images_path, 3);
  idx_file labels = read_idx_gz(labels_path, 1);
  if (images.dims[1] != 28 || images.dims[2] != 28)
    throw data_error(images_path + ": images are " + std::to_string(images.dims[1]) + "x" +
                     std::to_string(images.dims[2]) + ", Fashion-MNIST images are 28x28");
  if (images.dims[0] != labels.dims[0])
    throw data_error(images_path + " holds " + std::to_string(images.dims[0]) + " images but " + labels_path +
                     " holds " + std::to_string(labels.dims[0]) + " labels");
  if (images.dims[0] == 0) throw data_error(images_path + ": no images");
  image_set s;
  s.count = images.dims[0];
  s.rows = images.dims[1];
  s.cols = images.dims[2];
  for (std::size_t i = 0; i < labels.bytes.size(); ++i)
    if (labels.bytes[i] > 9)
      throw data_error(labels_path + ": label " + std::to_string(int(labels.bytes[i])) + " of item " +
                       std::to_string(i) + " is outside 0..9");
  s.labels = std::move(labels.bytes);
  // Normalisation constants of Fashion-MNIST's training set (mean 0.2860, std 0.3530).
  constexpr float mean = 0.2860f, stddev = 0.3530f;
  s.pixels.resize(images.bytes.size());
  for (std::size_t i = 0; i < images.bytes.size(); ++i)
    s.pixels[i] = (float(images.bytes[i]) / 255.0f - mean) / stddev;
  return s;
}

}  // namespace

idx_file read_idx_gz(const std::string& path, int expected_dims) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw data_error(missing_message(path));
  gz_ptr f(gzopen(path.c_str(), "rb"));
  if (!f) throw data_error(path + ": cannot open (gzopen failed)");
  std::array<std::uint8_t, 4> magic{};
  if (read_some(f.get(), magic.data(), 4, path) != 4) throw data_error(path + ": truncated idx header");
  // idx magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08)
    throw data_error(path + ": not an unsigned-byte idx file (bad magic number " + std::to_string(big_endian_u32(magic.data())) + ")");
  if (magic[3] != expected_dims)
    throw data_error(path + ": idx file has " + std::to_string(int(magic[3])) + " dimensions, expected " +
                     std::to_string(expected_dims) + " (magic " + std::to_string(big_endian_u32(magic.data())) + ")");
  idx_file out;
  std::size_t total = 1;
  for (int d = 0; d < expected_dims; ++d) {
    std::array<std::uint8_t, 4> b{};
    if (read_some(f.get(), b.data(), 4, path) != 4) throw data_error(path + ": truncated idx header");
    const std::uint32_t n = big_endian_u32(b.data());
    // Fashion-MNIST holds at most 60000 items of 28x28; refuse absurd sizes before allocating.
    if (n > 10'000'000u) throw data_error(path + ": dimension " + std::to_string(d) + " of " + std::to_string(n) + " is implausible");
    out.dims.push_back(n);
    total *= n;
    if (total > (std::size_t{1} << 32)) throw data_error(path + ": declared size is implausible");
  }
  out.bytes.resize(total);
  const std::size_t got = read_some(f.get(), out.bytes.data(), total, path);
  if (got != total)
    throw data_error(path + ": truncated: header declares " + std::to_string(total) + " data bytes, file holds " +
                     std::to_string(got));
  std::uint8_t extra = 0;
  if (read_some(f.get(), &extra, 1, path) != 0) throw data_error(path + ": trailing bytes after the declared data");
  return out;
}

fashion_mnist load_fashion_mnist(const std::string& dir) {
  fashion_mnist d;
  d.train = load_pair(dir, "train");
  d.test = load_pair(dir, "t10k");
  return d;
}

}  // namespace train
