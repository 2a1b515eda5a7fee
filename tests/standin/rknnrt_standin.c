/*
 * A stand-in librknnrt.so for the tests: the documented int8 matmul API of the Rockchip runtime
 * (SDK 2.3.2) on a plain reference GEMM, so the Rust binding, its struct layouts and every layout
 * conversion go through a real dlopen without an RK3588.
 *
 * Modelled like the board where it matters to a caller:
 * - native layouts with the tile sizes reported in the tensor attributes, B split into segments of
 *   8192 K above that depth (reported in B's dims), K <= 10240, K and N multiples of 32;
 * - static and dynamic-shape contexts (up to 512 M values; set_io_mem after set_dynamic_shape, which
 *   drops the A and C bindings);
 * - cacheable memory has a CPU copy and a device copy: rknn_mem_sync moves data between them, the
 *   "NPU" reads and writes only the device copy, so a missing sync gives stale data here too;
 * - memory belongs to an IOMMU domain (that of the context it was created on) and a context refuses
 *   memory of another domain;
 * - argument checks return RKNN_ERR_PARAM_INVALID (-5) and print vendor-style `E RKNN: [time] ...`
 *   lines on stderr, as the runtime does.
 * And it checks what the runtime leaves undocumented, counting every breach as a violation:
 * - views (rknn_create_mem_from_fd) are counted imports; destroying a buffer while views of it live, or
 *   using such a view afterwards, is a violation (the use fails);
 * - two rknn_matmul_set_io_mem calls binding one buffer at the same time are a violation (the second
 *   fails); overlapping binds of different buffers are only counted.
 *
 * Behaviour switches, from the RKNN_STANDIN environment variable when the library loads, or from
 * rknn_standin_configure() (tests), as comma-separated words:
 *   cores=1         a single-core NPU (RK3566/RK3568): rknn_matmul_set_core_mask returns -1
 *   no_device=1     no NPU: rknn_matmul_create returns -1, rknn_create_mem2 NULL, with the runtime's lines
 *   bind_us=N       each set_io_mem holds its buffer N microseconds (widens the window of the check above)
 *   run_us=N        each rknn_matmul_run takes at least N microseconds, blocking its thread as the runtime's
 *                   does (a slow NPU: what the caller's threads do while they wait shows)
 *   skew_after=N    contexts created after the N-th report RK3566's B tile (16 x 32) instead of 32 x 32
 *   domain_mb=N     each IOMMU domain holds at most N MiB; a fuller one fails rknn_create_mem2
 *   fail=KIND:N     the N-th call of KIND fails (N+ : that one and every later one); KIND is alloc
 *                   (rknn_create_mem2), import (rknn_create_mem_from_fd), create (matmul contexts), run,
 *                   sync, bind (set_io_mem), or wrong (the N-th run succeeds with one wrong output value, a
 *                   runtime that computes wrongly). May be given several times.
 * Build flags: -DSTANDIN_SDK=16 is runtime 1.6.0 (no rknn_create_mem2, no dynamic shapes), -DSTANDIN_SDK=20
 * is 2.0.0b0 (dynamic shapes under their first name, rknn_matmul_create_dyn_shape). The version string is
 * embedded as the vendor's is ("librknnrt version: ...").
 * Written from the public header documentation; nothing is copied from the vendor.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef STANDIN_SDK
#define STANDIN_SDK 232
#endif
#if STANDIN_SDK == 16
#define STANDIN_VERSION "1.6.0"
#elif STANDIN_SDK == 20
#define STANDIN_VERSION "2.0.0b0"
#else
#define STANDIN_VERSION "2.3.2"
#endif

/* What `strings librknnrt.so | grep 'librknnrt version'` finds in the vendor's library. */
__attribute__((used)) const char rknn_standin_version[] = "librknnrt version: " STANDIN_VERSION " (ork-moe stand-in)";

#define ERR_FAIL (-1)
#define ERR_PARAM_INVALID (-5)

