// The strict JSON parser of json.h: a recursive-descent parser over the whole text, validating the
// RFC 8259 grammar itself (numbers included) and decoding strings to UTF-8.
#include "io/json.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace cpuformer::io {

namespace {

[[noreturn]] void type_error(Json::Type expected, Json::Type actual) {
  throw std::invalid_argument(std::string("JSON: expected ") + Json::type_name(expected) + ", got " +
                              Json::type_name(actual));
}

}  // namespace

class JsonParser {
 public:
  JsonParser(const std::string& text, bool nonfinite) : s_(text), nonfinite_(nonfinite) {}

  Json parse_document() {
    skip_ws();
    Json value = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the value");
    return value;
  }

 private:
  const std::string& s_;
  const bool nonfinite_;  // NaN, Infinity and -Infinity accepted as numbers (Python's json)
  std::size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const { fail_at(what, pos_); }
  [[noreturn]] void fail_at(const std::string& what, std::size_t offset) const {
    throw std::invalid_argument("JSON: " + what + " at offset " + std::to_string(offset));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect_literal(const char* word) {
    const std::size_t start = pos_;
    for (const char* p = word; *p; ++p, ++pos_) {
      if (at_end() || peek() != *p) fail_at("invalid literal", start);
    }
  }

  Json parse_value(int depth) {
    if (at_end()) fail("unexpected end of input, expected a value");
    Json value;
    switch (peek()) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"':
        value.type_ = Json::Type::kString;
        value.text_ = parse_string();
        return value;
      case 't':
        expect_literal("true");
        value.type_ = Json::Type::kBool;
        value.bool_ = true;
        return value;
      case 'f':
        expect_literal("false");
        value.type_ = Json::Type::kBool;
        return value;
      case 'n': expect_literal("null"); return value;
      default:
        if (nonfinite_ &&
            (peek() == 'N' || peek() == 'I' || (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] == 'I'))) {
          return parse_nonfinite();
        }
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("unexpected character, expected a value");
    }
  }

  Json parse_array(int depth) {
    if (depth > Json::kMaxDepth) fail("nesting deeper than " + std::to_string(Json::kMaxDepth));
    ++pos_;  // '['
    Json value;
    value.type_ = Json::Type::kArray;
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return value;
    }
    for (;;) {
      skip_ws();
      value.array_.push_back(parse_value(depth));
      skip_ws();
      if (at_end()) fail("unterminated array");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return value;
      }
      fail("expected ',' or ']' in array");
    }
  }

  Json parse_object(int depth) {
    if (depth > Json::kMaxDepth) fail("nesting deeper than " + std::to_string(Json::kMaxDepth));
    ++pos_;  // '{'
    Json value;
    value.type_ = Json::Type::kObject;
    std::unordered_map<std::string, std::size_t> index;  // key -> position in object_
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return value;
    }
    for (;;) {
      skip_ws();
      if (at_end()) fail("unterminated object");
      if (peek() != '"') fail("expected a string key in object");
      std::string key = parse_string();
      skip_ws();
      if (at_end() || peek() != ':') fail("expected ':' after object key");
      ++pos_;
      skip_ws();
      Json member = parse_value(depth);
      auto found = index.find(key);
      if (found != index.end()) {
        value.object_[found->second].second = std::move(member);  // the last duplicate wins
      } else {
        index.emplace(key, value.object_.size());
        value.object_.emplace_back(std::move(key), std::move(member));
      }
      skip_ws();
      if (at_end()) fail("unterminated object");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return value;
      }
      fail("expected ',' or '}' in object");
    }
  }

  // Four hex digits at pos_ (after "\u").
  unsigned parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      unsigned digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("invalid hex digit in \\u escape");
      }
      code = code * 16 + digit;
    }
    pos_ += 4;
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // A string at pos_ (at its opening quote). Raw bytes >= 0x80 are copied as they are (the input is
  // taken to be UTF-8); escapes are decoded, \uXXXX surrogate pairs to one code point.
  std::string parse_string() {
    const std::size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (at_end()) fail_at("unterminated string", start);
      const char c = peek();
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      const std::size_t escape = pos_;
      ++pos_;
      if (at_end()) fail_at("unterminated string", start);
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at("lone low surrogate in \\u escape", escape);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
              fail_at("high surrogate not followed by a low surrogate", escape);
            }
            pos_ += 2;
            const unsigned low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail_at("high surrogate not followed by a low surrogate", escape);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at("invalid escape in string", escape);
      }
    }
  }

  // NaN, Infinity or -Infinity, spelled as Python's repr spells the float ("nan", "inf", "-inf").
  Json parse_nonfinite() {
    Json value;
    value.type_ = Json::Type::kNumber;
    if (peek() == 'N') {
      expect_literal("NaN");
      value.text_ = "nan";
      value.number_ = std::numeric_limits<double>::quiet_NaN();
    } else {
      const bool negative = peek() == '-';
      if (negative) ++pos_;
      expect_literal("Infinity");
      value.text_ = negative ? "-inf" : "inf";
      value.number_ = negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    }
    return value;
  }

  bool digit_at(std::size_t i) const { return i < s_.size() && s_[i] >= '0' && s_[i] <= '9'; }

  // number = [ "-" ] ( "0" / [1-9] *DIGIT ) [ "." 1*DIGIT ] [ ( "e" / "E" ) [ "+" / "-" ] 1*DIGIT ]
  Json parse_number() {
    const std::size_t start = pos_;
    std::size_t i = pos_;
    if (s_[i] == '-') ++i;
    if (!digit_at(i)) fail_at("invalid number", start);
    if (s_[i] == '0') {
      ++i;
      if (digit_at(i)) fail_at("invalid number (leading zero)", start);
    } else {
      while (digit_at(i)) ++i;
    }
    if (i < s_.size() && s_[i] == '.') {
      ++i;
      if (!digit_at(i)) fail_at("invalid number (no digits after '.')", start);
      while (digit_at(i)) ++i;
    }
    if (i < s_.size() && (s_[i] == 'e' || s_[i] == 'E')) {
      ++i;
      if (i < s_.size() && (s_[i] == '+' || s_[i] == '-')) ++i;
      if (!digit_at(i)) fail_at("invalid number (no digits in exponent)", start);
      while (digit_at(i)) ++i;
    }
    Json value;
    value.type_ = Json::Type::kNumber;
    value.text_ = s_.substr(start, i - start);
    // The token is validated above, so strtod sees only JSON number syntax. strtod follows the
    // LC_NUMERIC locale's decimal point; cpuformer never calls setlocale, so that is the "C" locale.
    // An out-of-range magnitude (1e400) gives ±HUGE_VAL, as Python's json gives inf.
    value.number_ = std::strtod(value.text_.c_str(), nullptr);
    pos_ = i;
    return value;
  }
};

