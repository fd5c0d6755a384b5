// Native tests of the C API's file readers (csrc/io): the strict JSON parser (valid documents,
// escapes and surrogate pairs, numbers, big integers, every syntax error and its message, the
// nesting limit, accessors and their type errors) and the safetensors reader (files of several
// dtypes with their data checked, every header error, missing/empty/directory paths, release()).
// Files are written into a mkdtemp directory that is removed at the end.
//
// Output: one line per failed check and a summary. Exit status 0 when every check passed, 1 otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"

namespace {

using cpuformer::io::Json;
using cpuformer::io::SafetensorsFile;

int g_checks = 0;
int g_failures = 0;

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// Checks that fn throws std::invalid_argument whose message contains `needle`.
void expect_throws(const std::function<void()>& fn, const std::string& needle, const std::string& what) {
  ++g_checks;
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      ++g_failures;
      std::printf("FAIL %s: message '%s' lacks '%s'\n", what.c_str(), e.what(), needle.c_str());
    }
    return;
  } catch (const std::exception& e) {
    ++g_failures;
    std::printf("FAIL %s: threw another exception: %s\n", what.c_str(), e.what());
    return;
  }
  ++g_failures;
  std::printf("FAIL %s: did not throw\n", what.c_str());
}

void expect_json_error(const std::string& text, const std::string& needle) {
  expect_throws([&] { Json::parse(text); }, needle, "parse(" + text.substr(0, 40) + ")");
}

// Runs fn, recording a failure (with the exception) if it throws.
void expect_no_throw(const std::function<void()>& fn, const std::string& what) {
  ++g_checks;
  try {
    fn();
  } catch (const std::exception& e) {
    ++g_failures;
    std::printf("FAIL %s: threw %s\n", what.c_str(), e.what());
  }
}

// ---- JSON ----

void test_json_values() {
  expect_no_throw(
      [] {
        const Json j = Json::parse(
            " {\"a\": [1, 2.5, -0, true, false, null, \"s\"], \"b\": {\"c\": {}}, \"d\": [], \"e\": \"\"} \n");
        expect(j.type() == Json::Type::kObject && j.size() == 4, "object of 4");
        const auto& a = j.at("a").array();
        expect(a.size() == 7, "array of 7");
        expect(a[0].integer() == 1 && a[0].number() == 1.0, "1");
        expect(a[1].number() == 2.5, "2.5");
        expect(a[2].number() == 0.0 && std::signbit(a[2].number()) && a[2].integer() == 0, "-0");
        expect(a[3].boolean() && !a[4].boolean(), "true/false");
        expect(a[5].is_null() && a[5].type() == Json::Type::kNull, "null");
        expect(a[6].string() == "s", "string");
        expect(j.at("b").at("c").size() == 0 && j.at("b").at("c").type() == Json::Type::kObject, "nested {}");
        expect(j.at("d").size() == 0, "[]");
        expect(j.at("e").string().empty() && j.at("e").size() == 0, "empty string");
        expect(j.find("zz") == nullptr, "find absent");
        expect(a[0].find("a") == nullptr, "find on a number");
        expect(j.object()[0].first == "a" && j.object()[3].first == "e", "insertion order");
      },
      "valid document");
  // Scalars as documents, whitespace around.
  expect_no_throw([] { expect(Json::parse("\t\r\n 3 ").integer() == 3, "scalar document"); }, "scalar doc");
  expect_no_throw([] { expect(Json::parse("null").is_null(), "null document"); }, "null doc");
  // Duplicate keys: the last wins, in the position of the first (Python's dict).
  expect_no_throw(
      [] {
        const Json j = Json::parse("{\"k\": 1, \"x\": 0, \"k\": 2}");
        expect(j.size() == 2 && j.at("k").integer() == 2 && j.object()[0].first == "k", "duplicate key: last wins");
      },
      "duplicate keys");
  // Nesting: 64 levels parse, 65 do not.
  expect_no_throw(
      [] {
        const Json j = Json::parse(std::string(64, '[') + std::string(64, ']'));
        const Json* p = &j;
        int depth = 0;
        while (p->type() == Json::Type::kArray && p->size() > 0) {
          p = &p->array()[0];
          ++depth;
        }
        expect(depth == 63, "64 nested arrays");
      },
      "depth 64");
  expect_json_error(std::string(65, '[') + std::string(65, ']'), "nesting deeper than 64 at offset 64");
  std::string objects;
  for (int i = 0; i < 65; ++i) objects += "{\"a\":";
  objects += "1" + std::string(65, '}');
  expect_json_error(objects, "nesting deeper than 64");
  // A very deep document fails at the limit instead of overflowing the stack.
  expect_json_error(std::string(1000000, '['), "nesting deeper than 64");
}

