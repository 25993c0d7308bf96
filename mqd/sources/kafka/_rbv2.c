/* The RecordBatch v2 records kernel: Kafka records (varint framed) into Arrow-ready columns.
 *
 * Two passes over the records sections of many batches ("segments"): rbv2_scan validates the framing
 * and sums the sizes the output buffers need, rbv2_fill writes offsets, timestamps, keys, values and
 * headers into buffers the caller allocated from those sums. No Python API: loaded with ctypes, so
 * the same file builds with any C compiler and a missing compiler only means the pure fallback.
 */
#include <stdint.h>
#include <string.h>

#define E_TRUNCATED -1  /* a varint or field runs past its record */
#define E_LENGTH -2     /* a negative or oversized length */
#define E_OFFSET -3     /* offset deltas not increasing or past lastOffsetDelta */
#define E_TRAILING -4   /* bytes left over inside a record, or records past the section end */
#define E_COUNT -5      /* fewer records than the batch header says */

static inline int rd(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int shift = 0;
    while (p < end) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1); /* zigzag */
            return 0;
        }
        shift += 7;
        if (shift > 63) return E_LENGTH;
    }
    return E_TRUNCATED;
}

#define RD(var)                                   \
    do {                                          \
        int rc_ = rd(&p, rend, &(var));           \
        if (rc_) { where[0] = s; where[1] = i; return rc_; } \
    } while (0)
#define NEED(n)                                                            \
    do {                                                                   \
        if ((n) < 0 || (n) > rend - p) { where[0] = s; where[1] = i; return E_LENGTH; } \
    } while (0)

/* The segment table: one row of SEG_COLS int64 per records section. */
#define SEG_COLS 7
#define S_PTR 0        /* address of the section (kept alive by the caller) */
#define S_LEN 1
#define S_COUNT 2      /* recordsCount of the batch header */
#define S_LAST_DELTA 3 /* lastOffsetDelta */
#define S_BASE_OFFSET 4
#define S_BASE_TS 5
#define S_FIXED_TS 6   /* LogAppendTime: the batch's maxTimestamp; else INT64_MIN */

/* out: [0] keys bytes, [1] values bytes, [2] headers, [3] header key bytes, [4] header value
 * bytes, [5] null keys, [6] null values, [7] null header values, [8] records; on an error
 * [9] the segment and [10] the record where it was found. */
int rbv2_scan(int32_t nseg, const int64_t *seg, int64_t *totals) {
    int64_t *where = totals + 9;
    memset(totals, 0, 11 * sizeof(int64_t));
    for (int32_t s = 0; s < nseg; s++) {
        const int64_t *row = seg + (int64_t)s * SEG_COLS;
        const uint8_t *p = (const uint8_t *)(uintptr_t)row[S_PTR];
        const uint8_t *end = p + row[S_LEN];
        const int64_t count = row[S_COUNT];
        int64_t prev = -1;
        int64_t i;
        for (i = 0; i < count; i++) {
            const uint8_t *rend = end;
            int64_t len, tsd, offd, kl, vl, hc, hkl, hvl;
            RD(len);
            NEED(len);
            rend = p + len;
            if (len < 1) { where[0] = s; where[1] = i; return E_LENGTH; }
            p++; /* record attributes */
            RD(tsd);
            RD(offd);
            if (offd <= prev || offd > row[S_LAST_DELTA]) { where[0] = s; where[1] = i; return E_OFFSET; }
            prev = offd;
            RD(kl);
            if (kl < -1) { where[0] = s; where[1] = i; return E_LENGTH; }
            if (kl >= 0) { NEED(kl); p += kl; totals[0] += kl; } else totals[5]++;
            RD(vl);
            if (vl < -1) { where[0] = s; where[1] = i; return E_LENGTH; }
            if (vl >= 0) { NEED(vl); p += vl; totals[1] += vl; } else totals[6]++;
            RD(hc);
            if (hc < 0 || hc > rend - p) { where[0] = s; where[1] = i; return E_LENGTH; }
            for (int64_t h = 0; h < hc; h++) {
                RD(hkl);
                NEED(hkl);
                p += hkl;
                totals[3] += hkl;
                RD(hvl);
                if (hvl < -1) { where[0] = s; where[1] = i; return E_LENGTH; }
                if (hvl >= 0) { NEED(hvl); p += hvl; totals[4] += hvl; } else totals[7]++;
            }
            totals[2] += hc;
            if (p != rend) { where[0] = s; where[1] = i; return E_TRAILING; }
        }
        if (p != end) { where[0] = s; where[1] = i; return E_TRAILING; }
        totals[8] += count;
    }
    return 0;
}

