// safetensors reader and writer.
#include "io/safetensors.h"

#include <algorithm>  // std::min, std::fill, std::stable_sort
#include <cstring>    // std::memcpy
#include <fstream>  // std::ifstream: single tensors of large files
#include <sstream>  // std::ostringstream
#include <utility>  // std::pair, std::make_pair

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

uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // nearest even
  return (uint16_t)(u >> 16);
}

uint16_t to_f16(float x) {
  uint32_t u = f32_bits(x), sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // overflow (after rounding) -> inf
  if (a < 0x38800000u) {                                    // subnormal or zero in half
    // value = a as float; half subnormal unit is 2^-24: round a / 2^-24 to nearest even
    float v = bits_f32(a) * 16777216.0f;  // exact: scales by 2^24
    uint32_t m = (uint32_t)v;
    float frac = v - (float)m;
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  uint32_t e = ((a >> 23) - 112) << 10, mant = (a >> 13) & 0x3ffu;
  uint32_t h = e | mant, rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // carries into the exponent as it should
  return (uint16_t)(sign | h);
}

float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return bits_f32(sign) + (sign ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-8f;
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace

size_t dtype_bytes(const std::string& dtype, const std::string& what) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  MOERL_FAIL(BadInput, what, ": dtype ", dtype, " is not supported (F32, BF16 or F16)");
}

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::string& dtype) {
  const size_t eb = dtype_bytes(dtype, path);
  std::ostringstream header;
  header << "{\"__metadata__\":{\"format\":\"" << (dtype == "F32" ? "moerl" : "pt") << "\"}";
  size_t offset = 0;
  for (const TensorOut& t : tensors) {
    size_t bytes = numel(t.shape) * eb;
    header << "," << json_quote(t.name) << ":{\"dtype\":\"" << dtype
           << "\",\"shape\":" << shape_text(t.shape) << ",\"data_offsets\":[" << offset << ","
           << offset + bytes << "]}";
    offset += bytes;
  }
  header << "}";
  std::string h = header.str();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps the data 8-byte aligned
  std::string head(8, '\0');
  uint64_t hlen = h.size();
  for (int i = 0; i < 8; i++) head[i] = (char)((hlen >> (8 * i)) & 0xff);
  head += h;
  // streamed tensor by tensor, converted (or zero-filled) in pieces of kPiece values
  constexpr size_t kPiece = 1 << 16;
  write_file_atomic(path, [&](const Append& append) {
    append(head.data(), head.size());
    std::vector<char> buf(kPiece * sizeof(float));
    for (const TensorOut& t : tensors) {
      const size_t n = numel(t.shape);
      if (dtype == "F32" && t.data != nullptr) {
        append(reinterpret_cast<const char*>(t.data), n * sizeof(float));
        continue;
      }
      for (size_t i0 = 0; i0 < n; i0 += kPiece) {
        const size_t m = std::min(kPiece, n - i0);
        if (t.data == nullptr) {
          std::fill(buf.begin(), buf.begin() + m * eb, '\0');
        } else {
          for (size_t i = 0; i < m; i++) {
            uint16_t v = dtype == "BF16" ? to_bf16(t.data[i0 + i]) : to_f16(t.data[i0 + i]);
            buf[2 * i] = (char)(v & 0xff);
            buf[2 * i + 1] = (char)(v >> 8);
          }
        }
        append(buf.data(), m * eb);
      }
    }
  });
}