void test_json_strings() {
  expect_no_throw(
      [] {
        const Json j =
            Json::parse(R"(["\"\\\/\b\f\n\r\t", "\u0041\u00e9\u20AC", "\ud83d\ude00", "\u0000x", "h\u00C9llo"])");
        const auto& a = j.array();
        expect(a[0].string() == "\"\\/\b\f\n\r\t", "simple escapes");
        expect(a[1].string() == "A\xC3\xA9\xE2\x82\xAC", "\\u to 1, 2 and 3 UTF-8 bytes");
        expect(a[2].string() == "\xF0\x9F\x98\x80", "surrogate pair to 4 UTF-8 bytes");
        expect(a[3].string() == std::string("\0x", 2) && a[3].size() == 2, "\\u0000 kept");
        expect(a[4].string() == "h\xC3\x89llo", "upper-case hex");
      },
      "string escapes");
  // Raw UTF-8 passes through.
  expect_no_throw([] { expect(Json::parse("\"\xE2\x82\xAC\"").string() == "\xE2\x82\xAC", "raw UTF-8"); }, "raw");
  expect_json_error(R"("abc)", "unterminated string at offset 0");
  expect_json_error(R"(["abc\")", "unterminated string at offset 1");
  expect_json_error("\"a\nb\"", "control character in string at offset 2");
  expect_json_error(std::string("\"a\x01\""), "control character in string");
  expect_json_error("\"a\tb\"", "control character in string");
  expect_json_error(R"("\x")", "invalid escape in string at offset 1");
  expect_json_error(R"("\u12xy")", "invalid hex digit in \\u escape at offset 3");
  expect_json_error(R"("\u12G4")", "invalid hex digit");
  expect_json_error(R"("\u12)", "truncated \\u escape");
  expect_json_error(R"("\ud83d")", "high surrogate not followed by a low surrogate");
  expect_json_error(R"("\ud83dx")", "high surrogate not followed by a low surrogate");
  expect_json_error(R"("\ud83d\u0041")", "high surrogate not followed by a low surrogate");
  expect_json_error(R"("\ude00")", "lone low surrogate");
  expect_json_error("'a'", "unexpected character");
}

void test_json_numbers() {
  expect_no_throw(
      [] {
        const Json j = Json::parse(
            "[-0, 0, 1e308, 1E-7, -12.5e+2, 9007199254740993, -9223372036854775808, 9223372036854775807, 0.5, 1e400]");
        const auto& a = j.array();
        expect(a[0].number() == 0.0 && std::signbit(a[0].number()), "-0 is negative zero");
        expect(a[1].integer() == 0, "0");
        expect(a[2].number() == 1e308, "1e308");
        expect(a[3].number() == 1e-7, "1E-7");
        expect(a[4].number() == -1250.0, "-12.5e+2");
        expect(a[5].integer() == 9007199254740993L, "2^53 + 1 exact through integer()");
        expect(a[6].integer() == std::numeric_limits<long>::min(), "LONG_MIN");
        expect(a[7].integer() == std::numeric_limits<long>::max(), "LONG_MAX");
        expect(a[8].number() == 0.5, "0.5");
        expect(std::isinf(a[9].number()), "1e400 is inf (as Python's json)");
      },
      "numbers");
  expect_throws([] { Json::parse("9223372036854775808").integer(); }, "out of range", "LONG_MAX + 1");
  expect_throws([] { Json::parse("-9223372036854775809").integer(); }, "out of range", "LONG_MIN - 1");
  expect_throws([] { Json::parse("1.0").integer(); }, "expected an integer, got 1.0", "1.0 not an integer");
  expect_throws([] { Json::parse("1e3").integer(); }, "expected an integer", "1e3 not an integer");
  expect_json_error("01", "invalid number (leading zero) at offset 0");
  expect_json_error("-01", "leading zero");
  expect_json_error("1.", "no digits after '.'");
  expect_json_error("1.e5", "no digits after '.'");
  expect_json_error(".5", "unexpected character");
  expect_json_error("+1", "unexpected character");
  expect_json_error("-", "invalid number");
  expect_json_error("-a", "invalid number");
  expect_json_error("1e", "no digits in exponent");
  expect_json_error("1e+", "no digits in exponent");
  expect_json_error("NaN", "unexpected character");
  expect_json_error("Infinity", "unexpected character");
  expect_json_error("-Infinity", "invalid number");
  expect_json_error("[1, NaN]", "unexpected character, expected a value at offset 4");
  expect_json_error("0x10", "trailing characters");
  expect_json_error("1 2", "trailing characters after the value at offset 2");
}

