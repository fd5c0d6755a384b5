# Sourced by scripts/test-aarch64-python.sh and scripts/build-wheel.sh --arch aarch64 (docs/arm.md):
# an AArch64 CPython 3.11 to build cpuformer's extension against and to run it under QEMU, made from
# Debian bookworm's arm64 packages and PyPI's manylinux aarch64 wheels only. Nothing is installed into
# the host's Python or its dpkg database: the .debs are unpacked with `dpkg -x`.
#
#   aarch64_python_setup   installs the cross compiler, qemu-user and the arm64 dpkg architecture
#                          if missing, then fills (once; cached between runs under build/aarch64-py/):
#     sysroot/   python3.11 and libpython3.11 (headers included) with the shared libraries they
#                load, libc6, libstdc++6 and libgcc-s1 (cpuformer needs no OpenMP runtime)
#     site/      numpy, tokenizers (and their dependencies) and pip, unpacked from aarch64 wheels
#   aarch64_cmake_args     AARCH64_CMAKE_ARGS: the CMake arguments of a cross build of _core
#   aarch64_configure_extension DIR   configures that build (Release) in DIR
# Variables set: AARCH64_PY (build/aarch64-py, absolute), AARCH64_SYSROOT, AARCH64_SITE.

# The Debian packages of the sysroot. The closure of what `import numpy, tokenizers, cpuformer`,
# pip and the standard library modules they use (ssl, ctypes, zlib, bz2,
# lzma, hashlib, uuid) load; python3.11's terminal-only dependencies (readline, ncurses) and the
# database modules' libraries (libdb, libnsl, libtirpc) are left out.
AARCH64_DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11 libpython3.11-dev
              libc6 libexpat1 zlib1g libffi8 libbz2-1.0 liblzma5 libcrypt1 libssl3 libuuid1
              libstdc++6 libgcc-s1)
# PyPI: cpuformer's dependencies and pip (to install a wheel with the AArch64 Python itself).
AARCH64_WHEELS=(numpy tokenizers pip)

_aarch64_apt() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) for apt-get $*" >&2; return 1; }
    sudo=(sudo)
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" "$@"
}

aarch64_python_setup() {
  local root
  root=$(pwd)
  AARCH64_PY=$root/build/aarch64-py
  AARCH64_SYSROOT=$AARCH64_PY/sysroot
  AARCH64_SITE=$AARCH64_PY/site

  local missing=()
  command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
  command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  local need_update=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "adding the arm64 dpkg architecture (for apt-get download of the sysroot's packages)"
    _aarch64_apt dpkg --add-architecture arm64
    need_update=1
  fi
  if [ "${#missing[@]}" -gt 0 ] || [ "$need_update" -eq 1 ]; then
    _aarch64_apt apt-get update -q
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]}"
    _aarch64_apt apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi

  # The sysroot: rebuilt when the package list changes (the stamp holds it).
  local stamp="${AARCH64_DEBS[*]} | ${AARCH64_WHEELS[*]}"
  if [ "$(cat "$AARCH64_PY/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "making the AArch64 Python sysroot in $AARCH64_PY"
    rm -rf "$AARCH64_PY"
    mkdir -p "$AARCH64_PY/debs" "$AARCH64_SYSROOT" "$AARCH64_PY/wheels" "$AARCH64_SITE"
    local pkgs=() p
    for p in "${AARCH64_DEBS[@]}"; do pkgs+=("$p:arm64"); done
    # apt-get download writes into the current directory; as root it warns that _apt cannot read it.
    (cd "$AARCH64_PY/debs" && apt-get download -q "${pkgs[@]}" 2>&1 | grep -v -e "^Get:" -e "unsandboxed as root" || true)
    local deb n=0
    for deb in "$AARCH64_PY"/debs/*.deb; do dpkg -x "$deb" "$AARCH64_SYSROOT"; n=$((n + 1)); done
    [ "$n" -eq "${#AARCH64_DEBS[@]}" ] || { echo "downloaded $n of ${#AARCH64_DEBS[@]} arm64 packages" >&2; return 1; }
    python3 -m pip download -q -d "$AARCH64_PY/wheels" --platform manylinux2014_aarch64 --only-binary :all: \
      --python-version 3.11 --implementation cp "${AARCH64_WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
    local whl
    for whl in "$AARCH64_PY"/wheels/*.whl; do python3 -m zipfile -e "$whl" "$AARCH64_SITE"; done
    echo "$stamp" > "$AARCH64_PY/stamp"
  fi
  [ -x "$AARCH64_SYSROOT/usr/bin/python3.11" ] || { echo "no python3.11 in $AARCH64_SYSROOT" >&2; return 1; }
}

# The CMake arguments of a cross build of the extension against the sysroot's Python (after
# aarch64_python_setup): the toolchain file, the AArch64 Python headers (the host's python3 only
# runs `-m pybind11 --cmakedir`; pybind11 is header-only), and the AArch64 extension suffix.
# Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>: hence -isystem .../usr/include.
aarch64_cmake_args() {
  AARCH64_CMAKE_ARGS=(-DCMAKE_TOOLCHAIN_FILE="$(pwd)/scripts/toolchains/aarch64-linux-gnu.cmake"
                      -DCPUFORMER_BUILD_PYTHON=ON
                      -DPython_EXECUTABLE="$(python3 -c 'import sys; print(sys.executable)')"
                      -DPython_INCLUDE_DIR="$AARCH64_SYSROOT/usr/include/python3.11"
                      -DCMAKE_CXX_FLAGS="-isystem $AARCH64_SYSROOT/usr/include"
                      -DPYBIND11_USE_CROSSCOMPILING=ON
                      -DPYTHON_MODULE_EXT_SUFFIX=.cpython-311-aarch64-linux-gnu.so)
}

# aarch64_configure_extension BUILD_DIR: configures a Release build of _core in BUILD_DIR.
aarch64_configure_extension() {
  aarch64_cmake_args
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release "${AARCH64_CMAKE_ARGS[@]}" >/dev/null
}
