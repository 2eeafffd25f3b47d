/* Quantized K/V kernels for the torch backend on a cpu (engine/backends/kv_kernels.py builds and loads
   this file). float32 only. The arithmetic is mx.quantize's / mx.dequantize's, operation for operation,
   in float32: built with -ffp-contract=off, the results are those of the torch ops they replace
   (engine/backends/torch.py `_quantize`, `_dequantize`), byte for byte.

   Layout (the cache's grouped buffers): a unit is one (row, head, slot) of g groups; its codes are
   g * per contiguous bytes (per = group, or group / 2 for 4-bit codes packed two per byte, low nibble
   first), its scales and biases g contiguous floats. Units are addressed by three strides (elements). */

#include <math.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
/* an AVX2 build and a baseline one, picked for the cpu when the library loads (an ELF ifunc) */
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

static uint8_t code(float w, float bias, float scale, float n_bins) {
    float q = rintf((w - bias) / scale); /* round half to even, as torch.round and mx.quantize */
    return (uint8_t)(q > 0.0f ? (q < n_bins ? q : n_bins) : 0.0f); /* NaN gives 0 */
}

/* x: d0 x d1 x d2 units of g * group contiguous values (unit strides x0, x1, x2), quantized into codes /
   scales / biases. */
CLONES void kv_quantize(const float *restrict x, int64_t x0, int64_t x1, int64_t x2, int64_t d0, int64_t d1,
                        int64_t d2, int64_t g, int64_t group, int bits,
                 uint8_t *restrict codes, int64_t s0, int64_t s1, int64_t s2, float *restrict scales,
                 float *restrict biases,
                 int64_t t0, int64_t t1, int64_t t2) {
    const float n_bins = (float)((1 << bits) - 1);
    const int64_t per = bits == 4 ? group / 2 : group;
    for (int64_t i0 = 0; i0 < d0; i0++)
        for (int64_t i1 = 0; i1 < d1; i1++)
            for (int64_t i2 = 0; i2 < d2; i2++) {
                const float *w = x + i0 * x0 + i1 * x1 + i2 * x2;
                uint8_t *c = codes + i0 * s0 + i1 * s1 + i2 * s2;
                float *sc = scales + i0 * t0 + i1 * t1 + i2 * t2;
                float *bi = biases + i0 * t0 + i1 * t1 + i2 * t2;
                for (int64_t k = 0; k < g; k++, w += group, c += per) {
                    float lo = w[0], hi = w[0];
                    for (int64_t j = 1; j < group; j++) {
                        lo = w[j] < lo ? w[j] : lo;
                        hi = w[j] > hi ? w[j] : hi;
                    }
                    /* anchor the larger-magnitude edge exactly on a code */
                    const int neg = fabsf(lo) > fabsf(hi);
                    float s = (hi - lo) / n_bins;
                    s = s > 1e-7f ? s : 1e-7f;
                    s = neg ? s : -s;
                    const float edge = neg ? lo : hi;
                    const float q0 = rintf(edge / s);
                    float b = 0.0f; /* a group of zeros keeps its scale and a zero bias */
                    if (q0 != 0.0f) {
                        s = edge / q0;
                        b = edge;
                    }
                    sc[k] = s;
                    bi[k] = b;
                    if (bits == 8)
                        for (int64_t j = 0; j < group; j++) c[j] = code(w[j], b, s, n_bins);
                    else
                        for (int64_t j = 0; j < per; j++)
                            c[j] = (uint8_t)(code(w[2 * j], b, s, n_bins) |
                                             (code(w[2 * j + 1], b, s, n_bins) << 4));
                }
            }
}

/* scale * code + bias of d0 x d1 x d2 units (addressed as in kv_quantize) into out (unit strides o0, o1,
   o2; each unit's g * group values contiguous). */
CLONES void kv_dequantize(const uint8_t *restrict codes, int64_t d0, int64_t d1, int64_t d2, int64_t g, int64_t group,
                   int bits, int64_t s0, int64_t s1, int64_t s2, const float *restrict scales,
                   const float *restrict biases, int64_t t0, int64_t t1, int64_t t2,
                   float *restrict out, int64_t o0, int64_t o1, int64_t o2) {
    const int64_t per = bits == 4 ? group / 2 : group;
    for (int64_t i0 = 0; i0 < d0; i0++)
        for (int64_t i1 = 0; i1 < d1; i1++)
            for (int64_t i2 = 0; i2 < d2; i2++) {
                const uint8_t *c = codes + i0 * s0 + i1 * s1 + i2 * s2;
                const float *sc = scales + i0 * t0 + i1 * t1 + i2 * t2;
                const float *bi = biases + i0 * t0 + i1 * t1 + i2 * t2;
                float *o = out + i0 * o0 + i1 * o1 + i2 * o2;
                for (int64_t k = 0; k < g; k++, c += per, o += group) {
                    const float s = sc[k], b = bi[k];
                    if (bits == 8)
                        for (int64_t j = 0; j < group; j++) o[j] = (float)c[j] * s + b;
                    else
                        for (int64_t j = 0; j < per; j++) {
                            o[2 * j] = (float)(c[j] & 15) * s + b;
                            o[2 * j + 1] = (float)(c[j] >> 4) * s + b;
                        }
                }
            }
}
