// The CPU bandwidth limit of the process's control group (a container's `--cpus`, Kubernetes'
// `resources.limits.cpu`): how many CPUs' worth of time the group may use, which can be far fewer
// than the CPUs its affinity mask allows (a 2-CPU limit on a 64-CPU node). The default thread count
// (runtime/threading.h) uses it: 64 threads sharing 2 CPUs of quota are throttled for most of each
// period, and every barrier waits for a thread that is not running.
#pragma once

#include <string>

namespace cpuformer {

// The limit in CPUs (quota / period) of the tightest level between the process's cgroup and the
// root of its hierarchy, cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us`, `cpu.cfs_period_us`);
// 0 when no level sets one or the files cannot be read. `root` prefixes every path read
// ("" on a real system: /proc/self/cgroup, /proc/self/mountinfo and the cgroup mounts they name),
// so that tests can give a tree of their own.
double cgroup_cpu_limit(const std::string& root);

}  // namespace cpuformer