enum { TILE_A_K = 16, TILE_B_N = 32, TILE_B_K = 32, TILE_C_N = 4, SKEW_B_N = 16 };
enum { B_SEGMENT_K = 8192, MAX_K = 10240, MAX_DOMAINS = 16, MAX_SHAPES = 512 };
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
    int32_t M, K, N;
} matmul_shape;

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
_Static_assert(sizeof(matmul_shape) == 12, "rknn_matmul_shape is 12 bytes");

/* ---- configuration, counters, faults ---- */

enum { F_ALLOC, F_IMPORT, F_CREATE, F_RUN, F_SYNC, F_BIND, F_WRONG, F_KINDS };
static const char *const fault_names[F_KINDS] = {"alloc", "import", "create", "run", "sync", "bind", "wrong"};
enum { MAX_FAULTS = 16 };

static struct {
    int cores, no_device, bind_us, run_us, skew_after;
    uint64_t domain_bytes;
    int n_faults;
    struct {
        int kind;
        long nth;
        int onward;
    } faults[MAX_FAULTS];
} cfg = {.cores = 3};

/* Read by the tests through rknn_standin_counters(); the layout is mirrored there. */
typedef struct {
    uint64_t imports, live_views, live_buffers, contexts_created, live_contexts, binds, runs, violations,
        overlapping_binds, core_mask_refused, shape_switches, faults_injected;
} standin_counters;

static _Atomic uint64_t c_imports, c_live_views, c_live_buffers, c_contexts_created, c_live_contexts, c_binds,
    c_runs, c_violations, c_overlapping_binds, c_core_mask_refused, c_shape_switches, c_faults_injected;
static _Atomic long calls[F_KINDS];
static atomic_int binds_in_flight;

static void rk_log(const char *fmt, ...) {
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "E RKNN: [%02d:%02d:%02d.%03d] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
            msg);
}

static void violation(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&c_violations, 1);
    rk_log("%s", msg);
}

/* Counts a call of `kind`; true when an injected fault says it fails. */
static int injected(int kind) {
    long n = atomic_fetch_add(&calls[kind], 1) + 1;
    for (int i = 0; i < cfg.n_faults; i++) {
        if (cfg.faults[i].kind == kind && (n == cfg.faults[i].nth || (cfg.faults[i].onward && n > cfg.faults[i].nth))) {
            atomic_fetch_add(&c_faults_injected, 1);
            return 1;
        }
    }
    return 0;
}

static int parse_fault(const char *v) {
    const char *colon = strchr(v, ':');
    if (!colon || cfg.n_faults == MAX_FAULTS) return -1;
    for (int k = 0; k < F_KINDS; k++) {
        if (strlen(fault_names[k]) == (size_t)(colon - v) && !strncmp(v, fault_names[k], (size_t)(colon - v))) {
            char *end;
            long nth = strtol(colon + 1, &end, 10);
            if (nth < 1 || (*end && strcmp(end, "+"))) return -1;
            cfg.faults[cfg.n_faults].kind = k;
            cfg.faults[cfg.n_faults].nth = nth;
            cfg.faults[cfg.n_faults].onward = *end == '+';
            cfg.n_faults++;
            return 0;
        }
    }
    return -1;
}

/* Applies a spec (see the top of the file); 0, or -1 on a word it does not know. */
int rknn_standin_configure(const char *spec) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    int ret = 0;
    char *save = NULL;
    for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(w, '=');
        if (!eq) {
            ret = -1;
            continue;
        }
        *eq = 0;
        const char *v = eq + 1;
        if (!strcmp(w, "cores")) cfg.cores = atoi(v);
        else if (!strcmp(w, "no_device")) cfg.no_device = atoi(v);
        else if (!strcmp(w, "bind_us")) cfg.bind_us = atoi(v);
        else if (!strcmp(w, "run_us")) cfg.run_us = atoi(v);
        else if (!strcmp(w, "skew_after")) cfg.skew_after = atoi(v);
        else if (!strcmp(w, "domain_mb")) cfg.domain_bytes = (uint64_t)atoll(v) << 20;
        else if (!strcmp(w, "fail")) ret |= parse_fault(v);
        else ret = -1;
    }
    return ret;
}

