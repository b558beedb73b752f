/*
 * Reading and validating IDX files (the MNIST / Fashion-MNIST container:
 * a big-endian magic, big-endian dimensions, then raw uint8 payload). Files
 * may be gzip-compressed or raw; which one is decided by the gzip magic bytes
 * at the start of the file, never by its name. Every check a bad download or a
 * mixed-up path could fail (wrong magic, absurd dimensions, truncation,
 * trailing bytes, a corrupt gzip stream, labels out of range, image/label
 * count mismatch) is reported as a negative status plus a one-line message
 * naming the file, what was expected and what was found; nothing here exits
 * or aborts, because the caller is a long-running training host.
 */
#ifndef KILN_PLUGINS_IDX_READER_H
#define KILN_PLUGINS_IDX_READER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: 0 is success, every failure is negative. */
enum {
    IDX_OK = 0,
    IDX_EIO = -1,     /* cannot open / read the file */
    IDX_EFORMAT = -2, /* bad magic, bad dimensions, truncation, trailing data, corrupt gzip */
    IDX_ENOMEM = -3,  /* allocation failed */
    IDX_EINVAL = -4,  /* bad argument or configuration; also a label out of range */
    IDX_ESTATE = -5   /* call not valid in the current state (e.g. next before start_epoch) */
};

#define IDX_MAGIC_IMAGES 0x00000803u /* uint8, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* uint8, 1 dimension */
#define IDX_MAX_IMAGE_PIXELS (1u << 20) /* rows*cols sanity bound (a 1024x1024 image) */

/*
 * Reads an IDX3 uint8 image file. On success *pixels is a malloc'd
 * (count, rows*cols) row-major array to release with idx_free(), and 0 is
 * returned. On failure the outputs are left untouched (nothing to free),
 * a negative IDX_E* code is returned and err gets a one-line message.
 * err may be NULL / errlen 0 when the caller does not want the message.
 */
int idx_read_images(const char *path, uint8_t **pixels, uint32_t *count, uint32_t *rows,
                    uint32_t *cols, char *err, size_t errlen);

/* Reads an IDX1 uint8 label file: *labels is a malloc'd (count) array. Same contract as above. */
int idx_read_labels(const char *path, uint8_t **labels, uint32_t *count, char *err, size_t errlen);

/* Releases memory returned by the readers (a plain free; exists so callers need not know). */
void idx_free(void *p);

/*
 * Checks that every label is < num_classes (num_classes in 1..256). path is only
 * used to name the file in the message, which also names the first bad index and value.
 */
int idx_check_labels(const uint8_t *labels, uint32_t n, int num_classes, const char *path,
                     char *err, size_t errlen);

/* An image file and its label file, validated against each other. */
typedef struct idx_dataset {
    uint8_t *pixels; /* (n, rows*cols), row-major, raw 0..255 */
    uint8_t *labels; /* (n) */
    uint32_t n, rows, cols;
} idx_dataset;

/*
 * Reads both files, checks that the counts match and that the labels are in
 * [0, num_classes). On failure *out is zeroed (safe to idx_dataset_free).
 */
int idx_open_dataset(const char *images_path, const char *labels_path, int num_classes,
                     idx_dataset *out, char *err, size_t errlen);

/* Frees the arrays and zeroes the struct; safe on a zeroed or already-freed dataset. */
void idx_dataset_free(idx_dataset *ds);

#ifdef __cplusplus
}
#endif

#endif
