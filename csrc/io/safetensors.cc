// The safetensors reader of safetensors.h: stat, open, mmap, then the header parsed with io::Json
// and every entry checked against the data section before any pointer is handed out.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "io/json.h"

namespace cpuformer::io {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument(path + ": " + what);
}

// Closes the descriptor on every exit path of open(); the mapping outlives it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Owns a mapping until open() hands it to the SafetensorsFile.
struct MapGuard {
  void* addr = nullptr;
  std::size_t size = 0;
  ~MapGuard() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

// The layout rule of the safetensors format (the `safetensors` library's Metadata::validate and
// its "file not fully covered" check): sorted by offsets, the tensors' ranges tile the data
// section exactly, each beginning where the previous one ends, the last ending at its end. So no
// two tensors share a byte (an empty tensor inside another's range counts as an overlap, as there)
// and no byte belongs to no tensor. _model_dir.py applies the same rule with the same messages.
void check_layout(const std::string& path, std::vector<std::tuple<std::uint64_t, std::uint64_t, std::size_t>>& ranges,
                  const std::vector<SafetensorsFile::Entry>& entries, std::uint64_t data_size) {
  std::sort(ranges.begin(), ranges.end());  // (ties: header order)
  std::uint64_t reach = 0;
  const SafetensorsFile::Entry* reached_by = nullptr;  // the tensor that ends at `reach`
  for (const auto& [begin, end, index] : ranges) {
    const SafetensorsFile::Entry& e = entries[index];
    if (begin < reach) {
      fail(path, "tensors '" + reached_by->name + "' and '" + e.name + "' overlap: '" + e.name + "' begins at byte " +
                     std::to_string(begin) + ", before '" + reached_by->name + "' ends at byte " +
                     std::to_string(reach));
    }
    if (begin > reach) {
      fail(path, "bytes [" + std::to_string(reach) + ", " + std::to_string(begin) +
                     ") of the data section belong to no tensor (a gap before tensor '" + e.name +
                     "'); the tensors must cover the data section exactly");
    }
    reach = end;
    reached_by = &e;
  }
  if (reach != data_size) {
    fail(path, "bytes [" + std::to_string(reach) + ", " + std::to_string(data_size) +
                   ") of the data section belong to no tensor (after the last one); the tensors must cover the "
                   "data section exactly");
  }
}

}  // namespace

