"""Expected speed of cpuformer's AArch64 kernels, from the instructions they execute (docs/arm.md,
"Expected speed on ARM hardware").

No ARM machine is at hand, so speed on ARM is a model, not a measurement:
1. Each kernel runs under qemu-aarch64 at each ARM level (`cortex-a53`: neon, `cortex-a76`: dotprod,
   `max`: i8mm; `CPUFORMER_ISA=scalar` at `max` for the reference), single-threaded, through
   `cpuformer_insn_probe` (tests/native/insn_probe.cc), with a QEMU plugin that counts the executed
   instructions by mnemonic and register class (scripts/qemu_insn_count.c). Two runs with 1 and 3
   repetitions; half their difference is one call's instructions, without the set-up.
2. A core model turns the counts into cycles: every SIMD/floating-point instruction occupies one
   of the core's vector pipes for 1/throughput cycles (throughputs per mnemonic from Arm's software
   optimization guides, `CORES` below), every load one of its load pipes, and every instruction a
   slot of its decode width; a call takes at least the busiest of the three. That is a lower bound
   on the cycles (no latency chains, no cache misses) — the compute bound.
3. The memory bound: the bytes of weights a call streams (the packed layout) over the core's read
   bandwidth. Decode-sized calls (M = 1) are bound by memory on both cores, prefill-sized ones by
   compute.
Prints a table per workload and writes benchmarks/results/<dir>/arm_model.json.

    python benchmarks/arm_instruction_model.py [--out FILE] [--dtypes float32,float16,bfloat16,int8,int4]

Needs what scripts/test-aarch64.sh installs (the AArch64 cross compiler, qemu-user) and a host C
compiler for the plugin. Takes a few minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "aarch64"
PLUGIN = ROOT / "build" / "qemu_insn_count.so"
SYSROOT = "/usr/aarch64-linux-gnu"

# (QEMU CPU, CPUFORMER_ISA, the level it runs)
LEVELS = [("max", "scalar", "scalar"), ("cortex-a53", "", "neon"), ("cortex-a76", "", "dotprod"), ("max", "", "i8mm")]

# Workloads: name -> (probe arguments after the dtype or kind, multiply-adds per call, weight bytes
# per call as a function of the dtype (None: not a weight-streaming kernel)).
GEMV = (1, 2048, 2048)  # one decode row through a 2048 x 2048 projection (1.1B Llama width)
GEMM = (64, 512, 512)  # a prefill block
BYTES_PER_WEIGHT = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0 + 4.0 / 2048,
                    "int4": 0.5 + 2.0 / 32}  # int8: + a float32 scale per row; int4: + a float16 scale per 32
ATTENTION = {"attention decode": (1, 512, 8, 64), "attention prefill": (128, 128, 8, 64)}

# Per core: clock, decode width, vector pipes and load pipes (instructions per cycle), a read
# bandwidth for one core, and the vector instructions whose throughput (per cycle) differs from the
# number of vector pipes. Pipes, loads and throughputs: LLVM's scheduling models, which encode Arm's
# Software Optimization Guides (AArch64SchedNeoverseN1.td for the Cortex-A76 core, which Neoverse N1
# shares; AArch64SchedNeoverseV1.td). docs/arm.md names the definition behind each number and what
# is assumed (SDOT on the A76 is not in LLVM's N1 model: taken at the vector pipes' 2 per cycle).
# Read bandwidth: Raspberry Pi 5, one thread, tinymembench "C copy" (6.2 GB/s; a copy also writes,
# so a read stream is at least this); Graviton3, its DDR5's theoretical 307.2 GB/s over 64 cores.
_WIDEN = ("sshll", "ushll", "sshll2", "ushll2", "sxtl", "uxtl", "sxtl2", "uxtl2", "shll", "shll2", "shl")
CORES = {
    "Cortex-A76 (2.4 GHz, Raspberry Pi 5)": dict(
        level="dotprod", ghz=2.4, decode=4, vector_pipes=2, load_pipes=2, read_gbs=6.2,
        throughput={"fcvtl": 0.5, "fcvtl2": 0.5, "scvtf v.4s": 0.5, **{m: 1 for m in _WIDEN}}),
    "Neoverse V1 (2.6 GHz, Graviton3)": dict(
        level="i8mm", ghz=2.6, decode=8, vector_pipes=4, load_pipes=3, read_gbs=307.2 / 64,
        throughput={"fcvtl": 1, "fcvtl2": 1, "scvtf v.4s": 1, "bfcvtn v.4h": 2, "bfcvtn2 v.8h": 2, "tbl": 1,
                    **{m: 2 for m in _WIDEN}}),
}

VECTOR_REGS = set("vqdshb")
_REGISTERS = 0x1F | 0x1F << 5 | 0x1F << 16  # Rd, Rn, Rm: what the plugin clears in an "enc" key
_LANE = 1 << 21 | 1 << 11  # L and H of the by-element forms
# Encodings QEMU 7.2's disassembler prints as ".byte" (Arm ARM, A64 SIMD&FP encodings).
_VECTOR_FORMS = {0x4E809400: "sdot v.4s", 0x6E809400: "udot v.4s", 0x4E809C00: "usdot v.4s",
                 0x4E80A400: "smmla v.4s", 0x6E80A400: "ummla v.4s", 0x4E80AC00: "usmmla v.4s",
                 0x6E40EC00: "bfmmla v.4s", 0x6E40FC00: "bfdot v.4s", 0x2E40FC00: "bfdot v.2s",
                 0x2EC0FC00: "bfmlalb v.4s", 0x6EC0FC00: "bfmlalt v.4s", 0x0EA16800: "bfcvtn v.4h",
                 0x4EA16800: "bfcvtn2 v.8h"}
_ELEMENT_FORMS = {0x4F80E000: "sdot v.4s", 0x6F80E000: "udot v.4s", 0x4F00F000: "sudot v.4s",
                  0x4F80F000: "usdot v.4s", 0x4F40F000: "bfdot v.4s"}
# Multiply-adds per instruction of the arithmetic that does a kernel's work, for the report.
MACS_PER_INSTRUCTION = {"fmla v.4s": 4, "fmla v.2d": 2, "fmla v.8h": 8, "sdot v.4s": 16, "udot v.4s": 16,
                        "usdot v.4s": 16, "sudot v.4s": 16, "smmla v.4s": 32, "ummla v.4s": 32,
                        "usmmla v.4s": 32, "bfdot v.4s": 8, "bfmmla v.4s": 16, "bfmlalb v.4s": 4,
                        "bfmlalt v.4s": 4}


def name_of(key):
    """A plugin key with "enc <hex>" replaced by the instruction's name where it is known."""
    if not key.startswith("enc "):
        return key
    word = int(key[4:], 16)
    for encoding, name in _VECTOR_FORMS.items():
        if word == encoding & ~_REGISTERS:
            return name
    for encoding, name in _ELEMENT_FORMS.items():
        if word & ~_LANE == encoding & ~_REGISTERS & ~_LANE:
            return name
    return key


