#!/usr/bin/env bash
# Packs a CUDA build of memest for a GPU machine that has the NVIDIA driver, CUDA 13 and cuDNN 9
# (as libraries: a PyTorch install's are enough) but not the build's other dependencies (gRPC,
# protobuf, spdlog, ...): the binaries, stripped, and every shared library they load that is not
# the C runtime, the driver, CUDA's or cuDNN's, in one archive.
#
# Usage: bash scripts/gpu-bundle.sh [ARCHIVE]     (default build/gpu-bundle.tar.xz)
# On the GPU machine: tar xJf ARCHIVE -C DIR; then DIR/bin/memest, DIR/bin/memest-server and
# DIR/bin/kernels_gpu_test run the binaries with DIR/lib and the CUDA libraries they find
# (/usr/local/cuda, the nvidia packages of the python3 on PATH) on LD_LIBRARY_PATH;
# gpu-check.sh takes DIR as BUILD_DIR with PREBUILT=1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly build_dir="${BUILD_DIR:-build}"
readonly archive="${1:-${build_dir}/gpu-bundle.tar.xz}"
readonly binaries=(memest memest-server memest-validate-worker kernels_gpu_test)

for b in "${binaries[@]}"; do
  [[ -x "${build_dir}/bin/${b}" ]] || { echo "gpu-bundle: ${build_dir}/bin/${b} missing (build with CUDA)" >&2; exit 1; }
done
stage="$(mktemp -d)"
trap 'rm -rf "${stage}"' EXIT
mkdir -p "${stage}/bin" "${stage}/libexec" "${stage}/lib"

# Left to the GPU machine: the C runtime and the compiler's, the driver's, CUDA's and cuDNN's.
readonly system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libnvidia-ml|libcudart|libcublas|libcublasLt|libcudnn)\.so'
for b in "${binaries[@]}"; do
  strip -o "${stage}/libexec/${b}" "${build_dir}/bin/${b}"
  ldd "${build_dir}/bin/${b}" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ ! "${name}" =~ ${system} ]]; then cp -L -n "${path}" "${stage}/lib/${name}"; fi
  done
done

cat > "${stage}/bin/env.sh" <<'EOF'
# Sourced by the wrappers: this bundle's libraries, then CUDA's and cuDNN's where they are.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda_dirs=""
nvidia_wheels="$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)"
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9; do
  for root in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib "${nvidia_wheels}"; do
    found="$(find "${root}" -name "${lib}" 2>/dev/null | head -1)"
    if [[ -n "${found}" ]]; then cuda_dirs="${cuda_dirs}:$(dirname "${found}")"; break; fi
  done
done
export LD_LIBRARY_PATH="${here}/lib${cuda_dirs}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
EOF
for b in "${binaries[@]}"; do
  cat > "${stage}/bin/${b}" <<EOF
#!/usr/bin/env bash
source "\$(dirname "\${BASH_SOURCE[0]}")/env.sh"
exec "\${here}/libexec/${b}" "\$@"
EOF
  chmod +x "${stage}/bin/${b}"
done
# memest-server starts the worker from its own directory: libexec holds both.
tar cJf "${archive}" -C "${stage}" .
echo "gpu-bundle: ${archive} ($(du -h "${archive}" | cut -f1))"
