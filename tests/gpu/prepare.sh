#!/usr/bin/env bash
# tests/gpu/prepare.sh — packs, on a machine with the CUDA toolkit but no GPU
# (this project's development machines), everything tests/gpu/run.sh needs on
# a bare GPU machine that has the driver, nvcc and the CUDA libraries but not
# Debian's libconfig, CUnit or OpenBLAS, and no Fashion-MNIST:
#
#   .gpu/build-gpu.tar.xz
#                       build-gpu/ packed (38 MiB of binaries as a folder,
#                       about 6 packed; run.sh unpacks it into the
#                       checkout), the folder itself then removed here:
#   build-gpu/          a Release build with sm_80 (A100) and sm_90
#                       (H100/H200) code and compute_90 PTX, which the driver
#                       compiles for newer GPUs, with the tests and
#                       benchmarks, configured at /work/main/build-gpu so
#                       that run.sh can put the checkout at the same path;
#                       build-gpu/nf4/ the nf4 example plugin;
#                       build-gpu/cuda-version the toolkit's version (run.sh
#                       compares its major with the driver's)
#   .gpu/deps.tar.xz    the Debian runtime libraries kiln links that such a
#                       machine may lack (unpacked there to /tmp, never /)
#   .gpu/openmpi-version the version of the libmpi among them (run.sh runs
#                       the MPI-launched ddp run only where the machine's
#                       Open MPI is the same version)
#   .gpu/fashion-mnist/ the first 20000 training images (headers rewritten;
#                       the idx plugin checks them) and the full test set
#   .gpu/fortunes/      the fortunes package's texts (its .dat indexes and
#                       .u8 links left out), for the transformer checks
#
# .gpu is git-ignored; name it in the device tool's `carry`:
#   carry = [".gpu"], command = "bash tests/gpu/run.sh $OUT"
# Run from the repository root: bash tests/gpu/prepare.sh [ARCHS]
# (ARCHS: CMAKE_CUDA_ARCHITECTURES, default "80-real;90": the default build's
# 80 and 90 less compute_80's PTX, which no GPU past sm_80 would pick over
# compute_90's)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
arch=${1:-80-real;90}
cd "$root"
[ "$root" = /work/main ] || echo "prepare.sh: note: the build records $root; run.sh links that path on the GPU machine"