namespace {

// The header's tensors, each range checked against data_size bytes of data, against its dtype
// and shape (for the dtypes read here), and against every other tensor's range: no two overlap.
std::map<std::string, TensorIn> parse_header(const std::string& path, const std::string& text,
                                             uint64_t data_size) {
  Json header = parse_json(text, path + " header");
  MOERL_CHECK_INPUT(header.is_object(), path, ": header is not a JSON object");
  std::map<std::string, TensorIn> tensors;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    std::string what = path + " tensor " + name;
    TensorIn t;
    t.dtype = string_field(v, "dtype", what);
    uint64_t n = 1;  // numel, checked to stay within the data so it cannot overflow
    for (const Json& d : array_field(v, "shape", what)) {
      const int64_t dim = as_integer(d, what + " shape");
      MOERL_CHECK_INPUT(dim >= 0 && (dim == 0 || n <= data_size / (uint64_t)dim), what, ": shape ",
                        v["shape"].dump(), " does not fit the file's ", data_size, " data bytes");
      n *= (uint64_t)dim;
      t.shape.push_back(dim);
    }
    const Json::array_t& off = array_field(v, "data_offsets", what);
    MOERL_CHECK_INPUT(off.size() == 2, what, ": data_offsets must have two entries");
    int64_t b = as_integer(off[0], what + " data_offsets"), e = as_integer(off[1], what + " data_offsets");
    MOERL_CHECK_INPUT(0 <= b && b <= e && (uint64_t)e <= data_size, what, ": data range [", b, ",",
                      e, ") outside the ", data_size, " data bytes");
    t.begin = (size_t)b;
    t.end = (size_t)e;
    if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") {
      const uint64_t bytes = n * dtype_bytes(t.dtype, what);
      MOERL_CHECK_INPUT(t.end - t.begin == bytes, what, ": data range [", b, ",", e, ") holds ",
                        t.end - t.begin, " bytes, its dtype ", t.dtype, " and shape ",
                        shape_text(t.shape), " take ", bytes);
    }
    tensors[name] = t;
  }
  // ranges in file order: each must start at or after the end of the one before
  std::vector<std::pair<const std::string*, const TensorIn*>> order;
  for (const auto& [name, t] : tensors) order.emplace_back(&name, &t);
  std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    return std::make_pair(x.second->begin, x.second->end) < std::make_pair(y.second->begin, y.second->end);
  });
  for (size_t i = 1; i < order.size(); i++) {
    const TensorIn &prev = *order[i - 1].second, &t = *order[i].second;
    MOERL_CHECK_INPUT(t.begin >= prev.end, path, ": tensor ", *order[i].first, " data range [",
                      t.begin, ",", t.end, ") overlaps tensor ", *order[i - 1].first, " [",
                      prev.begin, ",", prev.end, ")");
  }
  return tensors;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::string raw = read_file(path);
  MOERL_CHECK_INPUT(raw.size() >= 8, path, ": too short for a safetensors file");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)raw[i] << (8 * i);
  MOERL_CHECK_INPUT(hlen <= raw.size() - 8, path, ": header length ", hlen, " exceeds file size ",
                    raw.size());
  SafetensorsFile f;
  f.path = path;
  f.tensors = parse_header(path, raw.substr(8, hlen), raw.size() - 8 - hlen);
  f.data = raw.substr(8 + hlen);
  return f;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOERL_CHECK_INPUT(in.good(), path, ": cannot open the safetensors file");
  in.seekg(0, std::ios::end);
  const uint64_t size = (uint64_t)in.tellg();
  in.seekg(0);
  MOERL_CHECK_INPUT(size >= 8, path, ": too short for a safetensors file (", size, " bytes)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)len[i] << (8 * i);
  MOERL_CHECK_INPUT(hlen <= size - 8, path, ": header length ", hlen, " exceeds the file's ",
                    size, " bytes (truncated header)");
  std::string text(hlen, '\0');
  in.read(text.data(), (std::streamsize)hlen);
  MOERL_CHECK_INPUT(in.good(), path, ": could not read the ", hlen, "-byte header");
  SafetensorsHeader h;
  h.path = path;
  h.data_start = 8 + hlen;
  h.tensors = parse_header(path, text, size - 8 - hlen);
  return h;
}

void read_tensor_f32(const SafetensorsHeader& h, const std::string& name,
                     const std::vector<int64_t>& shape, float* out) {
  auto it = h.tensors.find(name);
  MOERL_CHECK_INPUT(it != h.tensors.end(), h.path, ": missing tensor ", name);
  const TensorIn& t = it->second;
  const std::string what = h.path + " tensor " + name;
  const size_t eb = dtype_bytes(t.dtype, what), n = numel(shape);
  MOERL_CHECK_INPUT(t.shape == shape, h.path, ": tensor ", name, " has shape ", shape_text(t.shape),
                    ", expected ", shape_text(shape));
  std::ifstream in(h.path, std::ios::binary);
  in.seekg((std::streamoff)(h.data_start + t.begin));
  if (eb == 4) {
    in.read(reinterpret_cast<char*>(out), (std::streamsize)(n * 4));
    MOERL_CHECK_INPUT(in.good(), what, ": could not read its bytes");
    return;
  }
  std::vector<uint16_t> raw(n);
  in.read(reinterpret_cast<char*>(raw.data()), (std::streamsize)(n * 2));
  MOERL_CHECK_INPUT(in.good(), what, ": could not read its bytes");
  if (t.dtype == "BF16")
    for (size_t i = 0; i < n; i++) out[i] = bits_f32((uint32_t)raw[i] << 16);
  else
    for (size_t i = 0; i < n; i++) out[i] = from_f16(raw[i]);
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
  std::memcpy(out, data.data() + t.begin, t.end - t.begin);
}

}  // namespace moerl::io