std::size_t SafetensorsFile::dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // stat before open: opening a FIFO would block, and a directory opens fine on Linux.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) fail(path, "no such file");
    fail(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");

  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    if (errno == ENOENT) fail(path, "no such file");
    fail(path, std::string("cannot open: ") + std::strerror(errno));
  }
  if (::fstat(fd.fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");  // replaced since the stat above
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < 8) {
    fail(path, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }

  MapGuard map;
  map.addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map.addr == MAP_FAILED) {
    map.addr = nullptr;
    fail(path, std::string("cannot mmap: ") + std::strerror(errno));
  }
  map.size = file_size;
  const auto* bytes = static_cast<const unsigned char*>(map.addr);

  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > file_size - 8) {
    fail(path,
         "header length " + std::to_string(header_len) + " exceeds the file (" + std::to_string(file_size) + " bytes)");
  }
  const std::uint64_t data_begin = 8 + header_len;
  const std::uint64_t data_size = file_size - data_begin;

  Json header;
  try {
    header = Json::parse(std::string(reinterpret_cast<const char*>(bytes + 8), header_len));
  } catch (const std::invalid_argument& e) {
    fail(path, std::string("header: ") + e.what());
  }
  if (header.type() != Json::Type::kObject) {
    fail(path, std::string("header is a JSON ") + Json::type_name(header.type()) + ", not an object");
  }

  SafetensorsFile file;
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::size_t>> ranges;  // (begin, end, entry index)
  for (const auto& [name, info] : header.object()) {
    if (name == "__metadata__") {
      if (info.type() != Json::Type::kObject) fail(path, "__metadata__ is not an object");
      for (const auto& [key, value] : info.object()) {
        if (value.type() != Json::Type::kString) fail(path, "__metadata__ '" + key + "' is not a string");
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (info.type() != Json::Type::kObject) fail(path, where + "entry is not an object");
    const Json* dtype = info.find("dtype");
    const Json* shape = info.find("shape");
    const Json* offsets = info.find("data_offsets");
    if (dtype == nullptr) fail(path, where + "no dtype");
    if (shape == nullptr) fail(path, where + "no shape");
    if (offsets == nullptr) fail(path, where + "no data_offsets");

    Entry entry;
    entry.name = name;
    if (dtype->type() != Json::Type::kString) fail(path, where + "dtype is not a string");
    entry.dtype = dtype->string();
    const std::size_t elem = dtype_size(entry.dtype);
    if (elem == 0) fail(path, where + "unknown dtype '" + entry.dtype + "'");

    if (shape->type() != Json::Type::kArray) fail(path, where + "shape is not an array");
    std::uint64_t count = 1;
    for (const Json& dim : shape->array()) {
      long d;
      try {
        d = dim.integer();
      } catch (const std::invalid_argument&) {
        fail(path, where + "shape holds a dimension that is not an integer");
      }
      if (d < 0) fail(path, where + "negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(d), &count)) {
        fail(path, where + "shape product overflows");
      }
      entry.shape.push_back(d);
    }
    std::uint64_t nbytes;
    if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(elem), &nbytes)) {
      fail(path, where + "shape product overflows");
    }

    if (offsets->type() != Json::Type::kArray || offsets->size() != 2) {
      fail(path, where + "data_offsets is not two integers");
    }
    long begin, end;
    try {
      begin = offsets->array()[0].integer();
      end = offsets->array()[1].integer();
    } catch (const std::invalid_argument&) {
      fail(path, where + "data_offsets is not two integers");
    }
    if (begin < 0 || end < begin) {
      fail(path, where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] is not 0 <= begin <= end");
    }
    if (static_cast<std::uint64_t>(end) > data_size) {
      fail(path, where + "data_offsets end " + std::to_string(end) + " is beyond the data section (" +
                     std::to_string(data_size) + " bytes)");
    }
    const auto span = static_cast<std::uint64_t>(end - begin);
    if (span != nbytes) {
      fail(path, where + "data_offsets span " + std::to_string(span) + " bytes, but dtype " + entry.dtype +
                     " and shape give " + std::to_string(nbytes));
    }
    entry.data = bytes + data_begin + begin;
    entry.nbytes = static_cast<std::size_t>(nbytes);
    ranges.emplace_back(begin, end, file.entries_.size());
    file.index_.emplace(entry.name, file.entries_.size());  // names are unique: Json keeps the last duplicate
    file.entries_.push_back(std::move(entry));
  }
  check_layout(path, ranges, file.entries_, data_size);

  file.path_ = path;
  file.map_ = map.addr;
  file.map_size_ = map.size;
  map.addr = nullptr;  // owned by file now
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      entries_(std::move(other.entries_)),
      index_(std::move(other.index_)) {
  other.entries_.clear();
  other.index_.clear();
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    other.entries_.clear();
    other.index_.clear();
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

SafetensorsSet SafetensorsSet::open_directory(const std::string& directory) {
  SafetensorsSet set;
  const std::string single = directory + "/model.safetensors";
  const std::string index = directory + "/model.safetensors.index.json";
  struct stat st;
  auto add = [&set](SafetensorsFile file) {
    for (const SafetensorsFile::Entry& e : file.entries()) {
      const auto other = set.owner_.find(e.name);
      if (other != set.owner_.end()) {
        throw std::invalid_argument("tensor '" + e.name + "' is in both " + set.files_[other->second].path() + " and " +
                                    file.path());
      }
      set.owner_[e.name] = set.files_.size();
    }
    set.files_.push_back(std::move(file));
  };
  if (::stat(single.c_str(), &st) == 0 || ::stat(index.c_str(), &st) != 0) {
    set.source_ = single;
    add(SafetensorsFile::open(single));  // (its own "no such file" error when neither exists)
    return set;
  }
  set.source_ = index;
  std::ifstream in(index, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw std::invalid_argument(index + ": cannot be read");
  Json content;
  try {
    content = Json::parse_python(text.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(index + ": " + e.what());
  }
  const Json* weight_map = content.find("weight_map");
  if (!weight_map || weight_map->type() != Json::Type::kObject) {
    throw std::invalid_argument(index + ": 'weight_map' must be an object of tensor name -> shard file");
  }
  if (weight_map->object().empty()) throw std::invalid_argument(index + ": 'weight_map' names no tensors");
  std::vector<std::string> shards;
  for (const auto& item : weight_map->object()) {
    if (item.second.type() != Json::Type::kString) {
      throw std::invalid_argument(index + ": shard for tensor '" + item.first + "' must be a file name");
    }
    const std::string& shard = item.second.string();
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
      throw std::invalid_argument(index + ": shard '" + shard + "' for tensor '" + item.first +
                                  "' must be a plain file name in the model directory");
    }
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);  // first appearance
  }
  for (const std::string& shard : shards) add(SafetensorsFile::open(directory + "/" + shard));
  for (const auto& item : weight_map->object()) {
    const auto owner = set.owner_.find(item.first);
    if (owner == set.owner_.end() || set.files_[owner->second].path() != directory + "/" + item.second.string()) {
      throw std::invalid_argument(index + ": maps tensor '" + item.first + "' to " + item.second.string() +
                                  ", which has no such tensor");
    }
  }
  return set;
}

const SafetensorsFile::Entry* SafetensorsSet::find(const std::string& name) const {
  const auto owner = owner_.find(name);
  return owner == owner_.end() ? nullptr : files_[owner->second].find(name);
}

std::vector<const SafetensorsFile::Entry*> SafetensorsSet::entries() const {
  std::vector<const SafetensorsFile::Entry*> out;
  for (const SafetensorsFile& file : files_)
    for (const SafetensorsFile::Entry& e : file.entries()) out.push_back(&e);
  return out;
}

void SafetensorsSet::release(const SafetensorsFile::Entry& entry) const {
  const auto owner = owner_.find(entry.name);
  if (owner == owner_.end()) throw std::invalid_argument(source_ + ": release() of an unknown entry");
  files_[owner->second].release(entry);
}

const SafetensorsFile::Entry* SafetensorsFile::find(const std::string& name) const {
  const auto found = index_.find(name);
  return found == index_.end() ? nullptr : &entries_[found->second];
}

void SafetensorsFile::release(const Entry& entry) const {
  if (entries_.empty() || &entry < entries_.data() || &entry >= entries_.data() + entries_.size()) {
    throw std::invalid_argument(path_ + ": release() of an entry of another file");
  }
  if (entry.nbytes == 0) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(entry.data);
  const std::uintptr_t first = (begin + page - 1) / page * page;        // first whole page
  const std::uintptr_t last = (begin + entry.nbytes) / page * page;  // end of the last whole page
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace cpuformer::io
