#include "io/packed_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <utility>

#include "io/json.h"
#include "runtime/cpu_features.h"

namespace cpuformer::io {
namespace {

constexpr char kMagic[8] = {'C', 'F', 'P', 'A', 'C', 'K', 'E', 'D'};
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kAlign = 64;
constexpr long kMaxDim = 1L << 31;

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[i] = digits[v & 15];
  return out;
}

bool parse_type(const std::string& name, WeightType& out) {
  for (WeightType t :
       {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16, WeightType::kInt8, WeightType::kInt4}) {
    if (name == weight_type_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

// "int8", "int4-g32", "int4-g64-z": what a layout depends on besides the shape.
std::string format_name(const WeightFormat& f) {
  std::string s = weight_type_name(f.type);
  if (f.type == WeightType::kInt4) s += "-g" + std::to_string(f.group_size) + (f.zero_point ? "-z" : "");
  return s;
}

bool same_format(const WeightFormat& a, const WeightFormat& b) {
  return a.type == b.type &&
         (a.type != WeightType::kInt4 || (a.group_size == b.group_size && a.zero_point == b.zero_point));
}

// A hash of the running level's packing of a fixed [37, 100] matrix in `format`: a build whose
// packer for that format lays bytes out differently gives another hash, so its files are not used.
std::string probe(const WeightFormat& format) {
  constexpr long n = 37, k = 100;
  std::vector<float> w(static_cast<std::size_t>(n) * k);
  uint32_t state = 12345;
  for (float& v : w) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  const PackedWeights p = pack_weights(w.data(), format, n, k, k);
  return hex(fnv1a(p.bytes(), p.byte_size()));
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char* digits = "0123456789abcdef";
      out += "\\u00";
      out += digits[(c >> 4) & 15];
      out += digits[c & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string packed_level_key() {
  const Isa isa = active_isa();
  const CpuFeatures& f = cpu_features();
#if defined(__x86_64__)
  std::string key = std::string("x86_64-") + isa_name(isa);
  // The features that select another packer at the level (kernels/gemm/gemm.cc); amx_int8 and
  // amx_bf16 do not (their kernels read the +vnni and +bf16 packings as they are).
  if (isa == Isa::kAvx2 && f.avx_vnni) key += "+avxvnni";
  if (isa == Isa::kAvx512) {
    if (f.avx512vnni) key += "+vnni";
    if (f.avx512bf16) key += "+bf16";
  }
  return key;
#elif defined(__aarch64__)
  (void)f;
  return std::string("aarch64-") + isa_name(isa);
#else
  (void)f;
  return std::string("other-") + isa_name(isa);
#endif
}

std::string packed_file_name() { return "cpuformer_packed." + packed_level_key() + ".bin"; }

std::string weights_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot be read (" + std::strerror(errno) + ")");
  unsigned char size_bytes[8];
  if (!in.read(reinterpret_cast<char*>(size_bytes), 8)) throw std::invalid_argument(path + ": truncated header");
  const uint64_t header = get_u64(size_bytes);
  if (header > 100u * 1000u * 1000u) throw std::invalid_argument(path + ": header too large");
  std::string text(static_cast<std::size_t>(header), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header))) {
    throw std::invalid_argument(path + ": truncated header");
  }
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  uint64_t h = fnv1a(text.data(), text.size(), fnv1a(size_bytes, 8));
  // And 16 samples of 4 KiB spread over the data (the first and the last bytes included): weights
  // replaced by others of the same shapes (the same header) are told apart without reading them all.
  const uint64_t data = 8 + header, data_bytes = size > data ? size - data : 0;
  const uint64_t chunk = data_bytes < 4096 ? data_bytes : 4096;
  std::string sample(static_cast<std::size_t>(chunk), '\0');
  for (uint64_t i = 0; i < 16 && chunk > 0; ++i) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(data + (data_bytes - chunk) * i / 15));
    if (!in.read(sample.data(), static_cast<std::streamsize>(chunk))) {
      throw std::invalid_argument(path + ": cannot be read");
    }
    h = fnv1a(sample.data(), sample.size(), h);
  }
  return std::to_string(size) + ":" + hex(h);
}

PackedFile::Opened PackedFile::open_directory(const std::string& directory) {
  const std::string path = directory + "/" + packed_file_name();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  return open(path, weights_fingerprint(directory + "/model.safetensors"));
}

PackedFile::Opened PackedFile::open(const std::string& path, const std::string& weights) {
  auto fail = [&path](const std::string& what) -> std::invalid_argument {
    return std::invalid_argument(path + ": damaged packed-weights file: " + what +
                                 "; delete it or rewrite it with `cpuformer pack <directory>`");
  };
  auto stale = [&path](const std::string& why) {
    Opened o;
    o.warning = path + ": not used (" + why +
                "); the weights are packed at load. `cpuformer pack <directory>` "
                "rewrites it";
    return o;
  };
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw std::invalid_argument(path + ": cannot be read (" + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw std::invalid_argument(path + ": not a regular file");
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  if (size < kHeaderBytes) {
    throw fail("truncated to " + std::to_string(size) + " bytes (the header alone takes " +
               std::to_string(kHeaderBytes) + ")");
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (addr == MAP_FAILED) throw std::invalid_argument(path + ": cannot mmap: " + std::strerror(errno));
  // Advice (may fail, changes nothing else): where the page cache holds large folios (ext4 and xfs
  // on recent kernels) the file's pages are mapped 2 MiB at a time, as the anonymous packed buffers
  // are (aligned_buffer.h): decode walks ~1 GB of weights per token. Pages already cached in large
  // folios (a file just written) are mapped so without it; this makes the readahead of pages not in
  // the cache allocate 2 MiB folios too (measured on a 1.1B int8 file read cold: 97 % of it mapped
  // with 2 MiB entries instead of 55 %). MAP_POPULATE / MADV_WILLNEED gained nothing measurable.
  ::madvise(addr, size, MADV_HUGEPAGE);
  std::shared_ptr<const void> map(addr, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  const auto* base = static_cast<const unsigned char*>(addr);
  if (std::memcmp(base, kMagic, sizeof kMagic) != 0) throw fail("bad header (no CFPACKED magic)");
  const uint64_t index_offset = get_u64(base + 8), index_bytes = get_u64(base + 16);
  if (index_offset < kHeaderBytes || index_offset > size || index_bytes > size - index_offset) {
    throw fail("truncated or bad header: the index [" + std::to_string(index_offset) + ", +" +
               std::to_string(index_bytes) + ") is not inside the file's " + std::to_string(size) + " bytes");
  }
  Json index;
  try {
    index = Json::parse(std::string(reinterpret_cast<const char*>(base + index_offset), index_bytes));
  } catch (const std::invalid_argument& e) {
    throw fail(std::string("bad index: ") + e.what());
  }
  auto file = std::shared_ptr<PackedFile>(new PackedFile());
  file->path_ = path;
  try {
    const long version = index.at("format_version").integer();
    if (version != kPackedFormatVersion) {
      return stale("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kPackedFormatVersion));
    }
    const std::string& level = index.at("level").string();
    if (level != packed_level_key()) return stale("packed for " + level + ", this process runs " + packed_level_key());
    if (index.at("layout_version").integer() != kPackedLayoutVersion) {
      return stale("written by a cpuformer build with other packed layouts");
    }
    if (index.at("weights").string() != weights) {
      return stale("stale: written for other weights than model.safetensors now holds");
    }
    const Json& probes = index.at("probes");
    for (const Json& m : index.at("matrices").array()) {
      const std::string& key = m.at("key").string();
      Entry e;
      e.n = m.at("n").integer();
      e.k = m.at("k").integer();
      const std::string& type = m.at("type").string();
      if (!parse_type(type, e.format.type)) throw fail("matrix '" + key + "': unknown type '" + type + "'");
      e.format.group_size = m.at("group_size").integer();
      e.format.zero_point = m.at("zero_point").boolean();
      const long offset = m.at("offset").integer(), bytes = m.at("bytes").integer();
      if (e.n <= 0 || e.k <= 0 || e.n > kMaxDim || e.k > kMaxDim || e.n * e.k > (1L << 40)) {
        throw fail("matrix '" + key + "': shape [" + std::to_string(e.n) + ", " + std::to_string(e.k) + "]");
      }
      if (e.format.type == WeightType::kInt4 && !valid_int4_group_size(e.format.group_size)) {
        throw fail("matrix '" + key + "': int4 group size " + std::to_string(e.format.group_size));
      }
      if (offset < static_cast<long>(kHeaderBytes) || bytes < 0 || offset % static_cast<long>(kAlign) != 0 ||
          static_cast<uint64_t>(offset) > index_offset || static_cast<uint64_t>(bytes) > index_offset - offset) {
        throw fail("matrix '" + key + "': bytes [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                   ") are not a 64-byte aligned range of the data section [64, " + std::to_string(index_offset) + ")");
      }
      e.offset = static_cast<std::size_t>(offset);
      e.bytes = static_cast<std::size_t>(bytes);
      const std::size_t expected = packed_weight_bytes(e.n, e.k, e.format);
      if (e.bytes != expected) {
        throw fail("matrix '" + key + "': " + std::to_string(e.bytes) + " bytes, but a [" + std::to_string(e.n) + ", " +
                   std::to_string(e.k) + "] " + format_name(e.format) + " matrix packs to " + std::to_string(expected) +
                   " at this level");
      }
      if (!file->entries_.emplace(key, e).second) throw fail("matrix '" + key + "' appears twice");
    }
    std::set<std::string> checked;
    for (const auto& item : file->entries_) {
      const std::string name = format_name(item.second.format);
      if (!checked.insert(name).second) continue;
      const Json* stored = probes.find(name);
      if (stored == nullptr) throw fail("no probe for format " + name);
      if (stored->string() != probe(item.second.format)) {
        return stale("written by a cpuformer build that packs " + name + " differently");
      }
    }
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind(path + ":", 0) == 0) throw;
    throw fail("bad index: " + what);
  }
  file->map_ = std::move(map);
  file->base_ = base;
  Opened o;
  o.file = std::move(file);
  return o;
}

bool PackedFile::find(const std::string& key, long n, long k, const WeightFormat& format, PackedWeights& out) {
  const auto it = entries_.find(key);
  if (it == entries_.end() || !same_format(it->second.format, format)) return false;
  const Entry& e = it->second;
  if (e.n != n || e.k != k) {
    throw std::invalid_argument(path_ + ": damaged packed-weights file: matrix '" + key + "' is [" +
                                std::to_string(e.n) + ", " + std::to_string(e.k) + "], the model's is [" +
                                std::to_string(n) + ", " + std::to_string(k) +
                                "]; delete it or rewrite it with `cpuformer pack <directory>`");
  }
  PackedWeights w;
  w.n = n;
  w.k = k;
  w.type = format.type;
  w.isa = active_isa();
  if (format.type == WeightType::kInt4) {
    w.group_size = format.group_size;
    w.zero_point = format.zero_point;
  }
  w.set_view(base_ + e.offset, e.bytes, map_);
  out = std::move(w);
  ++used_;
  return true;
}

PackedFileWriter::PackedFileWriter(const std::string& path, std::string weights)
    : path_(path), weights_(std::move(weights)) {
  out_ = std::fopen(path.c_str(), "wb");
  if (out_ == nullptr) throw std::runtime_error(path + ": cannot be written (" + std::strerror(errno) + ")");
  const unsigned char zeros[kHeaderBytes] = {};
  write(zeros, kHeaderBytes);
}

PackedFileWriter::~PackedFileWriter() {
  if (out_ != nullptr) std::fclose(out_);
}

void PackedFileWriter::write(const void* data, std::size_t bytes) {
  if (out_ == nullptr) throw std::logic_error("PackedFileWriter: already finished");
  if (bytes != 0 && std::fwrite(data, 1, bytes, out_) != bytes) {
    throw std::runtime_error(path_ + ": write failed (" + std::strerror(errno) + ")");
  }
  offset_ += bytes;
}

void PackedFileWriter::packed(const std::string& key, const PackedWeights& w) {
  for (const auto& item : keys_) {
    if (item.first == key) return;  // the first one packed under a key is kept
  }
  const unsigned char zeros[kAlign] = {};
  write(zeros, (kAlign - offset_ % kAlign) % kAlign);
  Entry e;
  e.n = w.n;
  e.k = w.k;
  e.format.type = w.type;
  if (w.type == WeightType::kInt4) {
    e.format.group_size = w.group_size;
    e.format.zero_point = w.zero_point;
  }
  e.offset = offset_;
  e.bytes = w.byte_size();
  write(w.bytes(), w.byte_size());
  keys_.emplace_back(key, e);
  formats_.insert(format_name(e.format));
}

void PackedFileWriter::finish() {
  std::string index = "{\"format_version\":" + std::to_string(kPackedFormatVersion) +
                      ",\"layout_version\":" + std::to_string(kPackedLayoutVersion) +
                      ",\"level\":" + json_string(packed_level_key()) + ",\"weights\":" + json_string(weights_) +
                      ",\"probes\":{";
  bool first = true;
  for (const std::string& name : formats_) {
    WeightFormat f;
    for (const auto& item : keys_) {
      if (format_name(item.second.format) == name) f = item.second.format;
    }
    index += (first ? "" : ",") + json_string(name) + ":" + json_string(probe(f));
    first = false;
  }
  index += "},\"matrices\":[";
  first = true;
  for (const auto& [key, e] : keys_) {
    index += std::string(first ? "" : ",") + "{\"key\":" + json_string(key) + ",\"n\":" + std::to_string(e.n) +
             ",\"k\":" + std::to_string(e.k) + ",\"type\":\"" + weight_type_name(e.format.type) +
             "\",\"group_size\":" + std::to_string(e.format.type == WeightType::kInt4 ? e.format.group_size : 0) +
             ",\"zero_point\":" + (e.format.zero_point ? "true" : "false") + ",\"offset\":" + std::to_string(e.offset) +
             ",\"bytes\":" + std::to_string(e.bytes) + "}";
    first = false;
  }
  index += "]}\n";
  const std::size_t index_offset = offset_;
  write(index.data(), index.size());
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  put_u64(header + 8, index_offset);
  put_u64(header + 16, index.size());
  if (std::fseek(out_, 0, SEEK_SET) != 0 || std::fwrite(header, 1, kHeaderBytes, out_) != kHeaderBytes ||
      std::fflush(out_) != 0 || ::fsync(::fileno(out_)) != 0) {
    throw std::runtime_error(path_ + ": write failed (" + std::strerror(errno) + ")");
  }
  const int closed = std::fclose(out_);
  out_ = nullptr;
  if (closed != 0) throw std::runtime_error(path_ + ": write failed (" + std::strerror(errno) + ")");
}

}  // namespace cpuformer::io
