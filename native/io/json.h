// JSON of checkpoint headers, manifests and the rollout / reward / metrics JSONL files, through
// nlohmann/json: parsing whose errors name the input, typed field access that throws
// BadInput naming the field, and the writing helpers the files use. Plus the small file
// helpers every reader and writer of those files needs.
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::json: parser and value tree

#include <cstdint>
#include <functional>
#include <string>

namespace moerl::io {

using Json = nlohmann::json;

// Throws BadInput "<what>: invalid JSON: <reason with line and column>"; `what` names the
// input (e.g. "rollouts.jsonl line 3").
Json parse_json(const std::string& text, const std::string& what);

// Calls fn(value, what) for every non-empty line of a JSONL file, what = "<path> line <n>".
void for_each_json_line(const std::string& path,
                        const std::function<void(const Json&, const std::string& what)>& fn);

// Typed access for input data: each throws BadInput naming `what` (and the field) when the
// value is missing or of another type.
const Json& field(const Json& object, const std::string& key, const std::string& what);
double as_number(const Json& v, const std::string& what);
int64_t as_integer(const Json& v, const std::string& what);  // 3 and 3.0, not 3.5
// An integer that fits an int: one outside [INT_MIN, INT_MAX] is BadInput naming the value, never
// truncated (4294967328 is not read as 32).
int as_int(const Json& v, const std::string& what);
const std::string& as_string(const Json& v, const std::string& what);
bool as_bool(const Json& v, const std::string& what);
const Json::array_t& as_array(const Json& v, const std::string& what);
double number_field(const Json& object, const std::string& key, const std::string& what);
int64_t integer_field(const Json& object, const std::string& key, const std::string& what);
int int_field(const Json& object, const std::string& key, const std::string& what);
const std::string& string_field(const Json& object, const std::string& key, const std::string& what);
const Json::array_t& array_field(const Json& object, const std::string& key, const std::string& what);
bool bool_field(const Json& object, const std::string& key, const std::string& what);

// "text" quoted and escaped; invalid UTF-8 becomes U+FFFD, so the output is always JSON.
std::string json_quote(const std::string& s);
// Shortest text that reads back as the same float (9 significant digits); null if not finite.
std::string json_float(double x);

std::string read_file(const std::string& path);
// mkdir -p; throws BadInput naming the part that cannot be created.
void make_dirs(const std::string& dir);
// Writes to path + ".tmp" then renames, so readers never see a partial file.
void write_file_atomic(const std::string& path, const std::string& data);
// The same for a file made in pieces: produce calls append(bytes, n) as often as it likes, so a
// large file never has to be held in memory whole.
using Append = std::function<void(const char* bytes, size_t n)>;
void write_file_atomic(const std::string& path, const std::function<void(const Append&)>& produce);

}  // namespace moerl::io
