# cmake/aarch64-linux-gnu.cmake - cross-compile rebound for 64-bit ARM Linux
# (Debian's gcc-aarch64-linux-gnu + libc6-dev-arm64-cross):
#
#   cmake -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   cmake --build build-arm64 -j2
#   ctest --test-dir build-arm64 -R '^test_'     # runs them under qemu-aarch64
#
# The build targets armv8-a (NEON, the floor of every 64-bit ARM phone);
# matmul_dotprod.c and ops_dotprod.c alone add +dotprod, matmul_i8mm.c
# +dotprod+i8mm, and cpu.c picks them where the CPU's HWCAP says so
# (REBOUND_CPU=neon|dotprod caps it; the tests run every tier qemu has:
# qemu-aarch64 -cpu max, its default, has both). REBOUND_NATIVE is ignored
# when cross-compiling.
#
# Android: use the NDK's own toolchain file instead of this one, e.g.
#   cmake -B build-android \
#     -DCMAKE_TOOLCHAIN_FILE=$ANDROID_NDK/build/cmake/android.toolchain.cmake \
#     -DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-24 -DREBOUND_TESTS=OFF
# (the same sources; detection is getauxval(AT_HWCAP), which bionic has).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(REBOUND_CROSS_PREFIX "aarch64-linux-gnu-" CACHE STRING "cross tool prefix")
set(CMAKE_C_COMPILER ${REBOUND_CROSS_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${REBOUND_CROSS_PREFIX}g++)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs the test executables through qemu-user when it is installed
# (static linking: no aarch64 sysroot needed at run time)
find_program(REBOUND_QEMU_AARCH64 qemu-aarch64)
if(REBOUND_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${REBOUND_QEMU_AARCH64})
endif()
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

# pkg-config (the optional lz4 / zstd) must see the target's .pc files, not
# the build machine's
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
