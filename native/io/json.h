// Minimal JSON for checkpoint headers, manifests and the rollout/reward/metrics JSONL
// files: a parsed value tree and a few writing helpers. Numbers are doubles.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moerl::io {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Type type = Type::Null;
  bool b = false;
  double num = 0.0;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;

  bool has(const std::string& key) const { return type == Type::Object && obj.count(key) > 0; }
  // Accessors throw BadInput naming `what` (e.g. the file and field) on a type mismatch.
  const Json& at(const std::string& key, const std::string& what) const;
  double number(const std::string& what) const;
  int64_t integer(const std::string& what) const;
  const std::string& string(const std::string& what) const;
  const std::vector<Json>& array(const std::string& what) const;
};

// Throws BadInput with `what` and the byte offset of the first error.
Json parse_json(const std::string& text, const std::string& what);

// "text" with quotes, escapes for ", \, control characters.
std::string json_quote(const std::string& s);
// Shortest text that reads back as the same float (9 significant digits).
std::string json_float(double x);

std::string read_file(const std::string& path);
// mkdir -p; throws BadInput naming the part that cannot be created.
void make_dirs(const std::string& dir);
// Writes to path + ".tmp" then renames, so readers never see a partial file.
void write_file_atomic(const std::string& path, const std::string& data);

}  // namespace moerl::io
