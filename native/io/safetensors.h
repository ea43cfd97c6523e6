// safetensors files: 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets}, then the raw little-endian data. We write F32 only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moerl::io {

struct TensorOut {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel = product of shape
};

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors);

struct TensorIn {
  std::string dtype;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte range inside SafetensorsFile::data
};

struct SafetensorsFile {
  std::string path;
  std::map<std::string, TensorIn> tensors;
  std::string data;  // bytes after the header

  // Copies tensor `name` into out after checking dtype F32 and the expected shape; throws
  // BadInput naming the file and tensor otherwise.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
};

// Parses the header and checks every data range lies inside the file (BadInput otherwise).
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace moerl::io
