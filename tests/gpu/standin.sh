# tests/gpu/standin.sh — sourced by the suites that test the GPU run without
# a GPU (preflight.sh, deadline.sh, configs.sh, rehearse.sh): the pieces of
# a stand-in machine that several of them need.

# standin_driver DIR [VERSION]: DIR/nvidia-smi, answering like a driver for
# CUDA VERSION (default 99.9: newer than any toolkit, so run.sh's version
# check passes)
standin_driver() {
  mkdir -p "$1"
  printf '#!/bin/sh\necho "| NVIDIA-SMI 999.99   Driver Version: 999.99   CUDA Version: %s |"\n' "${2:-99.9}" >"$1/nvidia-smi"
  chmod +x "$1/nvidia-smi"
}

# standin_ompi DIR VERSION: DIR/ompi_info, answering `--version` like Open
# MPI VERSION
standin_ompi() {
  mkdir -p "$1"
  printf '#!/bin/sh\necho "Open MPI v%s"\necho\necho "http://www.open-mpi.org/community/help/"\n' "$2" >"$1/ompi_info"
  chmod +x "$1/ompi_info"
}

# standin_libs DIR: empty libcudart.so, libcublasLt.so and libnccl.so in
# DIR, which run.sh's preflight finds on LD_LIBRARY_PATH (nothing loads them)
standin_libs() {
  local l
  mkdir -p "$1"
  for l in cudart cublasLt nccl; do : >"$1/lib$l.so"; done
}

# standin_build REAL DIR: DIR laid out as the build REAL (its lib/ and
# bench/, and every program of its bin/ but kiln, linked in); the caller
# writes DIR/bin/kiln, the stand-in whose behaviour the suite is about
standin_build() {
  local d b
  mkdir -p "$2/bin"
  for d in lib bench; do ln -s "$1/$d" "$2/$d"; done
  for b in "$1"/bin/*; do [ "$(basename "$b")" = kiln ] || ln -s "$b" "$2/bin/"; done
}