// parse_python: the strict grammar plus NaN, Infinity and -Infinity, as Python's json reads them.
void test_json_python_numbers() {
  const Json j = Json::parse_python("[NaN, Infinity, -Infinity, 1, -2.5e1]");
  const Json::Array& a = j.array();
  expect(a.size() == 5, "five values");
  expect(std::isnan(a[0].number()) && a[0].string_or_number_text() == "nan", "NaN -> nan");
  expect(std::isinf(a[1].number()) && a[1].number() > 0 && a[1].string_or_number_text() == "inf", "Infinity");
  expect(std::isinf(a[2].number()) && a[2].number() < 0 && a[2].string_or_number_text() == "-inf", "-Infinity");
  expect(!a[0].is_integer_number() && !a[1].is_integer_number() && !a[2].is_integer_number(), "not integers");
  expect(a[3].integer() == 1 && a[4].number() == -25.0, "plain numbers unchanged");
  expect_throws([&] { a[0].integer(); }, "expected an integer, got nan", "integer() of NaN");
  expect_throws([&] { a[2].integer(); }, "expected an integer, got -inf", "integer() of -Infinity");
  for (const char* bad : {"nan", "NAN", "Inf", "-Inf", "+Infinity", "NaN1", "-NaN", "Infinit"}) {
    expect_throws([&] { Json::parse_python(bad); }, "JSON:", std::string("parse_python(") + bad + ")");
  }
  expect_json_error("NaN", "unexpected character");  // parse() stays strict
}

void test_json_syntax() {
  expect_json_error("", "unexpected end of input");
  expect_json_error("   ", "unexpected end of input, expected a value at offset 3");
  expect_json_error("[1, 2", "unterminated array");
  expect_json_error("[1,", "unexpected end of input");
  expect_json_error("[1,]", "unexpected character");
  expect_json_error("[1 2]", "expected ',' or ']'");
  expect_json_error("{\"a\": 1", "unterminated object");
  expect_json_error("{\"a\" 1}", "expected ':'");
  expect_json_error("{a: 1}", "expected a string key");
  expect_json_error("{\"a\": 1,}", "expected a string key");
  expect_json_error("{\"a\": 1 \"b\": 2}", "expected ',' or '}'");
  expect_json_error("{", "unterminated object");
  expect_json_error("tru", "invalid literal at offset 0");
  expect_json_error("nul", "invalid literal");
  expect_json_error("True", "unexpected character");
  expect_json_error("[true false]", "expected ',' or ']'");
  expect_json_error("{} {}", "trailing characters");
  expect_json_error("[]]", "trailing characters");
  expect_json_error(std::string("[1]\0", 4), "trailing characters");
}

