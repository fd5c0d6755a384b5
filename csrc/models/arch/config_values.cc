#include "models/arch/config_values.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "models/request_checks.h"

namespace cpuformer {
namespace arch {
namespace {

// reprlib's limits in the Python package's messages (_model_dir._short_repr).
constexpr std::size_t kMaxString = 200, kMaxLong = 60, kMaxList = 8, kMaxDict = 4;
constexpr int kMaxLevel = 3;

std::string shorten(const std::string& s, std::size_t limit) {
  if (s.size() <= limit) return s;
  const std::size_t i = (limit - 3) / 2, j = limit - 3 - i;
  return s.substr(0, i) + "..." + s.substr(s.size() - j);
}

std::string repr1(const Json& v, int level);

std::string repr_number(const Json& v) {
  if (v.is_integer_number()) {
    const std::string& text = v.string_or_number_text();
    // JSON allows "-0"; Python's int prints it as 0.
    std::string digits = text == "-0" ? "0" : text;
    return shorten(digits, kMaxLong);
  }
  return shorten(python_float(v.number()), kMaxString);
}

std::string repr1(const Json& v, int level) {
  switch (v.type()) {
    case Json::Type::kNull: return "None";
    case Json::Type::kBool: return v.boolean() ? "True" : "False";
    case Json::Type::kNumber: return repr_number(v);
    case Json::Type::kString: {
      const std::string& s = v.string();
      // repr of the first 200 code points, then shortened to 200 characters (bytes here).
      std::size_t end = 0, count = 0;
      while (end < s.size() && count < kMaxString) {
        ++count;
        ++end;
        while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
      }
      return shorten(python_string(s.substr(0, end)), kMaxString);
    }
    case Json::Type::kArray: {
      const Json::Array& items = v.array();
      if (level <= 0 && !items.empty()) return "[...]";
      std::string out = "[";
      for (std::size_t i = 0; i < items.size() && i < kMaxList; ++i) {
        if (i) out += ", ";
        out += repr1(items[i], level - 1);
      }
      if (items.size() > kMaxList) out += ", ...";
      return out + "]";
    }
    case Json::Type::kObject: {
      const Json::Object& members = v.object();
      if (members.empty()) return "{}";
      if (level <= 0) return "{...}";
      std::vector<const std::pair<std::string, Json>*> sorted;
      for (const auto& m : members) sorted.push_back(&m);
      std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
      std::string out = "{";
      for (std::size_t i = 0; i < sorted.size() && i < kMaxDict; ++i) {
        if (i) out += ", ";
        out += shorten(python_string(sorted[i]->first), kMaxString) + ": " + repr1(sorted[i]->second, level - 1);
      }
      if (sorted.size() > kMaxDict) out += ", ...";
      return out + "}";
    }
  }
  return "?";
}

// Python's == between JSON values (1 == 1.0; True == 1 as well: callers check bool-ness).
bool equal(const Json& a, const Json& b) {
  const bool a_num = a.type() == Json::Type::kNumber || a.type() == Json::Type::kBool;
  const bool b_num = b.type() == Json::Type::kNumber || b.type() == Json::Type::kBool;
  if (a_num && b_num) {
    const double x = a.type() == Json::Type::kBool ? (a.boolean() ? 1.0 : 0.0) : a.number();
    const double y = b.type() == Json::Type::kBool ? (b.boolean() ? 1.0 : 0.0) : b.number();
    if (a.is_integer_number() && b.is_integer_number())
      return a.string_or_number_text() == b.string_or_number_text() || x == y;
    return x == y;
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Json::Type::kNull: return true;
    case Json::Type::kString: return a.string() == b.string();
    case Json::Type::kArray: {
      if (a.array().size() != b.array().size()) return false;
      for (std::size_t i = 0; i < a.array().size(); ++i)
        if (!equal(a.array()[i], b.array()[i])) return false;
      return true;
    }
    case Json::Type::kObject: {
      if (a.object().size() != b.object().size()) return false;
      for (const auto& m : a.object()) {
        const Json* other = b.find(m.first);
        if (!other || !equal(m.second, *other)) return false;
      }
      return true;
    }
    default: return false;
  }
}

std::string bound_text(const Bound& b) {
  if (b.integer) return std::to_string(static_cast<long long>(b.value));
  return python_float(b.value);
}

std::string range_text(bool has_min, const Bound& min, bool has_max, const Bound& max) {
  std::string out;
  if (has_min) out += ">= " + bound_text(min);
  if (has_max) out += std::string(out.empty() ? "" : " and ") + "<= " + bound_text(max);
  return out.empty() ? out : " " + out;
}

struct Found {
  const Json* value;  // nullptr: absent or null
  std::string key;    // the key it was found under
};

Found lookup(const Config& config, const std::string& key, const std::vector<std::string>& aliases) {
  Found found{config.get(key), key};
  for (const std::string& alias : aliases) {
    const Json* other = config.get(alias);
    if (!other) continue;
    if (!found.value) {
      found = {other, alias};
    } else if (!equal(*other, *found.value) ||
               (other->type() == Json::Type::kBool) != (found.value->type() == Json::Type::kBool)) {
      throw std::invalid_argument(config.source + ": " + python_string(found.key) + " (" + describe(*found.value) +
                                  ") and " + python_string(alias) + " (" + describe(*other) +
                                  ") name the same setting but differ; keep one of them");
    }
  }
  return found;
}

}  // namespace

std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::atoi(sci.c_str() + e + 1);
  const int decpt = exponent + 1;  // value = 0.<digits> * 10^decpt
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  std::string out;
  if (decpt <= 0) {
    out = "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
    out = digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return sign + out;
}

std::string python_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char hex[8];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c == 0xC2 && i + 1 < s.size() &&
               (static_cast<unsigned char>(s[i + 1]) < 0xA1 || static_cast<unsigned char>(s[i + 1]) == 0xAD)) {
      // U+0080-U+00A0 and U+00AD are not printable: Python writes \xNN.
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(s[i + 1]));
      out += hex;
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string describe(const Json& value) { return repr1(value, kMaxLevel); }

std::string python_repr(const Json& v) {
  switch (v.type()) {
    case Json::Type::kNull: return "None";
    case Json::Type::kBool: return v.boolean() ? "True" : "False";
    case Json::Type::kNumber:
      if (v.is_integer_number()) return v.string_or_number_text() == "-0" ? "0" : v.string_or_number_text();
      return python_float(v.number());
    case Json::Type::kString: return python_string(v.string());
    case Json::Type::kArray: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.array().size(); ++i) out += (i ? ", " : "") + python_repr(v.array()[i]);
      return out + "]";
    }
    case Json::Type::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& m : v.object()) {
        out += (first ? "" : ", ") + python_string(m.first) + ": " + python_repr(m.second);
        first = false;
      }
      return out + "}";
    }
  }
  return "?";
}

