// How fast the bf16 tile GEMM's weight stream can go, without the GEMM: every block streams weight
// slices through the kernel's own TMA ring (gpu/kernels/tile_gemm_wgmma.cuh: STAGES stages of a
// 64-deep A slice of 128 rows and a B slice of 256 weight rows, STAGES - 1 slices copied ahead,
// one thread asking for a slice's boxes, an mbarrier per stage counting its bytes in, the block
// meeting once per slice before that thread refills the stage the slice before used). The slices
// are those of the 128-expert layer on one GPU (8192 tokens): each expert's one 128-row tile
// multiplies 8 column blocks of 256 weight rows x 2048 per GEMM, 2048 tasks of 1 MiB, 2 GiB in
// all, each read once from HBM. Where the multiply of a task is hidden, a task cannot take less
// than its slices' time here: the bound on the bf16 GEMM phase at 128 rows per expert.
// Variants: with and without A's boxes (a tile's 128 token rows, shared by its 8 tasks, from L2);
// with a stand-in for the wgmmas that issues nothing (a sleep of the slice's multiply time after
// the refill, as the kernel's wgmmas run while the copies fly); the weights K-major as the kernel
// keeps them (a box's 256 rows 4 KiB apart, 128 bytes of each) or blocked (a box's 32 KiB
// contiguous). Prints one JSON object per line (benchmarks/weight_stream.py reads them).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// the kernel's own mbarrier and TMA helpers
#include "../gpu/kernels/tile_gemm_wgmma.cuh"

