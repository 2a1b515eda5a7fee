/*
 * A stand-in librknnrt.so for the tests: the documented int8 matmul API of the Rockchip runtime
 * (SDK 2.3.2) on a plain reference GEMM, so the Rust binding, its struct layouts and every layout
 * conversion go through a real dlopen without an RK3588.
 *
 * Modelled like the board where it matters to a caller:
 * - native layouts with the tile sizes reported in the tensor attributes, B split into segments of
 *   8192 K above that depth, as documented;
 * - cacheable memory has a CPU copy and a device copy: rknn_mem_sync moves data between them, the
 *   "NPU" reads and writes only the device copy, so a missing sync gives stale data here too;
 * - argument checks return RKNN_ERR_PARAM_INVALID (-5) as the runtime does.
 * Written from the public header documentation; nothing is copied from the vendor.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ERR_FAIL (-1)
#define ERR_PARAM_INVALID (-5)

enum { TILE_A_K = 16, TILE_B_N = 32, TILE_B_K = 32, TILE_C_N = 4, B_SEGMENT_K = 8192, MAX_K = 10240 };
enum { INT8_MM_INT8_TO_INT32 = 2, LAYOUT_NATIVE = 1, TENSOR_INT8 = 2, TENSOR_INT32 = 6 };
enum { MEM_NON_CACHEABLE = 1 << 1, SYNC_TO_DEVICE = 1, SYNC_FROM_DEVICE = 2 };

typedef uint64_t rknn_context;

typedef struct {
    int32_t M, K, N;
    int32_t type;
    int16_t B_layout, B_quant_type, AC_layout, AC_quant_type;
    int32_t iommu_domain_id;
    int16_t group_size;
    int8_t reserved[34];
} matmul_info;

typedef struct {
    char name[256];
    uint32_t n_dims;
    uint32_t dims[16];
    uint32_t size;
    int32_t type;
} tensor_attr;

typedef struct {
    tensor_attr A, B, C;
} io_attr;

typedef struct {
    void *virt_addr;
    uint64_t phys_addr;
    int32_t fd;
    int32_t offset;
    uint32_t size;
    uint32_t flags;
    void *priv_data;
} tensor_mem;

_Static_assert(sizeof(matmul_info) == 64, "rknn_matmul_info is 64 bytes");
_Static_assert(sizeof(tensor_attr) == 332, "rknn_matmul_tensor_attr is 332 bytes");
_Static_assert(sizeof(tensor_mem) == 40, "rknn_tensor_mem is 40 bytes on 64-bit");

/* A buffer: its CPU copy and what the device sees (the same memory when non-cacheable). */
typedef struct {
    int fd;
    uint8_t *cpu, *dev;
    size_t size;
    int cacheable;
} buffer;

/* What a tensor_mem refers to: a byte range of a buffer. */
typedef struct {
    buffer *buf;
    size_t offset;
    int owns;
} view;

typedef struct {
    matmul_info info;
    io_attr attr;
    tensor_mem *mem[3];
    int core_mask;
} matmul;

#define MAX_BUFFERS 65536
static buffer *registry[MAX_BUFFERS];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
enum { FD_BASE = 1000 };

static tensor_mem *new_mem(buffer *b, void *virt, size_t offset, uint32_t size, int owns) {
    tensor_mem *m = calloc(1, sizeof *m);
    view *v = calloc(1, sizeof *v);
    if (!m || !v) {
        free(m);
        free(v);
        return NULL;
    }
    v->buf = b;
    v->offset = offset;
    v->owns = owns;
    m->virt_addr = virt;
    m->fd = b->fd;
    m->offset = (int32_t)offset;
    m->size = size;
    m->priv_data = v;
    return m;
}