void rknn_standin_counters(standin_counters *out) {
    out->imports = c_imports;
    out->live_views = c_live_views;
    out->live_buffers = c_live_buffers;
    out->contexts_created = c_contexts_created;
    out->live_contexts = c_live_contexts;
    out->binds = c_binds;
    out->runs = c_runs;
    out->violations = c_violations;
    out->overlapping_binds = c_overlapping_binds;
    out->core_mask_refused = c_core_mask_refused;
    out->shape_switches = c_shape_switches;
    out->faults_injected = c_faults_injected;
}

__attribute__((constructor)) static void load_config(void) {
    const char *spec = getenv("RKNN_STANDIN");
    if (spec && rknn_standin_configure(spec)) rk_log("RKNN_STANDIN=%s: unknown words ignored", spec);
}

/* ---- memory ---- */

/* A buffer: its CPU copy and what the device sees (the same memory when non-cacheable). */
typedef struct {
    int fd, domain, cacheable;
    uint8_t *cpu, *dev;
    size_t size;
    int destroyed;     /* its owner destroyed it while views lived */
    int views;         /* live views */
    atomic_int binding; /* set_io_mem calls binding it right now */
} buffer;

/* What a tensor_mem refers to: a byte range of a buffer. */
typedef struct {
    buffer *buf;
    size_t offset;
    int owns;
} view;

#define MAX_BUFFERS 65536
static buffer *registry[MAX_BUFFERS];
static uint64_t domain_used[MAX_DOMAINS];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
enum { FD_BASE = 1000 };

typedef struct {
    matmul_info info;
    int n_shapes, cur; /* cur: the shape set_io_mem and run use; -1 before set_dynamic_shape */
    matmul_shape *shapes;
    io_attr *attrs;
    tensor_mem *mem[3];
    int core_mask, dynamic;
} matmul;

static int ctx_domain(rknn_context ctx) { return ((matmul *)(uintptr_t)ctx)->info.iommu_domain_id; }

static void free_buffer(buffer *b) {
    if (b->cacheable) free(b->dev);
    free(b->cpu);
    free(b);
}

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

/* The buffer behind `mem`, or NULL (with a violation) if its owner already destroyed it. */
static buffer *live_buffer(const tensor_mem *mem, const char *what) {
    const view *v = mem->priv_data;
    if (v->buf->destroyed) {
        violation("%s: memory fd %d offset %zu is a view of a buffer already destroyed", what, mem->fd, v->offset);
        return NULL;
    }
    return v->buf;
}