void test_json_accessors() {
  const Json j = Json::parse(R"({"n": 1, "s": "x", "a": [1], "o": {}, "b": true, "z": null})");
  expect_throws([&] { j.at("n").string(); }, "expected string, got number", "string() of a number");
  expect_throws([&] { j.at("s").number(); }, "expected number, got string", "number() of a string");
  expect_throws([&] { j.at("s").integer(); }, "expected number, got string", "integer() of a string");
  expect_throws([&] { j.at("a").object(); }, "expected object, got array", "object() of an array");
  expect_throws([&] { j.at("o").array(); }, "expected array, got object", "array() of an object");
  expect_throws([&] { j.at("z").boolean(); }, "expected bool, got null", "boolean() of null");
  expect_throws([&] { j.at("b").size(); }, "size() of a bool", "size() of a bool");
  expect_throws([&] { j.at("missing"); }, "JSON: missing key 'missing'", "at() of a missing key");
  expect_throws([&] { j.at("a").at("k"); }, "expected object, got array", "at() on an array");
  expect(j.at("a").size() == 1 && j.at("s").size() == 1 && j.size() == 6, "size()");
  expect(std::string(Json::type_name(Json::Type::kObject)) == "object", "type_name");
}

// ---- safetensors ----

std::string g_dir;

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = g_dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return path;
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file with the given header text and data section.
std::string st_file(const std::string& name, const std::string& header, const std::string& data) {
  return write_file(name, le64(header.size()) + header + data);
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_st_error(const std::string& header, const std::string& data, const std::string& needle) {
  const std::string path = st_file("bad.safetensors", header, data);
  expect_throws([&] { SafetensorsFile::open(path); }, path + ": " + needle, "open(" + header.substr(0, 60) + ")");
}

void test_safetensors_valid() {
  const std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 1e-3f, 7.0f, -0.0f};
  const std::vector<std::uint16_t> bf16 = {0x3F80, 0xC020, 0x0000};  // 1, -2.5, 0
  const std::vector<std::int64_t> i64 = {-1, std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::uint8_t> u8 = {0, 1, 255, 1, 0};
  const std::vector<double> f64 = {3.141592653589793};
  std::string data = raw(f32) + raw(bf16) + raw(i64) + raw(u8) + raw(f64);
  const std::size_t o1 = 24, o2 = o1 + 6, o3 = o2 + 16, o4 = o3 + 5, o5 = o4 + 8;
  // Offsets need not be aligned nor in header order; the header may be padded with spaces.
  const std::string header =
      "{\"__metadata__\": {\"format\": \"pt\"}, \"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], "
      "\"data_offsets\": [0, 24]}, \"b\": {\"dtype\": \"BF16\", \"shape\": [3], "
      "\"data_offsets\": [" +
      std::to_string(o1) + ", " + std::to_string(o2) +
      "]}, \"ids\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [" + std::to_string(o2) + ", " +
      std::to_string(o3) + "]}, \"mask\": {\"dtype\": \"BOOL\", \"shape\": [5, 1], \"data_offsets\": [" +
      std::to_string(o3) + ", " + std::to_string(o4) +
      "]}, \"pi\": {\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [" + std::to_string(o4) + ", " +
      std::to_string(o5) + "]}, \"empty\": {\"dtype\": \"U16\", \"shape\": [0, 4], \"data_offsets\": [" +
      std::to_string(o5) + ", " + std::to_string(o5) + "]}}       ";
  const std::string path = st_file("ok.safetensors", header, data);
  expect_no_throw(
      [&] {
        SafetensorsFile file = SafetensorsFile::open(path);
        expect(file.path() == path, "path()");
        const auto& e = file.entries();
        expect(e.size() == 6, "6 entries, __metadata__ skipped");
        const char* names[] = {"w", "b", "ids", "mask", "pi", "empty"};
        for (std::size_t i = 0; i < e.size() && i < 6; ++i) expect(e[i].name == names[i], "header order");
        const auto* w = file.find("w");
        expect(w != nullptr && w->dtype == "F32" && w->shape == std::vector<long>{2, 3} && w->nbytes == 24 &&
                   std::memcmp(w->data, f32.data(), 24) == 0,
               "F32 entry");
        const auto* b = file.find("b");
        expect(b != nullptr && b->dtype == "BF16" && b->nbytes == 6 && std::memcmp(b->data, bf16.data(), 6) == 0,
               "BF16 entry");
        const auto* ids = file.find("ids");
        std::int64_t ids_got[2];
        if (ids != nullptr) std::memcpy(ids_got, ids->data, 16);
        expect(ids != nullptr && ids->nbytes == 16 && ids_got[0] == -1 && ids_got[1] == i64[1], "I64 entry");
        const auto* mask = file.find("mask");
        expect(mask != nullptr && mask->dtype == "BOOL" && mask->shape == std::vector<long>{5, 1} &&
                   std::memcmp(mask->data, u8.data(), 5) == 0,
               "BOOL entry");
        const auto* pi = file.find("pi");
        double pi_got = 0;
        if (pi != nullptr) std::memcpy(&pi_got, pi->data, 8);
        expect(pi != nullptr && pi->shape.empty() && pi->nbytes == 8 && pi_got == f64[0], "F64 scalar");
        const auto* empty = file.find("empty");
        expect(empty != nullptr && empty->nbytes == 0 && empty->shape == std::vector<long>{0, 4}, "empty U16");
        expect(file.find("nope") == nullptr && file.find("__metadata__") == nullptr, "find absent");

        // Move: the new owner keeps the mapping; the moved-from object is empty and destructs safely.
        SafetensorsFile moved(std::move(file));
        expect(moved.entries().size() == 6 && file.entries().empty() && file.find("w") == nullptr, "move construction");
        SafetensorsFile other = SafetensorsFile::open(path);
        other = std::move(moved);
        expect(other.find("w") != nullptr && std::memcmp(other.find("w")->data, f32.data(), 24) == 0,
               "move assignment");
        expect_throws([&] { moved.release(*other.find("w")); }, "entry of another file", "release foreign entry");
        for (const auto& entry : other.entries()) other.release(entry);
        expect(std::memcmp(other.find("w")->data, f32.data(), 24) == 0, "data readable after release()");
      },
      "valid file");

  // A tensor spanning many pages: release() drops its whole pages, the data reads back the same.
  std::vector<float> big(3 * 4096 + 7);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  const std::string big_header = "{\"x\": {\"dtype\": \"F32\", \"shape\": [" + std::to_string(big.size()) +
                                 "], \"data_offsets\": [0, " + std::to_string(big.size() * 4) + "]}}";
  const std::string big_path = st_file("big.safetensors", big_header, raw(big));
  expect_no_throw(
      [&] {
        SafetensorsFile file = SafetensorsFile::open(big_path);
        const auto* x = file.find("x");
        expect(x != nullptr && std::memcmp(x->data, big.data(), big.size() * 4) == 0, "big tensor");
        file.release(*x);
        expect(std::memcmp(x->data, big.data(), big.size() * 4) == 0, "big tensor re-read after release()");
      },
      "big file");

  // Every accepted dtype, one element each.
  const char* dtypes[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "U16", "U32", "U64"};
  const std::size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 2, 4, 8};
  for (int i = 0; i < 13; ++i) {
    expect(SafetensorsFile::dtype_size(dtypes[i]) == sizes[i], std::string("dtype_size ") + dtypes[i]);
    const std::string h = std::string("{\"t\": {\"dtype\": \"") + dtypes[i] +
                          "\", \"shape\": [1], \"data_offsets\": [0, " + std::to_string(sizes[i]) + "]}}";
    const std::string p = st_file("dtype.safetensors", h, std::string(sizes[i], '\x01'));
    expect_no_throw([&] { expect(SafetensorsFile::open(p).find("t")->nbytes == sizes[i], "nbytes"); },
                    std::string("dtype ") + dtypes[i]);
  }
  expect(SafetensorsFile::dtype_size("F8") == 0, "dtype_size unknown");
  // A name given twice: the last entry wins (as in Python's json), in the first one's position.
  const std::string dup = st_file("dup.safetensors",
                                  "{\"t\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, \"u\": "
                                  "{\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, \"t\": "
                                  "{\"dtype\": \"I16\", \"shape\": [1], \"data_offsets\": [1, 3]}}",
                                  "abc");
  expect_no_throw(
      [&] {
        SafetensorsFile file = SafetensorsFile::open(dup);
        expect(file.entries().size() == 2 && file.entries()[0].name == "t" && file.find("t")->dtype == "I16" &&
                   std::memcmp(file.find("t")->data, "bc", 2) == 0,
               "duplicate tensor name: the last wins");
      },
      "duplicate tensor name");
  // Ranges out of header order, empty tensors between two others and after the last: they tile
  // the data section (the safetensors library reads this file too).
  const std::string tiled =
      st_file("tiled.safetensors",
              "{\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [1, 3]}, \"e\": "
              "{\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [1, 1]}, \"a\": {\"dtype\": "
              "\"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, \"f\": {\"dtype\": \"F16\", "
              "\"shape\": [3, 0], \"data_offsets\": [3, 3]}}",
              "abc");
  expect_no_throw(
      [&] {
        SafetensorsFile file = SafetensorsFile::open(tiled);
        expect(file.entries().size() == 4 && std::memcmp(file.find("b")->data, "bc", 2) == 0 &&
                   std::memcmp(file.find("a")->data, "a", 1) == 0 && file.find("e")->nbytes == 0 &&
                   file.find("f")->nbytes == 0,
               "tiled ranges out of order");
      },
      "tiled ranges");
  // No tensors at all.
  const std::string none = st_file("none.safetensors", "{}", "");
  expect_no_throw([&] { expect(SafetensorsFile::open(none).entries().empty(), "{} has no entries"); }, "{}");
}

