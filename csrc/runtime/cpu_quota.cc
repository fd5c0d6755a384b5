#include "runtime/cpu_quota.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace cpuformer {
namespace {

bool read_text(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

bool has_token(const std::string& list, const std::string& token) {
  for (const std::string& t : split(list, ','))
    if (t == token) return true;
  return false;
}

// mountinfo escapes space, tab, newline and backslash in paths as \ooo (octal).
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A number of the whole text (white space around it allowed); false otherwise.
bool parse_number(const std::string& text, double* value) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return false;
  while (*end == ' ' || *end == '\n' || *end == '\t') ++end;
  if (*end != '\0') return false;
  *value = v;
  return true;
}

// The limit one directory of a hierarchy sets, in CPUs; 0: none (or unreadable).
double level_limit(const std::string& dir, bool v2) {
  std::string text;
  double quota = 0, period = 0;
  if (v2) {
    // "max 100000" (no limit) or "<quota> <period>" in microseconds.
    if (!read_text(dir + "/cpu.max", &text)) return 0;
    std::istringstream in(text);
    std::string q, p;
    if (!(in >> q >> p) || q == "max") return 0;
    if (!parse_number(q, &quota) || !parse_number(p, &period)) return 0;
  } else {
    // cpu.cfs_quota_us is -1 without a limit.
    if (!read_text(dir + "/cpu.cfs_quota_us", &text) || !parse_number(text, &quota)) return 0;
    if (!read_text(dir + "/cpu.cfs_period_us", &text) || !parse_number(text, &period)) return 0;
  }
  if (!(quota > 0) || !(period > 0)) return 0;
  return quota / period;
}

// The tightest limit from `dir` up to `top` (the hierarchy's mount point), inclusive.
double walk_up(std::string dir, const std::string& top, bool v2) {
  double limit = 0;
  for (;;) {
    const double l = level_limit(dir, v2);
    if (l > 0 && (limit == 0 || l < limit)) limit = l;
    if (dir.size() <= top.size()) break;
    const std::size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos || slash < top.size() ? top : dir.substr(0, slash);
  }
  return limit;
}

// The directory of `path` (the process's cgroup, as /proc/self/cgroup names it) under a mount of
// its hierarchy whose root (the cgroup directory mounted there) is `mount_root`; "" when the
// cgroup is not below that root (a mount of another part of the hierarchy).
std::string cgroup_dir(const std::string& mount_point, const std::string& mount_root, const std::string& path) {
  if (mount_root == "/") return path == "/" ? mount_point : mount_point + path;
  if (path == mount_root) return mount_point;
  if (path.compare(0, mount_root.size(), mount_root) == 0 && path.size() > mount_root.size() &&
      path[mount_root.size()] == '/')
    return mount_point + path.substr(mount_root.size());
  return "";
}

}  // namespace

double cgroup_cpu_limit(const std::string& root) {
  std::string cgroups, mounts;
  if (!read_text(root + "/proc/self/cgroup", &cgroups) || !read_text(root + "/proc/self/mountinfo", &mounts)) return 0;
  // "0::/path" (v2), "4:cpu,cpuacct:/path" (v1 with the cpu controller).
  std::string v2_path, v1_path;
  for (const std::string& line : split(cgroups, '\n')) {
    const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (id == "0" && controllers.empty()) v2_path = path;
    else if (has_token(controllers, "cpu")) v1_path = path;
  }
  double limit = 0;
  for (const std::string& line : split(mounts, '\n')) {
    // id parent major:minor root mount-point options [optional fields...] - fstype source super-options
    std::istringstream in(line);
    std::vector<std::string> fields;
    std::string f;
    while (in >> f) fields.push_back(f);
    std::size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (fields.size() < 5 || dash + 2 > fields.size()) continue;
    const std::string& fstype = fields[dash + 1];
    const std::string super_options = dash + 3 < fields.size() ? fields[dash + 3] : "";
    bool v2;
    std::string path;
    if (fstype == "cgroup2" && !v2_path.empty()) {
      v2 = true;
      path = v2_path;
    } else if (fstype == "cgroup" && !v1_path.empty() && has_token(super_options, "cpu")) {
      v2 = false;
      path = v1_path;
    } else {
      continue;
    }
    const std::string top = root + unescape(fields[4]);
    const std::string dir = cgroup_dir(top, unescape(fields[3]), path);
    if (dir.empty()) continue;
    const double l = walk_up(dir, top, v2);
    if (l > 0 && (limit == 0 || l < limit)) limit = l;
  }
  return limit;
}

}  // namespace cpuformer
