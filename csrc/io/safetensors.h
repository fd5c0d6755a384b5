// A read-only safetensors file reader for the C API: the file is memory-mapped (PROT_READ,
// MAP_PRIVATE) and its header validated in full at open(), so every Entry's data pointer and byte
// count are in bounds and consistent with its dtype and shape. Layout: an 8-byte little-endian header
// length N, N bytes of a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// optional "__metadata__": {string: string}}, then the data section (offsets are relative to it).
// As in the `safetensors` library, the tensors' ranges must tile the data section exactly: no
// overlap, no gap, no byte after the last tensor (python/cpuformer/_model_dir.py: the same rule).
// Every problem is a std::invalid_argument naming the path and what is wrong.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

namespace cpuformer::io {

class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    std::string dtype;        // "F64" "F32" "F16" "BF16" "I64" "I32" "I16" "I8" "U8" "BOOL" "U16" "U32" "U64"
    std::vector<long> shape;  // each dim >= 0; [] is a scalar (one element)
    const void* data;         // into the mapping; valid while the file object lives
    std::size_t nbytes;       // product(shape) * element size
  };

  static constexpr std::size_t kMaxHeaderBytes = 100u * 1000u * 1000u;  // 100 MB

  // Maps and validates `path`. Throws std::invalid_argument "<path>: <what>", e.g. "<path>: no such
  // file", "<path>: is a directory", "<path>: not a regular file", "<path>: tensor 'w': unknown
  // dtype 'X'".
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();  // munmaps: every Entry::data pointer dies with it

  const Entry* find(const std::string& name) const;  // nullptr if absent
  const std::vector<Entry>& entries() const { return entries_; }  // in header order
  const std::string& path() const { return path_; }

  // Element size in bytes of a dtype name, 0 for an unknown one.
  static std::size_t dtype_size(const std::string& dtype);

  // Gives the pages lying wholly inside the entry's data back to the kernel (madvise
  // MADV_DONTNEED) once the caller has converted or copied them: the file is mapped MAP_PRIVATE and
  // never written, so the pages are clean and a later read of entry.data reads them again from the
  // file (the data stays valid, it just costs I/O). Partial pages at either end, shared with the
  // neighbouring tensors, are kept. Advisory: a failing madvise is ignored. `entry` must be one of
  // this file's entries (std::invalid_argument otherwise).
  void release(const Entry& entry) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, std::size_t> index_;  // name -> position in entries_
};

// The weights of a model directory: model.safetensors, or else the shards that
// model.safetensors.index.json names ({"weight_map": {tensor: shard file}}), as the Python loader
// reads them (python/cpuformer/_model_dir.py): every tensor of every shard, a name in two shards
// refused, each weight_map entry checked against its shard. Errors are std::invalid_argument naming
// the file.
class SafetensorsSet {
 public:
  static SafetensorsSet open_directory(const std::string& directory);

  const SafetensorsFile::Entry* find(const std::string& name) const;  // nullptr if absent
  // Every tensor, file by file, each file in header order.
  std::vector<const SafetensorsFile::Entry*> entries() const;
  // SafetensorsFile::release on the file that holds `entry`.
  void release(const SafetensorsFile::Entry& entry) const;
  // What messages name: model.safetensors, or the index.
  const std::string& source() const { return source_; }

 private:
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, std::size_t> owner_;  // tensor name -> index in files_
  std::string source_;
};

}  // namespace cpuformer::io
