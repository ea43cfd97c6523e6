// safetensors reader and writer.
#include "io/safetensors.h"

#include <cstring>  // std::memcpy
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"

namespace moerl::io {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= (size_t)d;
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors) {
  std::ostringstream header;
  header << "{\"__metadata__\":{\"format\":\"moerl\"}";
  size_t offset = 0;
  for (const TensorOut& t : tensors) {
    size_t bytes = numel(t.shape) * sizeof(float);
    header << "," << json_quote(t.name) << ":{\"dtype\":\"F32\",\"shape\":" << shape_text(t.shape)
           << ",\"data_offsets\":[" << offset << "," << offset + bytes << "]}";
    offset += bytes;
  }
  header << "}";
  std::string h = header.str();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps the data 8-byte aligned
  std::string out(8, '\0');
  uint64_t hlen = h.size();
  for (int i = 0; i < 8; i++) out[i] = (char)((hlen >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const TensorOut& t : tensors)
    out.append(reinterpret_cast<const char*>(t.data), numel(t.shape) * sizeof(float));
  write_file_atomic(path, out);
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::string raw = read_file(path);
  MOERL_CHECK_INPUT(raw.size() >= 8, path, ": too short for a safetensors file");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)raw[i] << (8 * i);
  MOERL_CHECK_INPUT(hlen <= raw.size() - 8, path, ": header length ", hlen, " exceeds file size ",
                    raw.size());
  Json header = parse_json(raw.substr(8, hlen), path + " header");
  MOERL_CHECK_INPUT(header.is_object(), path, ": header is not a JSON object");
  SafetensorsFile f;
  f.path = path;
  f.data = raw.substr(8 + hlen);
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    std::string what = path + " tensor " + name;
    TensorIn t;
    t.dtype = string_field(v, "dtype", what);
    for (const Json& d : array_field(v, "shape", what)) t.shape.push_back(as_integer(d, what + " shape"));
    const Json::array_t& off = array_field(v, "data_offsets", what);
    MOERL_CHECK_INPUT(off.size() == 2, what, ": data_offsets must have two entries");
    int64_t b = as_integer(off[0], what + " data_offsets"), e = as_integer(off[1], what + " data_offsets");
    MOERL_CHECK_INPUT(0 <= b && b <= e && (uint64_t)e <= f.data.size(), what, ": data range [", b,
                      ",", e, ") outside the ", f.data.size(), " data bytes");
    t.begin = (size_t)b;
    t.end = (size_t)e;
    f.tensors[name] = t;
  }
  return f;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                               float* out) const {
  auto it = tensors.find(name);
  MOERL_CHECK_INPUT(it != tensors.end(), path, ": missing tensor ", name);
  const TensorIn& t = it->second;
  MOERL_CHECK_INPUT(t.dtype == "F32", path, ": tensor ", name, " has dtype ", t.dtype,
                    ", expected F32");
  MOERL_CHECK_INPUT(t.shape == shape, path, ": tensor ", name, " has shape ", shape_text(t.shape),
                    ", expected ", shape_text(shape));
  MOERL_CHECK_INPUT(t.end - t.begin == numel(shape) * sizeof(float), path, ": tensor ", name,
                    " holds ", t.end - t.begin, " bytes, expected ", numel(shape) * sizeof(float));
  std::memcpy(out, data.data() + t.begin, t.end - t.begin);
}

}  // namespace moerl::io