# 1. the build (CUDA parts included; nvcc needs no GPU)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" -DKILN_WERROR=ON >/dev/null
cmake --build build-gpu -j2
test -f build-gpu/lib/kiln/plugins/libkiln-cuda.so || { echo "prepare.sh: libkiln-cuda.so was not built (no nvcc?)" >&2; exit 1; }
# the toolkit's version, for run.sh's check against the driver: CMake keeps
# it in CMakeFiles/<cmake version>/CMakeCUDACompiler.cmake only (deleted
# below), else the compiler the cache names says it
cuda_version=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\([0-9.]*\)")/\1/p' build-gpu/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1 || true)
if [ -z "$cuda_version" ]; then
  nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' build-gpu/CMakeCache.txt)
  cuda_version=$("${nvcc:-nvcc}" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p' | head -1 || true)
fi
[ -n "$cuda_version" ] || { echo "prepare.sh: could not tell the CUDA toolkit's version" >&2; exit 1; }
echo "$cuda_version" >build-gpu/cuda-version
echo "prepare.sh: built with CUDA $cuda_version (build-gpu/cuda-version)"

# 1b. the out-of-tree nf4 precision (examples/plugins/nf4), built as its
# users build it: against an installed SDK (a scratch prefix; only the
# plugin library travels: its build folder with the CUDA objects is 13 MiB
# of the 64 MiB the device tool carries)
scratch=$(mktemp -d)
cmake --install build-gpu --prefix "$scratch/sdk" >/dev/null
cmake -S examples/plugins/nf4 -B "$scratch/nf4" -DCMAKE_PREFIX_PATH="$scratch/sdk" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_TESTING=OFF >/dev/null
cmake --build "$scratch/nf4" -j2
rm -rf build-gpu/nf4 && mkdir -p build-gpu/nf4
cp "$scratch/nf4/libkiln-nf4.so" build-gpu/nf4/ || { echo "prepare.sh: libkiln-nf4.so was not built" >&2; exit 1; }
rm -rf "$scratch"

# 2. runtime libraries: what the binaries need beyond glibc and CUDA
mkdir -p .gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs=$(find build-gpu -type f \( -name '*.so' -o -perm -u+x \) -not -path '*/CMakeFiles/*' -print0 |
       xargs -0 ldd 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
       grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda[^/]*|libcublas[^/]*|libnccl[^/]*|libz)\.so')
mkdir -p "$tmp/lib"
for l in $libs; do cp -L "$l" "$tmp/lib/"; done
tar -C "$tmp" -cJf .gpu/deps.tar.xz lib
echo "prepare.sh: packed $(echo "$libs" | wc -w) libraries: $(echo $libs | xargs -n1 basename | tr '\n' ' ')"
# the carried libmpi's version (MPI_Get_library_version, callable before
# MPI_Init): "4.1.4" from "Open MPI v4.1.4, package: Debian OpenMPI, ..."
rm -f .gpu/openmpi-version
mpilib=$(echo "$libs" | tr ' ' '\n' | grep '/libmpi\.so' | head -1 || true)
if [ -n "$mpilib" ]; then
  /usr/bin/python3 - "$mpilib" >.gpu/openmpi-version <<'PY' || { rm -f .gpu/openmpi-version; echo "prepare.sh: could not read $mpilib's version: the GPU run will skip its MPI-launched ddp run"; }
import ctypes, re, sys
lib = ctypes.CDLL(sys.argv[1])
buf, n = ctypes.create_string_buffer(8192), ctypes.c_int()
if lib.MPI_Get_library_version(buf, ctypes.byref(n)) != 0:
    sys.exit(1)
m = re.match(r"Open MPI v([0-9][0-9A-Za-z.]*)", buf.value.decode(errors="replace"))
if not m:
    sys.exit(1)
print(m.group(1))
PY
  if [ -f .gpu/openmpi-version ]; then echo "prepare.sh: the carried libmpi is Open MPI $(cat .gpu/openmpi-version) (.gpu/openmpi-version)"; fi
fi

# 3. a Fashion-MNIST subset (the idx plugin validates magic, counts and sizes)
src=${KILN_FM_DIR:-/usr/share/datasets/fashion-mnist}
dst=.gpu/fashion-mnist
mkdir -p "$dst"
/usr/bin/python3 - "$src" "$dst" 20000 <<'PY'
import gzip, struct, sys, shutil, os
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def subset(name, item):
    with gzip.open(os.path.join(src, name)) as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    hdr = 8 + (8 if item > 1 else 0)
    out = struct.pack(">II", magic, n) + data[8:hdr] + data[hdr:hdr + n * item]
    with gzip.open(os.path.join(dst, name), "wb", compresslevel=9) as g:
        g.write(out)
subset("train-images-idx3-ubyte.gz", 784)
subset("train-labels-idx1-ubyte.gz", 1)
for t in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(os.path.join(src, t), os.path.join(dst, t))
PY
# 4. the fortunes texts (Debian's fortunes package; 2.8 MB)
fsrc=${KILN_FORTUNES_DIR:-/usr/share/games/fortunes}
if [ -f "$fsrc/fortunes" ]; then
  rm -rf .gpu/fortunes && mkdir -p .gpu/fortunes
  find "$fsrc" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cp {} .gpu/fortunes/ \;
else
  echo "prepare.sh: no fortunes texts at $fsrc (apt-get install fortunes): the GPU run skips the fortunes check"
fi
# objects and static archives: run.sh never rebuilds a carried build (it
# only runs what was linked here), and with sm_80 and sm_90 code they are
# ~10 MiB of the 64 the device tool carries
find build-gpu \( -name '*.o' -o -name '*.a' \) -type f -delete
# and CMake's own scratch (compiler identification, dependency files,
# ~14 MiB): ctest and run.sh read only CMakeCache.txt, the CTestTestfile
# files, cuda-version (written above) and what was linked; a later
# prepare.sh configures afresh
find build-gpu -type d -name CMakeFiles -prune -exec rm -rf {} +
# The build travels packed: as a folder it is 38 MiB, beside .gpu's 23 and
# the checkout's 9, more than the 64 MiB the device tool carries; packed,
# about 6. Then the folder goes, so that no carry can take it along
# unpacked (prepare.sh builds afresh each time anyway: no objects are left).
du -sh build-gpu | sed 's/^/prepare.sh: /'
rm -f .gpu/build-gpu.tar.xz
XZ_OPT="-6 -T2" tar -cJf .gpu/build-gpu.tar.xz build-gpu
rm -rf build-gpu
du -sh .gpu/build-gpu.tar.xz | sed 's/^/prepare.sh: /'
du -sh .gpu | sed 's/^/prepare.sh: /'
# the device tool carries at most 64 MiB: .gpu plus the checkout
total=$(( $(du -sk .gpu | cut -f1) + $(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1) ))
echo "prepare.sh: $((total / 1024)) MiB travel with the checkout (the limit is 64 MiB)"
[ "$total" -lt $((62 * 1024)) ] || { echo "prepare.sh: too large for the device tool's carry" >&2; exit 1; }
echo "prepare.sh: now run the device tool with carry [\".gpu\"] and: bash tests/gpu/run.sh \"\$OUT\""
