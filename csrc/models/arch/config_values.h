// Reading Hugging Face config.json values for the architecture registry (models/arch/arch.h), with
// the rules and messages of the Python package's config readers (python/cpuformer/_model_dir.py:
// config_int, config_float): a missing or null key is absent; aliases that disagree are refused;
// integers may be written as integral floats (768.0); messages show values as Python's repr does
// ("config.json: 'hidden_size' must be an integer >= 1, got -3"). A bad value is
// std::invalid_argument (ValueError in Python); a valid setting cpuformer does not run is
// NotSupported (NotImplementedError).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "io/json.h"

namespace cpuformer {
namespace arch {

using io::Json;

// Python's repr of a value, shortened like the Python package's messages (reprlib: strings and
// other values to 200 characters, integers to 60 digits, 8 list items, 4 object members, 3 levels).
std::string describe(const Json& value);
// Python's repr of a value, in full (str() of a non-string value; dicts in insertion order).
std::string python_repr(const Json& value);
// repr(float(v)) as Python prints it ("1e-05", "768.0", "inf").
std::string python_float(double v);
// repr(str) as Python prints it ('abc', "it's").
std::string python_string(const std::string& s);

// One JSON object of config values and the name its messages start with.
struct Config {
  const Json& json;
  std::string source = "config.json";

  // The member `key`, or nullptr when it is absent (a null member is returned: Python's `key in`).
  const Json* raw(const std::string& key) const;
  // The member when present and not null, else nullptr (Python's `config.get(key) is not None`).
  const Json* get(const std::string& key) const;
  // Python truthiness of config.get(key): absent, null, false, 0, "", [] and {} are false.
  bool truthy(const std::string& key) const;
  // config.get(key) is False (exactly the JSON false).
  bool is_false(const std::string& key) const;
};

// Python truthiness of a value (nullptr: absent).
bool truthy(const Json* value);

// A range limit, printed as Python prints the number the rule was written with (1, 0.0, 1e-09).
struct Bound {
  double value;
  bool integer;
};

struct IntRule {
  bool has_default = false;
  long default_value = 0;
  bool has_minimum = true;
  long minimum = 1;
  bool has_maximum = true;
  long maximum = 1L << 31;
  std::vector<std::string> aliases;
  std::string note;  // appended to the range in the message: why the bound is what it is

  IntRule& otherwise(long v) {
    has_default = true;
    default_value = v;
    return *this;
  }
  IntRule& at_least(long v) {
    minimum = v;
    return *this;
  }
  IntRule& unbounded_below() {
    has_minimum = false;
    return *this;
  }
  IntRule& alias(std::string name) {
    aliases.push_back(std::move(name));
    return *this;
  }
};

struct FloatRule {
  bool has_default = false;
  double default_value = 0.0;
  bool has_minimum = false;
  Bound minimum{0.0, false};
  bool has_maximum = false;
  Bound maximum{0.0, false};
  std::vector<std::string> aliases;

  FloatRule& otherwise(double v) {
    has_default = true;
    default_value = v;
    return *this;
  }
  FloatRule& at_least(double v, bool integer = false) {
    has_minimum = true;
    minimum = {v, integer};
    return *this;
  }
  FloatRule& alias(std::string name) {
    aliases.push_back(std::move(name));
    return *this;
  }
};

// config[key] (or an alias) as an integer in the rule's range; the default when absent or null,
// else "config.json: 'key' is missing".
long config_int(const Config& config, const std::string& key, const IntRule& rule = IntRule());
// config[key] as a finite number in the rule's range (integers accepted).
double config_float(const Config& config, const std::string& key, const FloatRule& rule = FloatRule());

// table[config[key]] (`fallback` when absent or null); otherwise "config.json: key 'v' is not
// supported<what>; use one of [sorted table keys]", as std::invalid_argument, or NotSupported when
// `not_implemented`.
std::string mapped(const Config& config, const std::string& key, const std::string& fallback,
                   const std::vector<std::pair<std::string, std::string>>& table, const std::string& what = "",
                   bool not_implemented = false);

// NotSupported("config.json: <message>") when `condition` holds.
void not_supported(bool condition, const std::string& message);

}  // namespace arch
}  // namespace cpuformer
