/*
 * host/loader_elf.c — why a library is not a kiln plugin, when dlsym finds
 * no kiln_plugin_init_v1: the exported (dynamic, defined, global) symbols
 * are read straight from the file's ELF .dynsym, without running any of its
 * code, and the message says what was there instead — the entry of another
 * ABI major ("built for ABI 2, this host speaks 1"), a misspelt entry, or
 * none at all — and points at KILN_DEFINE_LIBRARY. Only 64-bit
 * little-endian ELF (the machines kiln runs on); anything else gets the
 * plain message.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader.h"
#include "log.h"

/* Calls fn for every defined global or weak symbol in .dynsym; 0, or -1
 * when the file is not a 64-bit ELF we can read. */
static int each_export(const char *path, void (*fn)(const char *name, void *ctx), void *ctx) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    const unsigned char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    int rc = -1;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_ident[EI_DATA] != ELFDATA2LSB || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum)
        goto out;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(m + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr *strs = &sh[sh[i].sh_link];
        if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset || strs->sh_offset > size ||
            strs->sh_size > size - strs->sh_offset || sh[i].sh_entsize != sizeof(Elf64_Sym))
            goto out;
        const Elf64_Sym *sym = (const Elf64_Sym *)(m + sh[i].sh_offset);
        const char *names = (const char *)(m + strs->sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 1; k < n; k++) {
            const int bind = ELF64_ST_BIND(sym[k].st_info);
            if (sym[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
            if (sym[k].st_name >= strs->sh_size) continue;
            const char *nm = names + sym[k].st_name;
            if (memchr(nm, 0, strs->sh_size - sym[k].st_name)) fn(nm, ctx);
        }
        rc = 0;
    }
out:
    munmap((void *)m, size);
    return rc;
}

typedef struct {
    int other_major;       /* N of kiln_plugin_init_vN, N != 1; 0: none */
    char near[128];        /* an export that looks like a misspelt entry  */
    int nexports;
} entry_scan;

static void look(const char *name, void *vctx) {
    entry_scan *s = vctx;
    s->nexports++;
    unsigned major;
    char tail;
    if (sscanf(name, "kiln_plugin_init_v%u%c", &major, &tail) == 1 && major != 1) {
        if (!s->other_major || (int)major > s->other_major) s->other_major = (int)major;
        return;
    }
    if (!s->near[0] && (strstr(name, "kiln_plugin_init") || strstr(name, "plugin_init") ||
                        hedit_distance(name, KILN_PLUGIN_ENTRY_V1) <= 3))
        snprintf(s->near, sizeof s->near, "%s", name);
}

void hl_entry_diagnosis(const char *path, char *buf, size_t n) {
    entry_scan s = {0, "", 0};
    if (each_export(path, look, &s) != 0) {
        snprintf(buf, n, "missing symbol %s (define it with KILN_DEFINE_LIBRARY from kiln/sdk.h)",
                 KILN_PLUGIN_ENTRY_V1);
        return;
    }
    if (s.other_major)
        snprintf(buf, n,
                 "missing symbol %s: it exports kiln_plugin_init_v%d, so it was built for plugin ABI %d; this kiln "
                 "speaks ABI %d (rebuild it against this kiln's SDK)",
                 KILN_PLUGIN_ENTRY_V1, s.other_major, s.other_major, KILN_ABI_MAJOR);
    else if (s.near[0])
        snprintf(buf, n,
                 "missing symbol %s: it exports '%s' instead (a misspelt or hand-written entry?); define the entry "
                 "with KILN_DEFINE_LIBRARY from kiln/sdk.h",
                 KILN_PLUGIN_ENTRY_V1, s.near);
    else
        snprintf(buf, n,
                 "missing symbol %s: it exports no kiln entry point (%d other symbol%s); define it with "
                 "KILN_DEFINE_LIBRARY from kiln/sdk.h (kiln_add_plugin then checks it at link time)",
                 KILN_PLUGIN_ENTRY_V1, s.nexports, s.nexports == 1 ? "" : "s");
}