const Json* Config::raw(const std::string& key) const { return json.find(key); }

const Json* Config::get(const std::string& key) const {
  const Json* v = json.find(key);
  return v && !v->is_null() ? v : nullptr;
}

bool truthy(const Json* v) {
  if (!v) return false;
  switch (v->type()) {
    case Json::Type::kNull: return false;
    case Json::Type::kBool: return v->boolean();
    case Json::Type::kNumber: return v->number() != 0.0 || std::isnan(v->number());
    case Json::Type::kString: return !v->string().empty();
    case Json::Type::kArray: return !v->array().empty();
    case Json::Type::kObject: return !v->object().empty();
  }
  return false;
}

bool Config::truthy(const std::string& key) const { return arch::truthy(get(key)); }

bool Config::is_false(const std::string& key) const {
  const Json* v = get(key);
  return v && v->type() == Json::Type::kBool && !v->boolean();
}

long config_int(const Config& config, const std::string& key, const IntRule& rule) {
  const Found found = lookup(config, key, rule.aliases);
  if (!found.value) {
    if (!rule.has_default) throw std::invalid_argument(config.source + ": " + python_string(key) + " is missing");
    return rule.default_value;
  }
  const Json& v = *found.value;
  const Bound min{static_cast<double>(rule.minimum), true}, max{static_cast<double>(rule.maximum), true};
  auto fail = [&](bool with_max, const std::string& shown) {
    throw std::invalid_argument(config.source + ": " + python_string(found.key) + " must be an integer" +
                                range_text(rule.has_minimum, min, with_max && rule.has_maximum, max) + rule.note +
                                ", got " + shown);
  };
  long value = 0;
  if (v.type() != Json::Type::kNumber) fail(false, describe(v));
  if (v.is_integer_number()) {
    errno = 0;
    char* end = nullptr;
    const std::string& text = v.string_or_number_text();
    const long long parsed = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE) {  // beyond a long: below any minimum or above any maximum
      if (text[0] == '-') {
        if (rule.has_minimum) fail(false, describe(v));
      } else if (rule.has_maximum) {
        fail(true, describe(v));
      }
      throw std::invalid_argument(config.source + ": " + python_string(found.key) + " " + describe(v) +
                                  " is out of range");
    }
    value = static_cast<long>(parsed);
  } else {
    const double d = v.number();
    if (!std::isfinite(d) || d != std::floor(d)) fail(false, describe(v));
    if (std::fabs(d) >= 9.2e18) {  // Python's int(d), beyond a long: its exact digits, shortened
      char digits[400];
      std::snprintf(digits, sizeof digits, "%.0f", d);
      if (d < 0 && rule.has_minimum) fail(false, shorten(digits, kMaxLong));
      if (d > 0 && rule.has_maximum) fail(true, shorten(digits, kMaxLong));
      throw std::invalid_argument(config.source + ": " + python_string(found.key) + " " + digits + " is out of range");
    }
    value = static_cast<long>(d);
  }
  const std::string shown = std::to_string(value);
  if (rule.has_minimum && value < rule.minimum) fail(false, shown);
  if (rule.has_maximum && value > rule.maximum) fail(true, shown);
  return value;
}

