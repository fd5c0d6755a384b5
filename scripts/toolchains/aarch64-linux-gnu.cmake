# Cross-compiling cpuformer's C++ core and native tests for AArch64 Linux with Debian's toolchain
# (apt-get install g++-aarch64-linux-gnu; scripts/test-aarch64.sh, docs/arm.md):
#   cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=scripts/toolchains/aarch64-linux-gnu.cmake \
#         -DCPUFORMER_BUILD_PYTHON=OFF -DCPUFORMER_BUILD_TESTS=ON
# ctest then runs the tests under QEMU user-mode emulation (apt-get install qemu-user).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -L: where QEMU finds the AArch64 dynamic loader and libraries (libstdc++, libgcc_s).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