def named(counts):
    out = {}
    for key, n in counts.items():
        out[name_of(key)] = out.get(name_of(key), 0) + n
    return out


def build():
    """The plugin (host) and the probe (AArch64, in the build directory scripts/test-aarch64.sh uses)."""
    PLUGIN.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(PLUGIN),
                    str(ROOT / "scripts" / "qemu_insn_count.c"), "-lpthread"], check=True)
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_TOOLCHAIN_FILE={ROOT / 'scripts' / 'toolchains' / 'aarch64-linux-gnu.cmake'}",
                    "-DCPUFORMER_BUILD_PYTHON=OFF", "-DCPUFORMER_BUILD_TESTS=ON"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", str(BUILD), "cpuformer_insn_probe"], check=True, stdout=subprocess.DEVNULL)


def count(cpu, isa, args, out):
    """{key: executed count} of one probe run, and the line the probe printed (its kernel's name)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", QEMU_LD_PREFIX=SYSROOT)
    env.pop("CPUFORMER_ISA", None)
    if isa:
        env["CPUFORMER_ISA"] = isa
    done = subprocess.run(["qemu-aarch64", "-cpu", cpu, "-plugin", f"{PLUGIN},out={out}",
                           str(BUILD / "cpuformer_insn_probe"), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"probe {' '.join(map(str, args))} at {cpu}: {done.stderr.strip()}")
    counts = {}
    for line in pathlib.Path(out).read_text().splitlines():
        key, n = line.rsplit("\t", 1)
        counts[key] = int(n)
    return counts, done.stdout.strip()


def per_call(cpu, isa, args, scratch):
    """Instructions of one call: (counts at 3 repetitions − counts at 1) / 2, by key."""
    one, _ = count(cpu, isa, [*args, 1], scratch)
    three, line = count(cpu, isa, [*args, 3], scratch)
    calls = {k: (three.get(k, 0) - one.get(k, 0)) / 2 for k in set(one) | set(three)}
    return named({k: v for k, v in calls.items() if v > 0}), line


def classify(counts):
    """Totals by class: mac (the multiply-add instructions of MACS_PER_INSTRUCTION), vector (all SIMD
    and floating point, not loads/stores; includes mac), load, store, other."""
    out = {"total": 0.0, "mac": 0.0, "vector": 0.0, "load": 0.0, "store": 0.0, "other": 0.0}
    for key, n in counts.items():
        mnemonic, _, operand = key.partition(" ")
        out["total"] += n
        if key in MACS_PER_INSTRUCTION:
            out["mac"] += n
        if mnemonic.startswith("ld"):
            out["load"] += n
        elif mnemonic.startswith("st"):
            out["store"] += n
        elif operand[:1] in VECTOR_REGS or key.startswith("enc "):
            out["vector"] += n
        else:
            out["other"] += n
    return out


def cycles(counts, core):
    """The compute bound of one call on `core`: the busiest of vector pipes, load pipes, decode."""
    vector = 0.0
    for key, n in counts.items():
        mnemonic, _, operand = key.partition(" ")
        if mnemonic.startswith(("ld", "st")) or (operand[:1] not in VECTOR_REGS and mnemonic != "enc"):
            continue
        vector += n / core["throughput"].get(key, core["throughput"].get(mnemonic, core["vector_pipes"]))
    c = classify(counts)
    return max(vector, c["load"] / core["load_pipes"], c["total"] / core["decode"])


def check(rows):
    """What the counts must show if the plugin, the decoding of unnamed encodings and the dispatch
    work: the scalar reference does no multiply-add in SIMD multiply-add instructions, float32 at
    every SIMD level does all of them in `fmla v.4s`, int8 / int4 at dotprod and i8mm in `sdot` or
    `smmla` (int4 a little more: its zero-point sums). SMMLA multiplies row pairs, so at i8mm an odd
    row count pairs its last row with zeros: one row costs the multiply-adds of two."""
    failures = []
    for row in rows:
        dtype, shape, level = row["workload"].split(" ")[0], row["workload"].split(" ")[2], row["level"]
        share = row["mac_instruction_share"]
        if dtype not in ("float32", "int8", "int4"):
            continue
        m = int(shape.split("x")[0])
        expected = 2 * ((m + 1) // 2) / m if (level == "i8mm" and dtype == "int8") else 1.0
        if level == "scalar" or (dtype != "float32" and level == "neon"):
            ok = share < 0.01
        else:
            ok = 0.99 * expected <= share <= 1.2 * expected
        if not ok:
            failures.append(f"{row['workload']} at {level}: {share:.3f} of the MACs in multiply-add instructions")
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,float16,bfloat16,int8,int4")
    parser.add_argument("--out", default=None)
    parser.add_argument("--check", action="store_true",
                        help="exit non-zero unless the counts show each level's GEMM arithmetic")
    args = parser.parse_args(argv)
    build()
    scratch = str(BUILD / "insn_counts.tsv")
    workloads = []
    for dtype in args.dtypes.split(","):
        for shape_name, (m, n, k) in (("gemv", GEMV), ("gemm", GEMM)):
            workloads.append((f"{dtype} {shape_name} {m}x{n}x{k}", ["gemm", dtype, m, n, k], m * n * k,
                              n * k * BYTES_PER_WEIGHT[dtype]))
    for name, (q, kv, heads, dim) in ATTENTION.items():
        pairs = sum(min(kv, kv - q + 1 + i) for i in range(q))  # causal: query i sees keys 0..kv-q+i
        workloads.append((f"{name} {q}x{kv} h{heads} d{dim}", ["attention", q, kv, heads, dim],
                          2 * pairs * heads * dim, None))  # q·k and p·v
    rows = []
    for name, probe, macs, weight_bytes in workloads:
        for cpu, isa, level in LEVELS:
            counts, line = per_call(cpu, isa, probe, scratch)
            c = classify(counts)
            row = {"workload": name, "level": level, "qemu_cpu": cpu, "probe": line, "macs": macs,
                   "weight_bytes": weight_bytes, "instructions": c["total"],
                   "per_mac": {k: v / macs for k, v in c.items()}, "counts": counts, "cores": {}}
            for core_name, core in CORES.items():
                if core["level"] != level:
                    continue
                cyc = cycles(counts, core)
                compute_s = cyc / (core["ghz"] * 1e9)
                model = {"cycles": cyc, "macs_per_cycle": macs / cyc, "compute_gmacs": macs / compute_s / 1e9}
                if weight_bytes:
                    # Above this read bandwidth the call is compute-bound, below it memory-bound.
                    model["crossover_gbs"] = weight_bytes / compute_s / 1e9
                    memory_s = weight_bytes / (core["read_gbs"] * 1e9)
                    model.update(read_gbs=core["read_gbs"], bound="memory" if memory_s > compute_s else "compute",
                                 expected_gmacs=macs / max(memory_s, compute_s) / 1e9)
                row["cores"][core_name] = model
            rows.append(row)
            per_mac = row["per_mac"]
            mac_work = sum(n * MACS_PER_INSTRUCTION.get(k, 0) for k, n in counts.items()) / macs
            row["mac_instruction_share"] = mac_work  # fraction of the MACs done by MACS_PER_INSTRUCTION ops
            print(f"{name:<36}{level:<9}{per_mac['total']:>7.3f} instr/MAC (mac {per_mac['mac']:.4f}, "
                  f"vector {per_mac['vector']:.3f}, load {per_mac['load']:.3f}; {mac_work:.0%} of MACs in "
                  f"multiply-add instructions)  {' '.join(line.split(' ')[:2]) if line else ''}", flush=True)
            for core_name, model in row["cores"].items():
                extra = (f"; weights need {model['crossover_gbs']:.1f} GB/s to keep up, at "
                         f"{model['read_gbs']:.1f} GB/s: {model['expected_gmacs']:.1f} GMAC/s ({model['bound']}-bound)"
                         if "bound" in model else "")
                print(f"{'':<45}{core_name}: {model['macs_per_cycle']:.2f} MAC/cycle, "
                      f"{model['compute_gmacs']:.1f} GMAC/s compute bound{extra}")
    if args.check:
        failures = check(rows)
        for failure in failures:
            print(f"check failed: {failure}", file=sys.stderr)
        if failures:
            return 1
        print("check passed: every level's GEMMs do their multiply-adds in the instructions of their level")
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"arm_model_{today}.json")
    out.write_text(json.dumps({"date": today, "qemu": subprocess.run(["qemu-aarch64", "--version"], capture_output=True,
                                                                     text=True).stdout.splitlines()[0],
                               "cores": CORES, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