double config_float(const Config& config, const std::string& key, const FloatRule& rule) {
  const Found found = lookup(config, key, rule.aliases);
  if (!found.value) {
    if (!rule.has_default) throw std::invalid_argument(config.source + ": " + python_string(key) + " is missing");
    return rule.default_value;
  }
  const Json& v = *found.value;
  const bool valid = v.type() == Json::Type::kNumber && std::isfinite(v.number()) &&
                     (!rule.has_minimum || v.number() >= rule.minimum.value) &&
                     (!rule.has_maximum || v.number() <= rule.maximum.value);
  if (!valid) {
    throw std::invalid_argument(config.source + ": " + python_string(found.key) + " must be a finite number" +
                                range_text(rule.has_minimum, rule.minimum, rule.has_maximum, rule.maximum) + ", got " +
                                describe(v));
  }
  return v.number();
}

std::string mapped(const Config& config, const std::string& key, const std::string& fallback,
                   const std::vector<std::pair<std::string, std::string>>& table, const std::string& what,
                   bool not_implemented) {
  const Json* v = config.get(key);
  const Json fallback_json = Json::make_string(fallback);
  if (!v) v = &fallback_json;
  if (v->type() == Json::Type::kString) {
    for (const auto& entry : table)
      if (entry.first == v->string()) return entry.second;
  }
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  std::string listed = "[";
  for (std::size_t i = 0; i < names.size(); ++i) listed += (i ? ", " : "") + python_string(names[i]);
  const std::string message =
      "config.json: " + key + " " + describe(*v) + " is not supported" + what + "; use one of " + listed + "]";
  if (not_implemented) throw NotSupported(message);
  throw std::invalid_argument(message);
}

void not_supported(bool condition, const std::string& message) {
  if (condition) throw NotSupported("config.json: " + message);
}

}  // namespace arch
}  // namespace cpuformer
