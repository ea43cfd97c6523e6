// safetensors files: 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets}, then the raw little-endian data. Checkpoints are F32;
// Hugging Face model files are F32, BF16 or F16, read into and written from fp32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moerl::io {

struct TensorOut {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel = product of shape; null: zeros
};

// dtype: "F32", "BF16" or "F16" on disk (rounded to nearest even from fp32).
void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::string& dtype = "F32");

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

// The header alone, for reading single tensors of a large file without reading the rest:
// begin/end of each tensor are offsets into the file's data section, at data_start.
struct SafetensorsHeader {
  std::string path;
  std::map<std::string, TensorIn> tensors;
  uint64_t data_start = 0;
};
SafetensorsHeader read_safetensors_header(const std::string& path);

// Reads tensor `name` (F32, BF16 or F16) as fp32 into out after checking its shape; only its
// bytes are read. Throws BadInput naming file and tensor.
void read_tensor_f32(const SafetensorsHeader& h, const std::string& name,
                     const std::vector<int64_t>& shape, float* out);

// Bytes per element of a safetensors dtype (F32, BF16, F16); BadInput for others.
size_t dtype_bytes(const std::string& dtype, const std::string& what);

}  // namespace moerl::io
