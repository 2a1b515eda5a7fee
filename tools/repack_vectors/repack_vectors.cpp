// Test vectors for the library's repacked-layout inflate, made by ggml's own repack code.
//
// For each weight type the library supports, writes deterministic plain GGML blocks (realistic fp16
// scales plus edge cases) into a 3-D tensor [K, N, experts] allocated in the CPU backend's CPU_REPACK
// buffer type, lets ggml repack it (set_tensor), and writes out the plain bytes and the repacked bytes.
// ggml picks the layout from the instruction sets it was built for (and, for SVE, the vector length it
// runs on); this program does not guess it: it reads ggml's choice from the tensor_traits object ggml
// attached to the tensor (its dynamic type names the block type, the interleave size and the row count).
//
// Usage: repack_vectors OUT_DIR
// Writes OUT_DIR/plain-<type>-k<K>-n<N>-e<E>.bin and OUT_DIR/<layout>-k<K>-n<N>-e<E>.bin, each a header
// line ("ork-repack-vectors 1 key=value ...\n") followed by the tensor's bytes, and prints one line per
// type saying which layout ggml chose. Built by tools/repack_vectors/make.sh against the pinned ggml.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "traits.h"  // ggml-cpu's internal tensor_traits: what ggml stores in tensor->extra

#include <cxxabi.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

// SplitMix64: the same data on every architecture (no floating point in the generator).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint32_t below(uint32_t n) { return (uint32_t) ((next() >> 32) * n >> 32); }
    void     fill(uint8_t * p, size_t n) {
        for (size_t i = 0; i < n; i++) {
            p[i] = (uint8_t) next();
        }
    }
};

// fp16 values that stress an inflater: zeros of both signs, subnormals, the smallest normal, the extremes.
const uint16_t SPECIAL_HALVES[] = { 0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00 };

// A weight-like fp16 scale: |d| in [2^-10, 2^-5) (what quantized LLM weights carry), or, in one block
// of eight, one of SPECIAL_HALVES. `positive`: K-quant super-block scales, which quantizers emit >= 0.
uint16_t scale_half(Rng & rng, bool positive) {
    if (rng.below(8) == 0) {
        return SPECIAL_HALVES[rng.below(sizeof SPECIAL_HALVES / sizeof SPECIAL_HALVES[0])];
    }
    const uint16_t exponent = (uint16_t) (5 + rng.below(5));  // biased: 2^(e-15)
    const uint16_t mantissa = (uint16_t) rng.below(1024);
    const uint16_t sign     = (!positive && rng.below(2)) ? 0x8000 : 0;
    return (uint16_t) (sign | exponent << 10 | mantissa);
}

void put_half(uint8_t * p, uint16_t h) {
    p[0] = (uint8_t) h;
    p[1] = (uint8_t) (h >> 8);
}

// Offsets of the fp16 fields in one block of `type` (ggml-common.h's structs), and whether they are
// K-quant super-block scales.
std::vector<size_t> half_offsets(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_IQ4_NL: return { 0 };
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: return { 0, 2 };
        case GGML_TYPE_Q2_K: return { 80, 82 };
        case GGML_TYPE_Q6_K: return { 208 };
        default: return {};
    }
}

// MXFP4's E8M0 block scale: 2^-10 .. 2^-6 (times its codes' 0.5 .. 6), or, in one block of eight, the
// smallest, 1, 2 or the largest whose weights are finite (252; 253 .. 255 give infinities).
uint8_t scale_e8m0(Rng & rng) {
    const uint8_t special[] = { 0, 127, 128, 252 };
    return rng.below(8) == 0 ? special[rng.below(4)] : (uint8_t) (118 + rng.below(5));
}

// Plain blocks for `rows` rows of `k` weights: random quants, sub-block scales and mins (every code
// occurs, Q8_0's -128 and Q6_K's -128 scale included), weight-like fp16 (MXFP4: E8M0) scales, and every
// seventh row (starting at row 3) all zero, as pruned or dead channels are.
std::vector<uint8_t> plain_blocks(ggml_type type, int64_t k, int64_t rows, Rng & rng) {
    const size_t row_bytes = ggml_row_size(type, k), block_bytes = ggml_type_size(type);
    std::vector<uint8_t> data(rows * row_bytes);
    rng.fill(data.data(), data.size());
    const bool k_quant =
        type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t * row = data.data() + r * row_bytes;
        if (r % 7 == 3) {
            memset(row, 0, row_bytes);
            continue;
        }
        for (size_t b = 0; b < row_bytes; b += block_bytes) {
            for (size_t at : half_offsets(type)) {
                put_half(row + b + at, scale_half(rng, k_quant));
            }
            if (type == GGML_TYPE_MXFP4) {
                row[b] = scale_e8m0(rng);
            }
        }
    }
    return data;
}

// What ggml attached to the tensor: the demangled dynamic type of its tensor_traits, e.g.
// "ggml::cpu::repack::tensor_traits<block_q4_0, 8l, 4l, (ggml_type)8>".
std::string traits_type(const ggml_tensor * t) {
    const auto * traits = static_cast<const ggml::cpu::tensor_traits *>(t->extra);
    int          status = 0;
    char *       name   = abi::__cxa_demangle(typeid(*traits).name(), nullptr, nullptr, &status);
    std::string  out    = status == 0 ? name : typeid(*traits).name();
    free(name);
    return out;
}