#define CHECK(x)                                                                        \
  do {                                                                                  \
    int e_ = (int)(x);                                                                  \
    if (e_) {                                                                           \
      fprintf(stderr, "weight_stream: %s failed with %d at line %d\n", #x, e_, __LINE__); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

constexpr int STAGES = 4, BM = 128, BN = 256, BK = 64, K = 2048, KT = K / BK;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int TASKS = 2048, TASKS_PER_TILE = 8, TILES = TASKS / TASKS_PER_TILE / 2;

struct Maps {
  CUtensorMap a, b;
};

// Block b streams tasks b, b + grid, ...: slice i of its stream is slice i % KT of its task i / KT.
__global__ void __launch_bounds__(128, 1) stream(const __grid_constant__ Maps maps, int with_a, int blocked,
                                                 int multiply_ns, unsigned* sink) {
  extern __shared__ unsigned char smem[];
  __shared__ uint64_t landed[STAGES];
  const unsigned base = (smem_addr(smem) + 1023) & ~1023u;  // the 128-byte swizzle's 1024-byte pattern
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(smem_addr(&landed[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const long long slices = (long long)((TASKS - blockIdx.x + gridDim.x - 1) / gridDim.x) * KT;
  auto load = [&](long long i) {
    const int task = blockIdx.x + (int)(i / KT) * gridDim.x, kt = (int)(i % KT), s = (int)(i % STAGES);
    const unsigned dst = base + s * STAGE_BYTES, bar = smem_addr(&landed[s]);
    mbar_expect_tx(bar, (with_a ? A_BYTES : 0) + B_BYTES);
    if (with_a) {
      const int row = (task / TASKS_PER_TILE) % TILES * BM;
      tma_load_2d(dst, &maps.a, kt * BK, row, bar);
      tma_load_2d(dst + A_BYTES / 2, &maps.a, kt * BK, row + 64, bar);
    }
    if (blocked)
      tma_load_2d(dst + A_BYTES, &maps.b, 0, (task * KT + kt) * BN, bar);
    else
      tma_load_2d(dst + A_BYTES, &maps.b, kt * BK, task * BN, bar);
  };
  if (threadIdx.x == 0)
    for (long long i = 0; i < STAGES - 1 && i < slices; ++i) load(i);
  unsigned phase = 0, seen = 0;
  for (long long i = 0; i < slices; ++i) {
    const int s = (int)(i % STAGES);
    while (!mbar_try_wait(smem_addr(&landed[s]), (phase >> s) & 1)) {
    }
    phase ^= 1u << s;
    __syncthreads();  // every thread is past slice i - 1: its stage takes slice i + STAGES - 1
    if (threadIdx.x == 0 && i + STAGES - 1 < slices) load(i + STAGES - 1);
    seen += *reinterpret_cast<volatile unsigned*>(smem + (base - smem_addr(smem)) + s * STAGE_BYTES + A_BYTES +
                                                  threadIdx.x * 4);
    if (multiply_ns) __nanosleep(multiply_ns);
  }
  if (seen == 0x9e3779b9u) *sink = seen;  // the reads stay
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// a [rows][cols] bf16 matrix read in boxes of box_rows x 64, 128-byte swizzled (as gpu/tma.py encodes)
static CUtensorMap tensor_map(EncodeTiled encode, void* p, uint64_t rows, uint64_t cols, uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * 2};
  const cuuint32_t box[2] = {BK, box_rows}, step[2] = {1, 1};
  CHECK(encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

int main(int argc, char** argv) {
  const int multiply_ns = argc > 1 ? atoi(argv[1]) : 920;  // one H200's slice of a 128 x 256 task (29.5 us / 32)
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  EncodeTiled encode = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                         cudaEnableDefault, &found));
  const size_t w_bytes = (size_t)TASKS * BN * K * 2, a_bytes = (size_t)TILES * BM * K * 2;
  void *w, *a, *copy;
  unsigned* sink;
  CHECK(cudaMalloc(&w, w_bytes));
  CHECK(cudaMalloc(&a, a_bytes));
  CHECK(cudaMalloc(&copy, w_bytes / 2));
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  CHECK(cudaMemset(w, 1, w_bytes));
  CHECK(cudaMemset(a, 1, a_bytes));
  const CUtensorMap a_map = tensor_map(encode, a, (uint64_t)TILES * BM, K, 64);
  const Maps k_major{a_map, tensor_map(encode, w, (uint64_t)TASKS * BN, K, BN)};
  const Maps blocked{a_map, tensor_map(encode, w, (uint64_t)TASKS * BN * KT, BK, BN)};
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  const int reps = 5;
  float ms = 0;
  for (int r = 0; r < 2; ++r) CHECK(cudaMemcpy(copy, w, w_bytes / 2, cudaMemcpyDeviceToDevice));
  CHECK(cudaEventRecord(t0));
  for (int r = 0; r < reps; ++r) CHECK(cudaMemcpy(copy, w, w_bytes / 2, cudaMemcpyDeviceToDevice));
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  printf("{\"gpu\": \"%s\", \"sms\": %d, \"memcpy_read_write_gbps\": %.1f, \"tasks\": %d, \"task_bytes\": %d, "
         "\"stages\": %d, \"multiply_ns\": %d}\n",
         prop.name, prop.multiProcessorCount, reps * (double)w_bytes / (ms * 1e6), TASKS, BN * K * 2, STAGES,
         multiply_ns);
  const int smem = STAGES * STAGE_BYTES + 1024;
  CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const struct {
    int with_a, blocked, multiply;
  } variants[] = {{0, 0, 0}, {1, 0, 0}, {1, 0, 1}, {0, 1, 0}, {1, 1, 0}, {1, 1, 1}};
  for (const auto& v : variants) {
    const Maps& maps = v.blocked ? blocked : k_major;
    const int sleep = v.multiply ? multiply_ns : 0;
    for (int r = 0; r < 2; ++r) stream<<<prop.multiProcessorCount, 128, smem>>>(maps, v.with_a, v.blocked, sleep, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(t0));
    for (int r = 0; r < reps; ++r) stream<<<prop.multiProcessorCount, 128, smem>>>(maps, v.with_a, v.blocked, sleep, sink);
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    CHECK(cudaGetLastError());
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    ms /= reps;
    printf("{\"a\": %s, \"layout\": \"%s\", \"multiply_ns\": %d, \"ms\": %.4f, \"weight_gbps\": %.1f, "
           "\"us_per_task\": %.2f}\n",
           v.with_a ? "true" : "false", v.blocked ? "blocked" : "k-major", sleep, ms, w_bytes / (ms * 1e6),
           ms * 1e3 * prop.multiProcessorCount / TASKS);
  }
  return 0;
}
