# Sourced by the device-call scripts: what every GPU machine needs before moelab runs there.
# The image lacks nvshmem4py and simpy: install the carried wheels (.whl) outside the image's
# site-packages; prebuilt cubins come in the carried .cache; NVLink multicast stays off.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 MOELAB_CACHE=$PWD/.cache/moelab
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# The gpu benchmark scripts' start: record the command (the copy there has no .git, so the commit
# comes in MOELAB_COMMIT), make $R for the results, log the GPUs, topology and nvcc, find NVSHMEM.
begin_run() {
  # measured runs are matched to their kernel by the full commit (sim/compare.py)
  [[ $MOELAB_COMMIT =~ ^[0-9a-f]{40}$ ]] || { echo "MOELAB_COMMIT=$MOELAB_COMMIT: the full 40-hex commit \
(MOELAB_COMMIT=\$(git rev-parse HEAD)) is needed"; exit 2; }
  export MOELAB_COMMAND="MOELAB_COMMIT=$MOELAB_COMMIT bash $0 $*"
  OUT=${OUT:-artifacts/device}
  R=$OUT/r
  mkdir -p "$R"
  { echo "$MOELAB_COMMAND"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi topo -m; nvcc --version | tail -1; } 2>&1 | tee "$R/log.txt"
  NVH=$(python3 -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])")
}
