// A small, strict JSON (RFC 8259) parser for the C API's readers (config.json, safetensors headers):
// no Python needed. Json::parse rejects anything RFC 8259 rejects (trailing garbage, NaN/Infinity,
// leading zeros, control characters in strings, lone surrogates, ...) and nesting deeper than 64,
// with std::invalid_argument("JSON: <what> at offset N"). Duplicate object keys are allowed and the
// last one wins (as in Python's json); objects keep their keys in first-insertion order.
// Numbers keep their source text as well as their double value, so integer() is exact beyond 2^53.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace cpuformer::io {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  static constexpr int kMaxDepth = 64;  // arrays/objects nested deeper than this are rejected

  Json() = default;  // null

  // Values built by a front end rather than parsed (the Python binding hands config dicts to the
  // architecture registry this way). `text` is the number's spelling: its digits for an integer,
  // anything with '.', 'e' or a letter for a float (Python's repr: "1e-05", "768.0", "nan").
  static Json make_bool(bool value);
  static Json make_number(double value, std::string text);
  static Json make_string(std::string value);
  static Json make_array(Array items);
  static Json make_object(Object members);  // a repeated key: the last one wins, as in parse()

  // Whether a number was written as an integer (no fraction, exponent, nan or inf).
  bool is_integer_number() const;
  // A number's spelling (its source text) or a string's value.
  const std::string& string_or_number_text() const { return text_; }

  // Parses a whole document; throws std::invalid_argument("JSON: <what> at offset N").
  static Json parse(const std::string& text);
  // As parse, plus the three values Python's json module reads and writes beyond RFC 8259: NaN,
  // Infinity and -Infinity (spelled "nan", "inf", "-inf"). For config files that Python tools write
  // (config.json, generation_config.json, the graph manifest), so that the C API reads every file the
  // Python package reads; safetensors headers stay strict.
  static Json parse_python(const std::string& text);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }

  // Typed accessors: each throws std::invalid_argument("JSON: expected <type>, got <type>") on a
  // value of another type.
  bool boolean() const;
  double number() const;
  // The number as a long: throws std::invalid_argument when it is not an integer (a fraction or an
  // exponent in its text, e.g. 1.0 or 1e3) or does not fit in a long.
  long integer() const;
  const std::string& string() const;
  const Array& array() const;
  const Object& object() const;  // insertion order

  // Object lookup: nullptr when the key is absent or this is not an object.
  const Json* find(const std::string& key) const;
  // Object lookup: throws std::invalid_argument("JSON: missing key 'k'") when absent, and the
  // wrong-type error when this is not an object.
  const Json& at(const std::string& key) const;
  // Elements of an array, members of an object, bytes of a string; throws for other types.
  std::size_t size() const;

  static const char* type_name(Type type);

 private:
  friend class JsonParser;

  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0.0;
  std::string text_;  // kString: the decoded UTF-8 string; kNumber: the number's source token
  Array array_;
  Object object_;
};

}  // namespace cpuformer::io
