/*
 * gan_png.c — the sample grid of the "gan" module as an 8-bit grayscale PNG
 * (libpng): `count` generated images laid out as sqrt(count) x sqrt(count)
 * tiles of side x side pixels with a 2-pixel white border around and between
 * them (white so the black Fashion-MNIST backgrounds stay apart), each value
 * mapped from tanh's [-1, 1] to 0..255. The file is written next to its
 * final name as "<path>.tmp" and renamed over it only once complete, so a
 * reader (or a crash mid-write) never sees half a PNG. libpng reports errors
 * by longjmp; everything it could leave open is released on that path too.
 */
#define _POSIX_C_SOURCE 200809L /* fileno */
#include "gan.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GAN_PNG_BORDER 2
#define GAN_PNG_BORDER_VALUE 255

uint8_t gan_png_pixel(float v) {
    if (!(v > -1.0f)) return 0; /* also NaN */
    if (v >= 1.0f) return 255;
    return (uint8_t)lrintf((v + 1.0f) * 127.5f);
}

/* libpng's error callback: keep the text for our message, then unwind to
 * the setjmp in gan_png_write_grid (libpng's documented contract). */
typedef struct {
    char msg[256];
} gan_png_err;

static void gan_png_error(png_structp png, png_const_charp text) {
    gan_png_err *e = png_get_error_ptr(png);
    if (e) snprintf(e->msg, sizeof e->msg, "%s", text ? text : "libpng error");
    png_longjmp(png, 1);
}

static void gan_png_warning(png_structp png, png_const_charp text) {
    (void)png;
    (void)text; /* warnings do not stop the write */
}

/* Writes rows of the grid through libpng into f. Separate from the caller
 * so the setjmp frame holds no locals that change after setjmp. */
static int gan_png_encode(FILE *f, const uint8_t *pixels, uint32_t w, uint32_t h, gan_png_err *err) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, err, gan_png_error, gan_png_warning);
    if (!png) {
        snprintf(err->msg, sizeof err->msg, "png_create_write_struct failed (out of memory)");
        return -1;
    }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(err->msg, sizeof err->msg, "png_create_info_struct failed (out of memory)");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, w, h, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (uint32_t y = 0; y < h; y++) png_write_row(png, pixels + (size_t)y * w);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 0;
}

int32_t gan_png_write_grid(const char *path, const float *images, int32_t count, int32_t side, char *err,
                           size_t errlen) {
    int32_t n = (int32_t)lrint(sqrt((double)count));
    if (count < 1 || n * n != count || side < 1) {
        snprintf(err, errlen, "cannot lay out %d images of side %d as a square grid", (int)count, (int)side);
        return KILN_E_INVALID_ARG;
    }
    const uint32_t w = (uint32_t)n * (uint32_t)side + (uint32_t)(n + 1) * GAN_PNG_BORDER; /* == height */
    uint8_t *pixels = malloc((size_t)w * w);
    if (!pixels) {
        snprintf(err, errlen, "cannot allocate a %ux%u grid", w, w);
        return KILN_E_NOMEM;
    }
    memset(pixels, GAN_PNG_BORDER_VALUE, (size_t)w * w);
    for (int32_t t = 0; t < count; t++) {
        const float *img = images + (size_t)t * (size_t)side * (size_t)side; /* (side, side) row-major */
        const size_t x0 = (size_t)(t % n) * (size_t)(side + GAN_PNG_BORDER) + GAN_PNG_BORDER;
        const size_t y0 = (size_t)(t / n) * (size_t)(side + GAN_PNG_BORDER) + GAN_PNG_BORDER;
        for (size_t r = 0; r < (size_t)side; r++)
            for (size_t c = 0; c < (size_t)side; c++)
                pixels[(y0 + r) * w + x0 + c] = gan_png_pixel(img[r * (size_t)side + c]);
    }

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(pixels);
        snprintf(err, errlen, "path too long: %s", path);
        return KILN_E_IO;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        free(pixels);
        return KILN_E_IO;
    }
    gan_png_err perr = {{0}};
    int bad = gan_png_encode(f, pixels, w, w, &perr);
    free(pixels);
    /* fflush + fsync before the rename, so the renamed file has its bytes. */
    if (!bad && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        snprintf(perr.msg, sizeof perr.msg, "flushing: %s", strerror(errno));
        bad = 1;
    }
    if (fclose(f) != 0 && !bad) {
        snprintf(perr.msg, sizeof perr.msg, "closing: %s", strerror(errno));
        bad = 1;
    }
    if (bad) {
        snprintf(err, errlen, "writing %s failed: %s", tmp, perr.msg);
        remove(tmp);
        return KILN_E_IO;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        remove(tmp);
        return KILN_E_IO;
    }
    return KILN_OK;
}