tensor_mem *rknn_create_mem2(rknn_context ctx, uint64_t size, uint64_t flags) {
    if (!ctx || size == 0 || size > UINT32_MAX) return NULL;
    buffer *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->size = size;
    b->cacheable = !(flags & MEM_NON_CACHEABLE);
    b->cpu = calloc(1, size);
    b->dev = b->cacheable ? calloc(1, size) : b->cpu;
    if (!b->cpu || !b->dev) {
        free(b->cpu);
        if (b->cacheable) free(b->dev);
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    int slot = -1;
    for (int i = 0; i < MAX_BUFFERS; i++) {
        if (!registry[i]) {
            registry[i] = b;
            slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (slot < 0) {
        free(b->cpu);
        if (b->cacheable) free(b->dev);
        free(b);
        return NULL;
    }
    b->fd = FD_BASE + slot;
    return new_mem(b, b->cpu, 0, (uint32_t)size, 1);
}

tensor_mem *rknn_create_mem(rknn_context ctx, uint32_t size) {
    return rknn_create_mem2(ctx, size, 0);
}

/* A view of an existing buffer: virt_addr is the buffer's address without the offset. */
tensor_mem *rknn_create_mem_from_fd(rknn_context ctx, int32_t fd, void *virt_addr, uint32_t size, int32_t offset) {
    if (!ctx || fd < FD_BASE || fd >= FD_BASE + MAX_BUFFERS || offset < 0) return NULL;
    pthread_mutex_lock(&registry_lock);
    buffer *b = registry[fd - FD_BASE];
    pthread_mutex_unlock(&registry_lock);
    if (!b || virt_addr != b->cpu || (size_t)offset + size > b->size) return NULL;
    return new_mem(b, virt_addr, (size_t)offset, size, 0);
}

int rknn_destroy_mem(rknn_context ctx, tensor_mem *mem) {
    if (!ctx || !mem) return ERR_PARAM_INVALID;
    view *v = mem->priv_data;
    if (v->owns) {
        buffer *b = v->buf;
        pthread_mutex_lock(&registry_lock);
        registry[b->fd - FD_BASE] = NULL;
        pthread_mutex_unlock(&registry_lock);
        if (b->cacheable) free(b->dev);
        free(b->cpu);
        free(b);
    }
    free(v);
    free(mem);
    return 0;
}

int rknn_mem_sync(rknn_context ctx, tensor_mem *mem, int mode) {
    if (!ctx || !mem || (mode & ~(SYNC_TO_DEVICE | SYNC_FROM_DEVICE)) || !mode) return ERR_PARAM_INVALID;
    view *v = mem->priv_data;
    buffer *b = v->buf;
    if (!b->cacheable) return 0;
    if (mode & SYNC_TO_DEVICE) memcpy(b->dev + v->offset, b->cpu + v->offset, mem->size);
    if (mode & SYNC_FROM_DEVICE) memcpy(b->cpu + v->offset, b->dev + v->offset, mem->size);
    return 0;
}

static void set_attr(tensor_attr *t, const char *name, uint32_t n_dims, const uint32_t *dims, uint32_t size, int32_t type) {
    memset(t, 0, sizeof *t);
    strncpy(t->name, name, sizeof t->name - 1);
    t->n_dims = n_dims;
    memcpy(t->dims, dims, n_dims * sizeof *dims);
    t->size = size;
    t->type = type;
}

int rknn_matmul_create(rknn_context *ctx, matmul_info *info, io_attr *attr) {
    if (!ctx || !info || !attr) return ERR_PARAM_INVALID;
    int32_t M = info->M, K = info->K, N = info->N;
    if (info->type != INT8_MM_INT8_TO_INT32 || info->B_layout != LAYOUT_NATIVE || info->AC_layout != LAYOUT_NATIVE ||
        info->B_quant_type != 0 || info->AC_quant_type != 0 || M <= 0 || K <= 0 || N <= 0 || K % 32 || N % 32 ||
        K > MAX_K || info->iommu_domain_id < 0 || info->iommu_domain_id > 7)
        return ERR_PARAM_INVALID;
    matmul *mm = calloc(1, sizeof *mm);
    if (!mm) return ERR_FAIL;
    mm->info = *info;
    uint32_t a_dims[3] = {K / TILE_A_K, M, TILE_A_K};
    uint32_t b_dims[4] = {N / TILE_B_N, (K < B_SEGMENT_K ? K : B_SEGMENT_K) / TILE_B_K, TILE_B_N, TILE_B_K};
    uint32_t c_dims[3] = {N / TILE_C_N, M, TILE_C_N};
    set_attr(&mm->attr.A, "A", 3, a_dims, (uint32_t)(M * K), TENSOR_INT8);
    set_attr(&mm->attr.B, "B", 4, b_dims, (uint32_t)(K * N), TENSOR_INT8);
    set_attr(&mm->attr.C, "C", 3, c_dims, (uint32_t)(M * N * 4), TENSOR_INT32);
    *attr = mm->attr;
    *ctx = (rknn_context)(uintptr_t)mm;
    return 0;
}

int rknn_matmul_set_io_mem(rknn_context ctx, tensor_mem *mem, tensor_attr *attr) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm || !mem || !attr || mem->size < attr->size) return ERR_PARAM_INVALID;
    int slot = attr->name[0] == 'A' ? 0 : attr->name[0] == 'B' ? 1 : attr->name[0] == 'C' ? 2 : -1;
    if (slot < 0 || attr->name[1] != 0) return ERR_PARAM_INVALID;
    const tensor_attr *own = slot == 0 ? &mm->attr.A : slot == 1 ? &mm->attr.B : &mm->attr.C;
    if (attr->size != own->size) return ERR_PARAM_INVALID;
    mm->mem[slot] = mem;
    return 0;
}

int rknn_matmul_set_core_mask(rknn_context ctx, int mask) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm) return ERR_PARAM_INVALID;
    switch (mask) {
    case 0: case 1: case 2: case 4: case 3: case 7: case 0xffff:
        mm->core_mask = mask;
        return 0;
    default:
        return ERR_PARAM_INVALID;
    }
}