/* Only after rbv2_scan accepted the same segments: no bounds checks left here. out holds the
 * addresses of the output buffers, in the order of the O_ names below. */
enum {
    O_OFFSET, O_TS, O_K_OFF, O_K_DATA, O_K_VALID, O_V_OFF, O_V_DATA, O_V_VALID,
    O_H_OFF, O_HK_OFF, O_HK_DATA, O_HV_OFF, O_HV_DATA, O_HV_VALID, O_COUNT
};
int rbv2_fill(int32_t nseg, const int64_t *seg, const uint64_t *out) {
    int64_t *off_out = (int64_t *)(uintptr_t)out[O_OFFSET];
    int64_t *ts_out = (int64_t *)(uintptr_t)out[O_TS];
    int32_t *k_off = (int32_t *)(uintptr_t)out[O_K_OFF];
    uint8_t *k_data = (uint8_t *)(uintptr_t)out[O_K_DATA];
    uint8_t *k_valid = (uint8_t *)(uintptr_t)out[O_K_VALID];
    int32_t *v_off = (int32_t *)(uintptr_t)out[O_V_OFF];
    uint8_t *v_data = (uint8_t *)(uintptr_t)out[O_V_DATA];
    uint8_t *v_valid = (uint8_t *)(uintptr_t)out[O_V_VALID];
    int32_t *h_off = (int32_t *)(uintptr_t)out[O_H_OFF];
    int32_t *hk_off = (int32_t *)(uintptr_t)out[O_HK_OFF];
    uint8_t *hk_data = (uint8_t *)(uintptr_t)out[O_HK_DATA];
    int32_t *hv_off = (int32_t *)(uintptr_t)out[O_HV_OFF];
    uint8_t *hv_data = (uint8_t *)(uintptr_t)out[O_HV_DATA];
    uint8_t *hv_valid = (uint8_t *)(uintptr_t)out[O_HV_VALID];
    int64_t r = 0, h = 0;
    int32_t ko = 0, vo = 0, hko = 0, hvo = 0;
    k_off[0] = v_off[0] = h_off[0] = hk_off[0] = hv_off[0] = 0;
    int64_t where[2]; /* written by RD on a bad varint, which the scan has excluded */
    (void)where;
    for (int32_t s = 0; s < nseg; s++) {
        const int64_t *row = seg + (int64_t)s * SEG_COLS;
        const uint8_t *p = (const uint8_t *)(uintptr_t)row[S_PTR];
        const int64_t fixed_ts = row[S_FIXED_TS], base_ts = row[S_BASE_TS], base_offset = row[S_BASE_OFFSET];
        for (int64_t i = 0; i < row[S_COUNT]; i++, r++) {
            const uint8_t *rend = p + 10; /* varints were checked by the scan */
            int64_t len, tsd, offd, kl, vl, hc, hkl, hvl;
            RD(len);
            rend = p + len;
            p++;
            RD(tsd);
            RD(offd);
            off_out[r] = base_offset + offd; /* no overflow: the caller checked base + lastOffsetDelta */
            /* any int64 delta is legal on the wire: wrap as Java's long does (signed overflow is
             * undefined in C, unsigned is not) */
            ts_out[r] = fixed_ts != INT64_MIN ? fixed_ts : (int64_t)((uint64_t)base_ts + (uint64_t)tsd);
            RD(kl);
            if (kl >= 0) {
                memcpy(k_data + ko, p, (size_t)kl);
                p += kl;
                ko += (int32_t)kl;
                k_valid[r] = 1;
            } else k_valid[r] = 0;
            k_off[r + 1] = ko;
            RD(vl);
            if (vl >= 0) {
                memcpy(v_data + vo, p, (size_t)vl);
                p += vl;
                vo += (int32_t)vl;
                v_valid[r] = 1;
            } else v_valid[r] = 0;
            v_off[r + 1] = vo;
            RD(hc);
            for (int64_t j = 0; j < hc; j++, h++) {
                RD(hkl);
                memcpy(hk_data + hko, p, (size_t)hkl);
                p += hkl;
                hko += (int32_t)hkl;
                hk_off[h + 1] = hko;
                RD(hvl);
                if (hvl >= 0) {
                    memcpy(hv_data + hvo, p, (size_t)hvl);
                    p += hvl;
                    hvo += (int32_t)hvl;
                    hv_valid[h] = 1;
                } else hv_valid[h] = 0;
                hv_off[h + 1] = hvo;
            }
            h_off[r + 1] = (int32_t)h;
            p = rend;
        }
    }
    return 0;
}
