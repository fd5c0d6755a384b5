// A converted directory's packed-weights file: the bytes every Linear of the model packs at load,
// stored once by `cpuformer convert` (or `cpuformer pack`) for one ISA level, so that loading maps
// them (PackedWeights views, kernels/gemm/gemm.h) instead of allocating and packing. The layout of
// the bytes belongs to the level's kernels, so there is one file per level:
// cpuformer_packed.<level key>.bin, the level key naming the architecture, the level and the CPU
// features that choose another packer at that level ("x86_64-avx512+vnni+bf16"). Format
// (docs/precision.md, "Packed weights"), little-endian:
//
//   [0, 8)    magic "CFPACKED"
//   [8, 16)   index offset (u64)    [16, 24) index bytes (u64)    [24, 64) zero
//   [64, ...) the packed matrices, each at a 64-byte aligned offset
//   index     JSON: {"format_version", "layout_version" (gemm.h kPackedLayoutVersion), "level",
//             "probes": {format: hash of the level's packing of a fixed probe matrix},
//             "weights": fingerprint of model.safetensors, "matrices": [{"key", "n", "k", "type",
//             "group_size", "zero_point", "offset", "bytes"}, ...]}
//
// A damaged file (truncated, bad magic or index, a matrix out of range or of a size that is not
// its shape's) is std::invalid_argument naming the file. A file whose weights fingerprint, format,
// layout version or probes differ from this build's is stale: not used, with a warning.
#pragma once

#include <cstddef>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "layers/linear.h"

namespace cpuformer::io {

constexpr long kPackedFormatVersion = 1;

// The running level's key ("x86_64-avx512+vnni+bf16", "aarch64-i8mm", "x86_64-scalar") and its
// file name in a converted directory ("cpuformer_packed.<key>.bin").
std::string packed_level_key();
std::string packed_file_name();
// model.safetensors' size and a hash of its header and of 16 samples of 4 KiB spread over its data:
// "<bytes>:<16 hex digits>". std::invalid_argument naming the path when it cannot be read.
std::string weights_fingerprint(const std::string& safetensors_path);

// A packed-weights file mapped for the running level (a PackedWeightsStore: find() hands out views
// of the mapping, which stays mapped while any view lives).
class PackedFile : public PackedWeightsStore {
 public:
  struct Opened {
    std::shared_ptr<PackedFile> file;  // null: none for this level, or stale (see warning)
    std::string warning;               // why an existing file is not used ("" if none)
  };
  // `directory`'s file for the running level, checked against its model.safetensors.
  static Opened open_directory(const std::string& directory);
  // The file at `path` for weights with fingerprint `weights` (weights_fingerprint).
  static Opened open(const std::string& path, const std::string& weights);

  bool find(const std::string& key, long n, long k, const WeightFormat& format, PackedWeights& out) override;
  void packed(const std::string&, const PackedWeights&) override {}

  const std::string& path() const { return path_; }
  long matrices() const { return static_cast<long>(entries_.size()); }
  long used() const { return used_; }  // find() calls that returned a view

  struct Entry {
    long n = 0, k = 0;
    WeightFormat format;
    std::size_t offset = 0, bytes = 0;
  };

 private:
  std::string path_;
  std::shared_ptr<const void> map_;  // the mapping; munmapped when the last view is gone
  const uint8_t* base_ = nullptr;
  std::map<std::string, Entry> entries_;
  long used_ = 0;
};

// Writes a packed-weights file for the running level while a model is built from a converted
// directory (the store records every Linear it packs), then its index (finish()).
class PackedFileWriter : public PackedWeightsStore {
 public:
  // Creates (truncates) `path`; `weights`: the fingerprint of the directory's model.safetensors.
  PackedFileWriter(const std::string& path, std::string weights);
  ~PackedFileWriter() override;
  PackedFileWriter(const PackedFileWriter&) = delete;
  PackedFileWriter& operator=(const PackedFileWriter&) = delete;

  bool find(const std::string&, long, long, const WeightFormat&, PackedWeights&) override { return false; }
  void packed(const std::string& key, const PackedWeights& w) override;
  // Writes the index and the header and closes the file (std::runtime_error on a write error).
  void finish();
  long matrices() const { return static_cast<long>(keys_.size()); }

 private:
  using Entry = PackedFile::Entry;
  void write(const void* data, std::size_t bytes);

  std::string path_, weights_;
  std::FILE* out_ = nullptr;
  std::size_t offset_ = 0;
  std::vector<std::pair<std::string, Entry>> keys_;
  std::set<std::string> formats_;  // the formats written (their probes go into the index)
};

}  // namespace cpuformer::io