static uint8_t *device_bytes(const tensor_mem *m) {
    const view *v = m->priv_data;
    return v->buf->dev + v->offset;
}

/* Native B: segments of at most B_SEGMENT_K depth, each [N/bn][Kseg/bk][bn][bk]. */
static size_t b_index(int32_t K, int32_t N, int32_t n, int32_t k) {
    int32_t seg = k / B_SEGMENT_K, k0 = seg * B_SEGMENT_K;
    int32_t kseg = K - k0 < B_SEGMENT_K ? K - k0 : B_SEGMENT_K, kk = k - k0;
    return (size_t)k0 * N + (size_t)(n / TILE_B_N) * TILE_B_N * kseg + (size_t)(kk / TILE_B_K) * TILE_B_N * TILE_B_K +
           (size_t)(n % TILE_B_N) * TILE_B_K + kk % TILE_B_K;
}

int rknn_matmul_run(rknn_context ctx) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm || !mm->mem[0] || !mm->mem[1] || !mm->mem[2]) return ERR_PARAM_INVALID;
    int32_t M = mm->info.M, K = mm->info.K, N = mm->info.N;
    const int8_t *a = (const int8_t *)device_bytes(mm->mem[0]);
    const int8_t *b = (const int8_t *)device_bytes(mm->mem[1]);
    uint8_t *c = device_bytes(mm->mem[2]);
    for (int32_t n = 0; n < N; n++) {
        for (int32_t m = 0; m < M; m++) {
            int32_t acc = 0;
            for (int32_t k = 0; k < K; k++) {
                int32_t av = a[(size_t)(k / TILE_A_K) * M * TILE_A_K + (size_t)m * TILE_A_K + k % TILE_A_K];
                acc += av * b[b_index(K, N, n, k)];
            }
            size_t ci = (size_t)(n / TILE_C_N) * M * TILE_C_N + (size_t)m * TILE_C_N + n % TILE_C_N;
            memcpy(c + ci * 4, &acc, 4);
        }
    }
    return 0;
}

int rknn_matmul_destroy(rknn_context ctx) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm) return ERR_PARAM_INVALID;
    free(mm);
    return 0;
}
