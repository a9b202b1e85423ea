# Sourced by the device-call scripts: what every GPU machine needs before moelab runs there.
# The image lacks nvshmem4py and simpy: install the carried wheels (.whl) outside the image's
# site-packages; prebuilt cubins come in the carried .cache; NVLink multicast stays off.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 MOELAB_CACHE=$PWD/.cache/moelab
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