static tensor_mem *alloc_mem(rknn_context ctx, uint64_t size, uint64_t flags) {
    if (!ctx || size == 0 || size > UINT32_MAX) return NULL;
    if (cfg.no_device) return NULL;
    if (injected(F_ALLOC)) {
        rk_log("failed to allocate memory, size: %llu (injected fault)", (unsigned long long)size);
        return NULL;
    }
    int domain = ctx_domain(ctx);
    buffer *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->size = size;
    b->domain = domain;
    b->cacheable = !(flags & MEM_NON_CACHEABLE);
    b->cpu = calloc(1, size);
    b->dev = b->cacheable ? calloc(1, size) : b->cpu;
    if (!b->cpu || !b->dev) {
        free_buffer(b);
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    int slot = -1;
    if (!cfg.domain_bytes || domain_used[domain] + size <= cfg.domain_bytes) {
        for (int i = 0; i < MAX_BUFFERS; i++) {
            if (!registry[i]) {
                registry[i] = b;
                slot = i;
                domain_used[domain] += size;
                break;
            }
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (slot < 0) {
        rk_log("failed to allocate memory, size: %llu, iommu domain %d is full", (unsigned long long)size, domain);
        free_buffer(b);
        return NULL;
    }
    b->fd = FD_BASE + slot;
    atomic_fetch_add(&c_live_buffers, 1);
    return new_mem(b, b->cpu, 0, (uint32_t)size, 1);
}

tensor_mem *rknn_create_mem(rknn_context ctx, uint32_t size) { return alloc_mem(ctx, size, 0); }

#if STANDIN_SDK != 16
tensor_mem *rknn_create_mem2(rknn_context ctx, uint64_t size, uint64_t flags) { return alloc_mem(ctx, size, flags); }
#endif

/* A view of an existing buffer: virt_addr is the buffer's address without the offset. */
tensor_mem *rknn_create_mem_from_fd(rknn_context ctx, int32_t fd, void *virt_addr, uint32_t size, int32_t offset) {
    if (!ctx || fd < FD_BASE || fd >= FD_BASE + MAX_BUFFERS) return NULL;
    if (offset < 0) {
        rk_log("rknn_create_mem_from_fd: invalid offset %d", offset);
        return NULL;
    }
    if (injected(F_IMPORT)) {
        rk_log("failed to convert fd(%d) to handle (injected fault)", fd);
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    buffer *b = registry[fd - FD_BASE];
    int ok = b && !b->destroyed && virt_addr == b->cpu && (size_t)offset + size <= b->size;
    if (ok) b->views++;
    pthread_mutex_unlock(&registry_lock);
    if (!ok) {
        rk_log("rknn_create_mem_from_fd: fd %d, offset %d, size %u is no range of a live buffer", fd, offset, size);
        return NULL;
    }
    tensor_mem *m = new_mem(b, virt_addr, (size_t)offset, size, 0);
    if (!m) return NULL;
    atomic_fetch_add(&c_imports, 1);
    atomic_fetch_add(&c_live_views, 1);
    return m;
}

int rknn_destroy_mem(rknn_context ctx, tensor_mem *mem) {
    if (!ctx || !mem) return ERR_PARAM_INVALID;
    view *v = mem->priv_data;
    buffer *b = v->buf;
    int free_it = 0;
    pthread_mutex_lock(&registry_lock);
    if (v->owns) {
        registry[b->fd - FD_BASE] = NULL;
        domain_used[b->domain] -= b->size;
        if (b->views) b->destroyed = 1;
        else free_it = 1;
        atomic_fetch_sub(&c_live_buffers, 1);
    } else {
        b->views--;
        free_it = b->destroyed && !b->views;
        atomic_fetch_sub(&c_live_views, 1);
    }
    int orphaned = v->owns && b->destroyed ? b->views : 0;
    pthread_mutex_unlock(&registry_lock);
    if (orphaned) violation("rknn_destroy_mem: memory fd %d destroyed while %d views of it live", b->fd, orphaned);
    /* A buffer outlives its owner's destroy while views of it live, so that their use is caught, not UB. */
    if (free_it) free_buffer(b);
    free(v);
    free(mem);
    return 0;
}

int rknn_mem_sync(rknn_context ctx, tensor_mem *mem, int mode) {
    if (!ctx || !mem || (mode & ~(SYNC_TO_DEVICE | SYNC_FROM_DEVICE)) || !mode) return ERR_PARAM_INVALID;
    buffer *b = live_buffer(mem, "rknn_mem_sync");
    if (!b) return ERR_FAIL;
    if (injected(F_SYNC)) {
        rk_log("failed to sync memory fd %d (injected fault)", mem->fd);
        return ERR_FAIL;
    }
    const view *v = mem->priv_data;
    if (!b->cacheable) return 0;
    if (mode & SYNC_TO_DEVICE) memcpy(b->dev + v->offset, b->cpu + v->offset, mem->size);
    if (mode & SYNC_FROM_DEVICE) memcpy(b->cpu + v->offset, b->dev + v->offset, mem->size);
    return 0;
}

/* ---- matmul contexts ---- */

static void set_attr(tensor_attr *t, const char *name, uint32_t n_dims, const uint32_t *dims, uint32_t size, int32_t type) {
    memset(t, 0, sizeof *t);
    strncpy(t->name, name, sizeof t->name - 1);
    t->n_dims = n_dims;
    memcpy(t->dims, dims, n_dims * sizeof *dims);
    t->size = size;
    t->type = type;
}

/* The attributes the runtime reports for one shape; B's dims are those of its first K-segment. */
static void shape_attrs(io_attr *attr, int32_t M, int32_t K, int32_t N, int skewed) {
    uint32_t b_n = skewed ? SKEW_B_N : TILE_B_N;
    uint32_t a_dims[3] = {K / TILE_A_K, M, TILE_A_K};
    uint32_t b_dims[4] = {N / b_n, (K < B_SEGMENT_K ? K : B_SEGMENT_K) / TILE_B_K, b_n, TILE_B_K};
    uint32_t c_dims[3] = {N / TILE_C_N, M, TILE_C_N};
    set_attr(&attr->A, "A", 3, a_dims, (uint32_t)(M * K), TENSOR_INT8);
    set_attr(&attr->B, "B", 4, b_dims, (uint32_t)(K * N), TENSOR_INT8);
    set_attr(&attr->C, "C", 3, c_dims, (uint32_t)(M * N * 4), TENSOR_INT32);
}

static int check_shape(const matmul_info *info, int32_t M, int32_t K, int32_t N) {
    if (M <= 0 || K <= 0 || N <= 0) {
        rk_log("invalid matmul shape M=%d K=%d N=%d", M, K, N);
        return ERR_PARAM_INVALID;
    }
    if (K % 32 || N % 32) {
        rk_log("int8 matmul needs K and N aligned to 32, got K=%d N=%d", K, N);
        return ERR_PARAM_INVALID;
    }
    if (K > MAX_K) {
        rk_log("matmul K=%d exceeds the limit %d", K, MAX_K);
        return ERR_PARAM_INVALID;
    }
    if (info->type != INT8_MM_INT8_TO_INT32 || info->B_layout != LAYOUT_NATIVE || info->AC_layout != LAYOUT_NATIVE ||
        info->B_quant_type != 0 || info->AC_quant_type != 0) {
        rk_log("the stand-in supports native int8 x int8 -> int32 only (type %d, layouts %d/%d)", info->type,
               info->B_layout, info->AC_layout);
        return ERR_PARAM_INVALID;
    }
    if (info->iommu_domain_id < 0 || info->iommu_domain_id >= MAX_DOMAINS) {
        rk_log("invalid iommu domain id %d", info->iommu_domain_id);
        return ERR_PARAM_INVALID;
    }
    return 0;
}

/* What a create call does before it builds anything: no device, injected faults, the info fields. */
static int create_prologue(rknn_context *ctx, matmul_info *info, void *attr) {
    if (!ctx || !info || !attr) return ERR_PARAM_INVALID;
    if (cfg.no_device) {
        rk_log("failed to open rknpu module, need to insmod rknpu dirver!");
        rk_log("failed to open rknn device!");
        return ERR_FAIL;
    }
    if (injected(F_CREATE)) {
        rk_log("failed to create matmul context (injected fault)");
        return ERR_FAIL;
    }
    return 0;
}

static int finish_create(rknn_context *ctx, matmul *mm) {
    long n = (long)atomic_fetch_add(&c_contexts_created, 1) + 1;
    int skewed = cfg.skew_after && n > cfg.skew_after;
    for (int i = 0; i < mm->n_shapes; i++)
        shape_attrs(&mm->attrs[i], mm->shapes[i].M, mm->shapes[i].K, mm->shapes[i].N, skewed);
    atomic_fetch_add(&c_live_contexts, 1);
    *ctx = (rknn_context)(uintptr_t)mm;
    return 0;
}

static matmul *new_matmul(const matmul_info *info, int n_shapes) {
    matmul *mm = calloc(1, sizeof *mm);
    if (!mm) return NULL;
    mm->shapes = calloc((size_t)n_shapes, sizeof *mm->shapes);
    mm->attrs = calloc((size_t)n_shapes, sizeof *mm->attrs);
    if (!mm->shapes || !mm->attrs) {
        free(mm->shapes);
        free(mm->attrs);
        free(mm);
        return NULL;
    }
    mm->info = *info;
    mm->n_shapes = n_shapes;
    return mm;
}

int rknn_matmul_create(rknn_context *ctx, matmul_info *info, io_attr *attr) {
    int ret = create_prologue(ctx, info, attr);
    if (ret) return ret;
    if ((ret = check_shape(info, info->M, info->K, info->N))) return ret;
    matmul *mm = new_matmul(info, 1);
    if (!mm) return ERR_FAIL;
    mm->shapes[0] = (matmul_shape){info->M, info->K, info->N};
    finish_create(ctx, mm);
    *attr = mm->attrs[0];
    return 0;
}

#if STANDIN_SDK != 16
static int create_dynamic(rknn_context *ctx, matmul_info *info, int shape_num, matmul_shape shapes[], io_attr io_attrs[]) {
    int ret = create_prologue(ctx, info, io_attrs);
    if (ret) return ret;
    if (!shapes || shape_num < 1 || shape_num > MAX_SHAPES) {
        rk_log("invalid dynamic shape number %d (1..%d)", shape_num, MAX_SHAPES);
        return ERR_PARAM_INVALID;
    }
    for (int i = 0; i < shape_num; i++) {
        if ((ret = check_shape(info, shapes[i].M, shapes[i].K, shapes[i].N))) return ret;
        /* B is bound once per context in the native layout, so K and N cannot vary. */
        if (shapes[i].K != shapes[0].K || shapes[i].N != shapes[0].N) {
            rk_log("dynamic shapes with a native B must share K and N (shape %d: K=%d N=%d)", i, shapes[i].K,
                   shapes[i].N);
            return ERR_PARAM_INVALID;
        }
    }
    matmul *mm = new_matmul(info, shape_num);
    if (!mm) return ERR_FAIL;
    memcpy(mm->shapes, shapes, (size_t)shape_num * sizeof *shapes);
    mm->dynamic = 1;
    mm->cur = -1;
    finish_create(ctx, mm);
    memcpy(io_attrs, mm->attrs, (size_t)shape_num * sizeof *io_attrs);
    return 0;
}

#if STANDIN_SDK == 20
int rknn_matmul_create_dyn_shape(rknn_context *ctx, matmul_info *info, int shape_num, matmul_shape shapes[],
                                 io_attr io_attrs[]) {
    return create_dynamic(ctx, info, shape_num, shapes, io_attrs);
}
#else
int rknn_matmul_create_dynamic_shape(rknn_context *ctx, matmul_info *info, int shape_num, matmul_shape shapes[],
                                     io_attr io_attrs[]) {
    return create_dynamic(ctx, info, shape_num, shapes, io_attrs);
}
#endif

int rknn_matmul_set_dynamic_shape(rknn_context ctx, matmul_shape *shape) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm || !shape) return ERR_PARAM_INVALID;
    if (!mm->dynamic) {
        rk_log("rknn_matmul_set_dynamic_shape on a context created without dynamic shapes");
        return ERR_PARAM_INVALID;
    }
    for (int i = 0; i < mm->n_shapes; i++) {
        if (mm->shapes[i].M == shape->M && mm->shapes[i].K == shape->K && mm->shapes[i].N == shape->N) {
            if (mm->cur != i) atomic_fetch_add(&c_shape_switches, 1);
            mm->cur = i;
            /* A and C change size with M: they must be bound again. */
            mm->mem[0] = mm->mem[2] = NULL;
            return 0;
        }
    }
    rk_log("shape M=%d K=%d N=%d is not one of the context's dynamic shapes", shape->M, shape->K, shape->N);
    return ERR_PARAM_INVALID;
}
#endif

int rknn_matmul_set_io_mem(rknn_context ctx, tensor_mem *mem, tensor_attr *attr) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm || !mem || !attr) return ERR_PARAM_INVALID;
    atomic_fetch_add(&c_binds, 1);
    if (mm->dynamic && mm->cur < 0) {
        rk_log("rknn_matmul_set_io_mem must be called after rknn_matmul_set_dynamic_shape");
        return ERR_PARAM_INVALID;
    }
    int slot = attr->name[0] == 'A' ? 0 : attr->name[0] == 'B' ? 1 : attr->name[0] == 'C' ? 2 : -1;
    if (slot < 0 || attr->name[1] != 0) return ERR_PARAM_INVALID;
    const io_attr *cur = &mm->attrs[mm->dynamic ? mm->cur : 0];
    const tensor_attr *own = slot == 0 ? &cur->A : slot == 1 ? &cur->B : &cur->C;
    if (attr->size != own->size || mem->size < own->size) {
        rk_log("set_io_mem %s: tensor size %u, memory size %u, expected %u", own->name, attr->size, mem->size,
               own->size);
        return ERR_PARAM_INVALID;
    }
    buffer *b = live_buffer(mem, "rknn_matmul_set_io_mem");
    if (!b) return ERR_FAIL;
    if (b->domain != mm->info.iommu_domain_id) {
        rk_log("set_io_mem %s: memory of iommu domain %d on a context of domain %d", own->name, b->domain,
               mm->info.iommu_domain_id);
        return ERR_PARAM_INVALID;
    }
    if (injected(F_BIND)) {
        rk_log("set_io_mem %s failed (injected fault)", own->name);
        return ERR_FAIL;
    }
    if (atomic_fetch_add(&binds_in_flight, 1) > 0) atomic_fetch_add(&c_overlapping_binds, 1);
    int clash = atomic_fetch_add(&b->binding, 1) > 0;
    if (cfg.bind_us) usleep((useconds_t)cfg.bind_us);
    atomic_fetch_sub(&b->binding, 1);
    atomic_fetch_sub(&binds_in_flight, 1);
    if (clash) {
        violation("set_io_mem %s: memory fd %d is being bound on another context at the same time", own->name, mem->fd);
        return ERR_FAIL;
    }
    mm->mem[slot] = mem;
    return 0;
}

