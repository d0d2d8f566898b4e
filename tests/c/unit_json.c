/*
 * unit_json.c - the server's JSON number conversion (src/serve/json.c):
 * kiln_json_decimal_to_double must give exactly what strtod gives, the
 * correctly rounded double, on its fast path and off it. Random literals
 * cover 1-22 significant digits, leading and trailing zeros, exponents
 * inside and outside the fast path's range, and the double and float32
 * rounding boundaries (literals printed from doubles and floats with 17 and
 * 9 digits, and midpoints between neighbouring doubles).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve/json.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rng_next(void) { return check_xorshift(&rng_state); }

static int mismatches;

static void expect_same(const char *lit)
{
    double want = strtod(lit, NULL), got = NAN;
    int ok = kiln_json_decimal_to_double(lit, strlen(lit), &got);
    uint64_t a, b;
    memcpy(&a, &want, 8);
    memcpy(&b, &got, 8);
    if (!ok || a != b) {
        if (mismatches++ < 10)
            CHECK(0, "'%s': strtod %.17g (%016llx), Kiln %.17g (%016llx)", lit, want,
                  (unsigned long long)a, got, (unsigned long long)b);
    }
}

int main(void)
{
    static const char *fixed[] = {
        "0", "-0", "0.0", "-0.0", "1", "-1", "0.1", "0.2", "0.3", "1e0", "1E+0", "1e-0",
        "123456789012345678", "1234567890123456789", "12345678901234567890",
        "9007199254740993", "9007199254740992.5", "18446744073709551615",
        "1e27", "1e-27", "1e28", "1e-28", "1e308", "1e-320", "4.9e-324", "1.7976931348623157e308",
        "0.000000000000000000000000000001", "100000000000000000000000000000",
        "3.4028234663852886e38", "1.1754943508222875e-38", "1.401298464324817e-45",
        "2.2250738585072014e-308", "0.30000000000000004", "1.0436816215515137",
        "-0.865629255771637", "5e-1", "0.5000000000000000000000000001",
        "1.00000000000000000000", "000", "-000.000e5", "7e-10", "123.456e-7",
        "1e99999", "-1e-99999", "0e99999",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) expect_same(fixed[i]);

    char lit[96];
    /* Random digit strings with a decimal point and exponent. */
    for (int it = 0; it < 400000; it++) {
        int nd = 1 + (int)(rng_next() % 22), point = (int)(rng_next() % (nd + 1));
        int lead = (int)(rng_next() % 4), e = (int)(rng_next() % 80) - 40;
        char *p = lit;
        if (rng_next() & 1) *p++ = '-';
        for (int i = 0; i < lead; i++) *p++ = '0';
        for (int i = 0; i < nd; i++) {
            if (i == point && i > 0) *p++ = '.';
            *p++ = (char)('0' + rng_next() % 10);
        }
        if (rng_next() % 3) p += sprintf(p, "e%d", e);
        *p = '\0';
        expect_same(lit);
    }
    /* Literals printed from doubles and floats (what clients send), and the
     * midpoints between a double and its neighbour (the hardest cases). */
    for (int it = 0; it < 300000; it++) {
        uint64_t bits = rng_next();
        double d;
        int kind = it % 3;
        if (kind == 2) {
            float f;
            uint32_t fb = (uint32_t)bits;
            memcpy(&f, &fb, 4);
            if (!isfinite(f)) continue;
            snprintf(lit, sizeof lit, "%.9g", f);
        } else {
            /* exponents near 1 keep most literals on the fast path */
            bits = (bits & 0x800FFFFFFFFFFFFFull) | ((uint64_t)(1023 - 40 + rng_next() % 80) << 52);
            memcpy(&d, &bits, 8);
            if (kind == 0) snprintf(lit, sizeof lit, "%.17g", d);
            else {
                double up = nextafter(d, INFINITY);
                long double mid = ((long double)d + (long double)up) / 2;
                snprintf(lit, sizeof lit, "%.21Lg", mid);
            }
        }
        expect_same(lit);
    }
    CHECK(mismatches == 0, "%d literals convert differently from strtod", mismatches);
    return CHECK_DONE();
}
