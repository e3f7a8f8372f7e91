# Sourced by the scripts/device-*.sh runners on a GPU machine that has python3 + torch but no internet: installs the
# carried wheels (.whl/, see docs/gpu.md) into /tmp/site and sets the environment every run there needs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD CONVCHECK_CACHE_DIR=/tmp/convcheck-cache NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}  # where the device-*.sh runners write their results
mkdir -p "$OUT"