int rknn_matmul_set_core_mask(rknn_context ctx, int mask) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm) return ERR_PARAM_INVALID;
    if (cfg.cores == 1) {
        atomic_fetch_add(&c_core_mask_refused, 1);
        rk_log("rknn_matmul_set_core_mask: not supported on a single-core NPU");
        return ERR_FAIL;
    }
    switch (mask) {
    case 0: case 1: case 2: case 4: case 3: case 7: case 0xffff:
        mm->core_mask = mask;
        return 0;
    default:
        rk_log("invalid core mask %d", mask);
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
    if (!mm) return ERR_PARAM_INVALID;
    if (!mm->mem[0] || !mm->mem[1] || !mm->mem[2]) {
        rk_log("rknn_matmul_run: A, B and C must be set first");
        return ERR_PARAM_INVALID;
    }
    for (int i = 0; i < 3; i++)
        if (!live_buffer(mm->mem[i], "rknn_matmul_run")) return ERR_FAIL;
    if (injected(F_RUN)) {
        rk_log("failed to submit!, matmul task (injected fault)");
        return ERR_FAIL;
    }
    atomic_fetch_add(&c_runs, 1);
    const matmul_shape *s = &mm->shapes[mm->dynamic ? mm->cur : 0];
    int32_t M = s->M, K = s->K, N = s->N;
    const int8_t *a = (const int8_t *)device_bytes(mm->mem[0]);
    const int8_t *b = (const int8_t *)device_bytes(mm->mem[1]);
    uint8_t *c = device_bytes(mm->mem[2]);
    /* K is a multiple of TILE_B_K (create refuses others): each TILE_B_K run of k is contiguous in B and
     * each TILE_A_K run in A, so the inner loop reads both sequentially. */
    for (int32_t n = 0; n < N; n++) {
        for (int32_t m = 0; m < M; m++) {
            int32_t acc = 0;
            for (int32_t k0 = 0; k0 < K; k0 += TILE_A_K) {
                const int8_t *ak = a + (size_t)(k0 / TILE_A_K) * M * TILE_A_K + (size_t)m * TILE_A_K;
                const int8_t *bk = b + b_index(K, N, n, k0);
                for (int32_t k = 0; k < TILE_A_K; k++) acc += ak[k] * bk[k];
            }
            size_t ci = (size_t)(n / TILE_C_N) * M * TILE_C_N + (size_t)m * TILE_C_N + n % TILE_C_N;
            memcpy(c + ci * 4, &acc, 4);
        }
    }
    if (injected(F_WRONG)) c[0] ^= 1;
    if (cfg.run_us) usleep((useconds_t)cfg.run_us);
    return 0;
}

int rknn_matmul_destroy(rknn_context ctx) {
    matmul *mm = (matmul *)(uintptr_t)ctx;
    if (!mm) return ERR_PARAM_INVALID;
    free(mm->shapes);
    free(mm->attrs);
    free(mm);
    atomic_fetch_sub(&c_live_contexts, 1);
    return 0;
}
