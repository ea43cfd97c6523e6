// JSON parser (recursive descent) and helpers.
#include "io/json.h"

#include <sys/stat.h>  // mkdir

#include <cerrno>   // errno

#include <cctype>   // std::isdigit
#include <cmath>    // std::isfinite
#include <cstdio>   // std::snprintf, std::rename, FILE
#include <fstream>  // std::ifstream
#include <sstream>  // std::ostringstream

#include "common/check.h"

namespace moerl::io {
namespace {

struct Parser {
  const std::string& s;
  const std::string& what;
  size_t i = 0;

  [[noreturn]] void fail(const char* msg) {
    MOERL_FAIL(BadInput, what, ": invalid JSON at byte ", i, ": ", msg);
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      i++;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail("unexpected character");
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      char c = s[i++];
      if (c == '"') break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i >= s.size()) fail("bad escape");
      char e = s[i++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (i + 4 > s.size()) fail("bad \\u escape");
          unsigned cp = std::stoul(s.substr(i, 4), nullptr, 16);
          i += 4;
          // UTF-8 encode (BMP only; surrogate pairs are not needed by our files)
          if (cp < 0x80) {
            out.push_back((char)cp);
          } else if (cp < 0x800) {
            out.push_back((char)(0xC0 | (cp >> 6)));
            out.push_back((char)(0x80 | (cp & 0x3F)));
          } else {
            out.push_back((char)(0xE0 | (cp >> 12)));
            out.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
            out.push_back((char)(0x80 | (cp & 0x3F)));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
    return out;
  }
  Json parse_value(int depth) {
    if (depth > 64) fail("nesting too deep");
    ws();
    if (i >= s.size()) fail("unexpected end");
    Json v;
    char c = s[i];
    if (c == '{') {
      i++;
      v.type = Json::Type::Object;
      if (eat('}')) return v;
      do {
        ws();
        std::string key = parse_string();
        expect(':');
        v.obj[key] = parse_value(depth + 1);
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      i++;
      v.type = Json::Type::Array;
      if (eat(']')) return v;
      do {
        v.arr.push_back(parse_value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.type = Json::Type::String;
      v.str = parse_string();
    } else if (s.compare(i, 4, "true") == 0) {
      i += 4;
      v.type = Json::Type::Bool;
      v.b = true;
    } else if (s.compare(i, 5, "false") == 0) {
      i += 5;
      v.type = Json::Type::Bool;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      size_t end = i;
      while (end < s.size() && (std::isdigit((unsigned char)s[end]) || s[end] == '-' ||
                                s[end] == '+' || s[end] == '.' || s[end] == 'e' || s[end] == 'E'))
        end++;
      if (end == i) fail("unexpected character");
      try {
        v.num = std::stod(s.substr(i, end - i));
      } catch (const std::exception&) {
        fail("bad number");
      }
      v.type = Json::Type::Number;
      i = end;
    }
    return v;
  }
};

}  // namespace

const Json& Json::at(const std::string& key, const std::string& what) const {
  MOERL_CHECK_INPUT(type == Type::Object, what, ": expected an object");
  auto it = obj.find(key);
  MOERL_CHECK_INPUT(it != obj.end(), what, ": missing field \"", key, "\"");
  return it->second;
}

double Json::number(const std::string& what) const {
  MOERL_CHECK_INPUT(type == Type::Number, what, ": expected a number");
  return num;
}

int64_t Json::integer(const std::string& what) const {
  double x = number(what);
  MOERL_CHECK_INPUT(x == (double)(int64_t)x, what, ": expected an integer, got ", x);
  return (int64_t)x;
}

const std::string& Json::string(const std::string& what) const {
  MOERL_CHECK_INPUT(type == Type::String, what, ": expected a string");
  return str;
}

const std::vector<Json>& Json::array(const std::string& what) const {
  MOERL_CHECK_INPUT(type == Type::Array, what, ": expected an array");
  return arr;
}

Json parse_json(const std::string& text, const std::string& what) {
  Parser p{text, what};
  Json v = p.parse_value(0);
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back((char)c);
    }
  }
  return out + "\"";
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
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  MOERL_CHECK(f != nullptr, "cannot create ", tmp);
  size_t n = std::fwrite(data.data(), 1, data.size(), f);
  bool ok = n == data.size() && std::fflush(f) == 0;
  ok = (std::fclose(f) == 0) && ok;
  MOERL_CHECK(ok, "short write to ", tmp);
  MOERL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

}  // namespace moerl::io
