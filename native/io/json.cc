// JSON parsing and typed access over nlohmann/json, and the file helpers.
#include "io/json.h"

#include <sys/stat.h>  // mkdir

#include <cerrno>   // errno
#include <cmath>    // std::isfinite, std::trunc
#include <cstdio>   // std::snprintf, std::rename, FILE
#include <fstream>  // std::ifstream
#include <limits>   // std::numeric_limits
#include <sstream>  // std::ostringstream, std::istringstream

#include "common/check.h"

namespace moerl::io {
namespace {

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says where.
std::string reason(const nlohmann::json::exception& e) {
  std::string s = e.what();
  size_t at = s.find("] ");
  return at == std::string::npos ? s : s.substr(at + 2);
}

}  // namespace

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    MOERL_FAIL(BadInput, what, ": invalid JSON: ", reason(e));
  }
}

void for_each_json_line(const std::string& path,
                        const std::function<void(const Json&, const std::string& what)>& fn) {
  std::istringstream lines(read_file(path));
  std::string line;
  for (int n = 1; std::getline(lines, line); n++) {
    if (line.empty()) continue;
    std::string what = path + " line " + std::to_string(n);
    fn(parse_json(line, what), what);
  }
}

const Json& field(const Json& object, const std::string& key, const std::string& what) {
  MOERL_CHECK_INPUT(object.is_object(), what, ": expected an object, got ", object.type_name());
  auto it = object.find(key);
  MOERL_CHECK_INPUT(it != object.end(), what, ": missing field \"", key, "\"");
  return *it;
}

double as_number(const Json& v, const std::string& what) {
  MOERL_CHECK_INPUT(v.is_number(), what, ": expected a number, got ", v.type_name());
  return v.get<double>();
}

int64_t as_integer(const Json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    MOERL_CHECK_INPUT(u <= (uint64_t)std::numeric_limits<int64_t>::max(), what, ": integer ", u,
                      " is too large");
    return (int64_t)u;
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  double x = as_number(v, what);
  // 2^63 is exact in a double; every integral double below it converts exactly
  MOERL_CHECK_INPUT(std::trunc(x) == x && std::fabs(x) < 9223372036854775808.0, what,
                    ": expected an integer, got ", v.dump());
  return (int64_t)x;
}

int as_int(const Json& v, const std::string& what) {
  const int64_t x = as_integer(v, what);
  MOERL_CHECK_INPUT(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(),
                    what, ": integer ", x, " does not fit a 32-bit int (at most ",
                    std::numeric_limits<int>::max(), ")");
  return (int)x;
}

const std::string& as_string(const Json& v, const std::string& what) {
  MOERL_CHECK_INPUT(v.is_string(), what, ": expected a string, got ", v.type_name());
  return v.get_ref<const std::string&>();
}

bool as_bool(const Json& v, const std::string& what) {
  MOERL_CHECK_INPUT(v.is_boolean(), what, ": expected true or false, got ", v.dump());
  return v.get<bool>();
}

const Json::array_t& as_array(const Json& v, const std::string& what) {
  MOERL_CHECK_INPUT(v.is_array(), what, ": expected an array, got ", v.type_name());
  return v.get_ref<const Json::array_t&>();
}

double number_field(const Json& object, const std::string& key, const std::string& what) {
  return as_number(field(object, key, what), what + " field \"" + key + "\"");
}
int64_t integer_field(const Json& object, const std::string& key, const std::string& what) {
  return as_integer(field(object, key, what), what + " field \"" + key + "\"");
}
int int_field(const Json& object, const std::string& key, const std::string& what) {
  return as_int(field(object, key, what), what + " field \"" + key + "\"");
}
const std::string& string_field(const Json& object, const std::string& key, const std::string& what) {
  return as_string(field(object, key, what), what + " field \"" + key + "\"");
}
const Json::array_t& array_field(const Json& object, const std::string& key, const std::string& what) {
  return as_array(field(object, key, what), what + " field \"" + key + "\"");
}

bool bool_field(const Json& object, const std::string& key, const std::string& what) {
  return as_bool(field(object, key, what), what + " field \"" + key + "\"");
}

std::string json_quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string json_float(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOERL_CHECK_INPUT(in.good(), "cannot open ", path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); i++) {
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        MOERL_FAIL(BadInput, "cannot create directory ", part);
    }
  }
}

void write_file_atomic(const std::string& path, const std::string& data) {
  write_file_atomic(path, [&](const Append& append) { append(data.data(), data.size()); });
}

void write_file_atomic(const std::string& path, const std::function<void(const Append&)>& produce) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  MOERL_CHECK(f != nullptr, "cannot create ", tmp);
  bool ok = true;
  try {
    produce([&](const char* bytes, size_t n) { ok = ok && std::fwrite(bytes, 1, n, f) == n; });
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  ok = ok && std::fflush(f) == 0;
  ok = (std::fclose(f) == 0) && ok;
  MOERL_CHECK(ok, "short write to ", tmp);
  MOERL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

}  // namespace moerl::io