void test_safetensors_errors() {
  const std::string missing = g_dir + "/missing.safetensors";
  expect_throws([&] { SafetensorsFile::open(missing); }, missing + ": no such file", "missing file");
  expect_throws([&] { SafetensorsFile::open(missing + "/x"); }, ": no such file", "missing directory");
  expect_throws([&] { SafetensorsFile::open(g_dir); }, g_dir + ": is a directory", "a directory");
  const std::string fifo = g_dir + "/fifo";
  if (::mkfifo(fifo.c_str(), 0600) == 0) {
    expect_throws([&] { SafetensorsFile::open(fifo); }, fifo + ": not a regular file", "a FIFO");
  }
  const std::string empty = write_file("empty.safetensors", "");
  expect_throws([&] { SafetensorsFile::open(empty); }, "is 0 bytes, shorter than the 8-byte header length",
                "empty file");
  const std::string seven = write_file("seven.safetensors", std::string(7, '\0'));
  expect_throws([&] { SafetensorsFile::open(seven); }, "is 7 bytes", "7-byte file");

  const std::string big_n = write_file("bign.safetensors", le64(100) + "{}");
  expect_throws([&] { SafetensorsFile::open(big_n); }, "header length 100 exceeds the file (10 bytes)",
                "N beyond the file");
  const std::string huge_n = write_file("hugen.safetensors", le64(100000001) + "{}");
  expect_throws([&] { SafetensorsFile::open(huge_n); }, "exceeds the 100 MB limit", "N over 100 MB");
  const std::string max_n = write_file("maxn.safetensors", le64(~0ull) + "{}");
  expect_throws([&] { SafetensorsFile::open(max_n); }, "exceeds the 100 MB limit", "N = 2^64 - 1");

  expect_st_error("[]", "", "header is a JSON array, not an object");
  expect_st_error("{\"a\": 1", "", "header: JSON: unterminated object");
  expect_st_error("{} x", "", "header: JSON: trailing characters");
  expect_st_error("", "", "header: JSON: unexpected end of input");
  expect_st_error("{\"__metadata__\": []}", "", "__metadata__ is not an object");
  expect_st_error("{\"__metadata__\": {\"k\": 1}}", "", "__metadata__ 'k' is not a string");
  expect_st_error("{\"t\": []}", "", "tensor 't': entry is not an object");
  expect_st_error("{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd", "tensor 't': no dtype");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", "abcd", "tensor 't': no shape");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", "abcd", "tensor 't': no data_offsets");
  expect_st_error("{\"t\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': dtype is not a string");
  expect_st_error("{\"t\": {\"dtype\": \"F8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", "a",
                  "tensor 't': unknown dtype 'F8'");
  expect_st_error("{\"t\": {\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': unknown dtype 'f32'");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape is not an array");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': negative dimension -1");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape holds a dimension that is not an integer");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape holds a dimension that is not an integer");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape holds a dimension that is not an integer");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape holds a dimension that is not an integer");
  expect_st_error("{\"t\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape product overflows");
  expect_st_error("{\"t\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': shape product overflows");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", "abcd",
                  "tensor 't': data_offsets is not two integers");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", "abcdefgh",
                  "tensor 't': data_offsets is not two integers");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"a\": 0, \"b\": 4}}}", "abcd",
                  "tensor 't': data_offsets is not two integers");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4.0]}}", "abcd",
                  "tensor 't': data_offsets is not two integers");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", "abcd",
                  "tensor 't': data_offsets is not two integers");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", "abcdefgh",
                  "tensor 't': data_offsets [8, 4] is not 0 <= begin <= end");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", "abcd",
                  "tensor 't': data_offsets [-4, 0] is not 0 <= begin <= end");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", "abcd",
                  "tensor 't': data_offsets end 8 is beyond the data section (4 bytes)");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", "abcd",
                  "tensor 't': data_offsets span 4 bytes, but dtype F32 and shape give 8");
  expect_st_error("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 2]}}", "abcd",
                  "tensor 't': data_offsets span 2 bytes, but dtype F32 and shape give 4");
  // The second entry is the bad one: the first must not leak (ASan) and the message names the second.
  expect_st_error(
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, \"b\": {\"dtype\": \"U8\", \"shape\": "
      "[2], \"data_offsets\": [1, 2]}}",
      "ab", "tensor 'b': data_offsets span 1 bytes");

  // The layout rule of the safetensors library: the ranges tile the data section exactly.
  const std::string u8 = "{\"dtype\": \"U8\", \"shape\": [";
  expect_st_error("{\"a\": " + u8 + "2], \"data_offsets\": [0, 2]}, \"b\": " + u8 + "2], \"data_offsets\": [4, 6]}}",
                  "abcdef",
                  "bytes [2, 4) of the data section belong to no tensor (a gap before tensor 'b'); the tensors must "
                  "cover the data section exactly");
  expect_st_error("{\"a\": " + u8 + "2], \"data_offsets\": [1, 3]}}", "abc",
                  "bytes [0, 1) of the data section belong to no tensor (a gap before tensor 'a')");
  expect_st_error("{\"a\": " + u8 + "2], \"data_offsets\": [0, 2]}}", "abcd",
                  "bytes [2, 4) of the data section belong to no tensor (after the last one); the tensors must "
                  "cover the data section exactly");
  expect_st_error("{}", "ab", "bytes [0, 2) of the data section belong to no tensor (after the last one)");
  expect_st_error("{\"a\": " + u8 + "2], \"data_offsets\": [0, 2]}, \"e\": " + u8 + "0], \"data_offsets\": [3, 3]}}",
                  "abc", "bytes [2, 3) of the data section belong to no tensor (a gap before tensor 'e')");
  expect_st_error("{\"a\": " + u8 + "4], \"data_offsets\": [0, 4]}, \"b\": " + u8 + "2], \"data_offsets\": [3, 5]}}",
                  "abcde", "tensors 'a' and 'b' overlap: 'b' begins at byte 3, before 'a' ends at byte 4");
  expect_st_error("{\"b\": " + u8 + "2], \"data_offsets\": [0, 2]}, \"a\": " + u8 + "2], \"data_offsets\": [0, 2]}}",
                  "ab", "tensors 'b' and 'a' overlap: 'a' begins at byte 0, before 'b' ends at byte 2");
  // An empty tensor strictly inside another's range overlaps it (the library: "invalid offset").
  expect_st_error("{\"a\": " + u8 + "4], \"data_offsets\": [0, 4]}, \"e\": " + u8 + "0], \"data_offsets\": [2, 2]}}",
                  "abcd", "tensors 'a' and 'e' overlap: 'e' begins at byte 2, before 'a' ends at byte 4");
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/cpuformer-io-tests.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::printf("error: mkdtemp failed\n");
    return 1;
  }
  g_dir = tmpl;
  try {
    test_json_values();
    test_json_strings();
    test_json_numbers();
    test_json_python_numbers();
    test_json_syntax();
    test_json_accessors();
    test_safetensors_valid();
    test_safetensors_errors();
  } catch (const std::exception& e) {
    ++g_failures;
    std::printf("FAIL unexpected exception: %s\n", e.what());
  }
  const std::string rm = "rm -rf '" + g_dir + "'";
  if (std::system(rm.c_str()) != 0) std::printf("warning: could not remove %s\n", g_dir.c_str());
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