Json Json::parse(const std::string& text) { return JsonParser(text, false).parse_document(); }
Json Json::parse_python(const std::string& text) { return JsonParser(text, true).parse_document(); }

const char* Json::type_name(Type type) {
  switch (type) {
    case Type::kNull: return "null";
    case Type::kBool: return "bool";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "?";
}

bool Json::boolean() const {
  if (type_ != Type::kBool) type_error(Type::kBool, type_);
  return bool_;
}

double Json::number() const {
  if (type_ != Type::kNumber) type_error(Type::kNumber, type_);
  return number_;
}

Json Json::make_bool(bool value) {
  Json j;
  j.type_ = Type::kBool;
  j.bool_ = value;
  return j;
}

Json Json::make_number(double value, std::string text) {
  Json j;
  j.type_ = Type::kNumber;
  j.number_ = value;
  j.text_ = std::move(text);
  return j;
}

Json Json::make_string(std::string value) {
  Json j;
  j.type_ = Type::kString;
  j.text_ = std::move(value);
  return j;
}

Json Json::make_array(Array items) {
  Json j;
  j.type_ = Type::kArray;
  j.array_ = std::move(items);
  return j;
}

Json Json::make_object(Object members) {
  Json j;
  j.type_ = Type::kObject;
  for (auto& member : members) {
    bool replaced = false;
    for (auto& existing : j.object_) {
      if (existing.first == member.first) {
        existing.second = std::move(member.second);
        replaced = true;
        break;
      }
    }
    if (!replaced) j.object_.push_back(std::move(member));
  }
  return j;
}

bool Json::is_integer_number() const {
  return type_ == Type::kNumber && text_.find_first_not_of("-0123456789") == std::string::npos;
}

long Json::integer() const {
  if (type_ != Type::kNumber) type_error(Type::kNumber, type_);
  if (text_.find_first_of(".eEna") != std::string::npos) {  // (nan, inf)
    throw std::invalid_argument("JSON: expected an integer, got " + text_);
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text_.c_str(), &end, 10);
  if (errno == ERANGE || end != text_.c_str() + text_.size() || v < std::numeric_limits<long>::min() ||
      v > std::numeric_limits<long>::max()) {
    throw std::invalid_argument("JSON: integer " + text_ + " out of range");
  }
  return static_cast<long>(v);
}

const std::string& Json::string() const {
  if (type_ != Type::kString) type_error(Type::kString, type_);
  return text_;
}

const Json::Array& Json::array() const {
  if (type_ != Type::kArray) type_error(Type::kArray, type_);
  return array_;
}

const Json::Object& Json::object() const {
  if (type_ != Type::kObject) type_error(Type::kObject, type_);
  return object_;
}

const Json* Json::find(const std::string& key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& member : object_) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

const Json& Json::at(const std::string& key) const {
  if (type_ != Type::kObject) type_error(Type::kObject, type_);
  const Json* value = find(key);
  if (value == nullptr) throw std::invalid_argument("JSON: missing key '" + key + "'");
  return *value;
}

std::size_t Json::size() const {
  switch (type_) {
    case Type::kString: return text_.size();
    case Type::kArray: return array_.size();
    case Type::kObject: return object_.size();
    default:
      throw std::invalid_argument(std::string("JSON: size() of a ") + type_name(type_) +
                                  " (expected array, object or string)");
  }
}

}  // namespace cpuformer::io