// The layout named ggml's way, "<type>_<rows>x<interleave bytes>", from tensor_traits<BLOCK, INTER_SIZE,
// NB_COLS, PARAM_TYPE>; false if the name has another shape.
bool layout_of(const std::string & traits, const char * type_name, std::string & layout, long & rows, long & chunk) {
    const std::string prefix = "ggml::cpu::repack::tensor_traits<block_" + std::string(type_name) + ", ";
    if (traits.compare(0, prefix.size(), prefix) != 0 ||
        sscanf(traits.c_str() + prefix.size(), "%ldl, %ldl,", &chunk, &rows) != 2) {
        return false;
    }
    layout = std::string(type_name) + "_" + std::to_string(rows) + "x" + std::to_string(chunk);
    return true;
}

bool write_file(const std::string & path, const std::string & header, const void * data, size_t size) {
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) {
        perror(path.c_str());
        return false;
    }
    const bool ok = fputs(header.c_str(), f) >= 0 && fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

ggml_backend_buffer_type_t repack_buffer_type() {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) {
        return nullptr;
    }
    for (ggml_backend_buffer_type_t * b = get_extra(ggml_backend_reg_dev_get(reg, 0)); b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            return *b;
        }
    }
    return nullptr;
}

struct Shape {
    int64_t k, n, experts;
};

// Repacks one tensor of `type` and writes both files; returns false on an error. A type ggml keeps
// plain on this CPU is reported and skipped.
bool make(ggml_backend_buffer_type_t buft, ggml_type type, Shape s, const char * out_dir) {
    const char * tn = ggml_type_name(type);
    char         tag[64];
    snprintf(tag, sizeof tag, "k%" PRId64 "-n%" PRId64 "-e%" PRId64, s.k, s.n, s.experts);

    ggml_init_params params = { ggml_tensor_overhead() * 2, nullptr, /*no_alloc =*/true };
    ggml_context *   ctx    = ggml_init(params);
    ggml_tensor *    t      = ggml_new_tensor_3d(ctx, type, s.k, s.n, s.experts);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    bool ok = buf != nullptr;
    if (!ok) {
        fprintf(stderr, "%s %s: cannot allocate in CPU_REPACK\n", tn, tag);
    } else if (!t->extra) {
        // ggml_repack_get_optimal_repack_type found no layout: ggml never puts such weights in CPU_REPACK.
        printf("%-7s %s: no repacked layout on this build/CPU (stays plain)\n", tn, tag);
    } else {
        const std::string traits = traits_type(t);
        std::string       layout;
        long              rows = 0, chunk = 0;
        if (!layout_of(traits, tn, layout, rows, chunk)) {
            fprintf(stderr, "%s %s: unexpected tensor_traits %s\n", tn, tag, traits.c_str());
            ok = false;
        } else {
            // Seeded by type and shape only: every build writes the same plain blocks.
            Rng rng = { (uint64_t) type * 1000003u + (uint64_t) (s.k * 131 + s.n * 7 + s.experts) };
            const std::vector<uint8_t> plain = plain_blocks(type, s.k, s.n * s.experts, rng);
            ggml_backend_tensor_set(t, plain.data(), 0, plain.size());
            // A CPU_REPACK buffer is host memory without a get_tensor: read the repacked bytes in place.
            const size_t nbytes = ggml_nbytes(t);
            char         common[256];
            snprintf(common, sizeof common,
                     "type=%s k=%" PRId64 " n=%" PRId64 " experts=%" PRId64 " nb1=%zu nb2=%zu bytes=%zu", tn, s.k,
                     s.n, s.experts, t->nb[1], t->nb[2], nbytes);
            const std::string plain_header = "ork-repack-vectors 1 layout=plain " + std::string(common) + "\n";
            const std::string repacked_header = "ork-repack-vectors 1 layout=" + layout + " rows=" +
                                                std::to_string(rows) + " chunk=" + std::to_string(chunk) + " " +
                                                common + "\n";
            const std::string dir = std::string(out_dir) + "/";
            ok = nbytes == plain.size() &&
                 write_file(dir + "plain-" + tn + "-" + tag + ".bin", plain_header, plain.data(), plain.size()) &&
                 write_file(dir + layout + "-" + tag + ".bin", repacked_header, t->data, nbytes);
            printf("%-7s %s: %s -> %s\n", tn, tag, traits.c_str(), layout.c_str());
        }
    }
    if (buf) {
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return ok;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    printf("ggml cpu: avx2=%d avx512=%d neon=%d dotprod=%d i8mm=%d sve=%d sve_bytes=%d\n", ggml_cpu_has_avx2(),
           ggml_cpu_has_avx512(), ggml_cpu_has_neon(), ggml_cpu_has_dotprod(), ggml_cpu_has_matmul_int8(),
           ggml_cpu_has_sve(), ggml_cpu_get_sve_cnt());
    ggml_backend_buffer_type_t buft = repack_buffer_type();
    if (!buft) {
        fprintf(stderr, "no CPU_REPACK buffer type in this ggml build\n");
        return 1;
    }
    // Every type the library inflates (the report says which ones this build repacks). Shapes: N a
    // multiple of 8 (ggml repacks a tensor only when its rows split into whole groups) but not of 32
    // (a partial NPU tile), several blocks per row, and more than one expert (so the expert stride
    // nb[2] is exercised).
    const ggml_type types[]  = { GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,  GGML_TYPE_Q8_0,
                                 GGML_TYPE_Q4_K,   GGML_TYPE_Q6_K,   GGML_TYPE_Q5_1,  GGML_TYPE_Q2_K,
                                 GGML_TYPE_Q3_K,   GGML_TYPE_Q5_K,   GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
                                 GGML_TYPE_MXFP4,  GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
                                 GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M };
    const Shape     shapes[] = { { 256, 24, 2 }, { 512, 8, 2 } };
    bool            ok       = true;
    for (ggml_type type : types) {
        for (Shape s : shapes) {
            ok = make(buft, type, s, argv[1]) && ok;
        }
    }
    return ok ? 0 : 1;
}
