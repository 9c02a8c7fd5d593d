/*
 * read_file: read a file of the container through the dpuio C ABI with a batch of
 * requests in flight, the way a C/C++ training framework would.
 *
 *   cc -o read_file read_file.c -I host-shim/capi/include -L target/debug -ldpuio \
 *      -Wl,-rpath,$PWD/target/debug
 *   DPUIO_AGENT=127.0.0.1:7300 ./read_file /datasets/train/sample_000.npy
 *
 * It lists the file's directory, then reads the file in chunks: it prepares up to
 * DEPTH reads into slots of one registered region, submits them with one doorbell,
 * waits for at least one completion, and refills that slot, until the whole file is
 * in. The agent writes the bytes into the region; this program only checksums them
 * (FNV-1a) so the output can be compared.
 *
 * Usage: read_file PATH [CHUNK_BYTES [DEPTH]]     (agent from $DPUIO_AGENT)
 * Output: one line per step; exit status 0 on success, 1 with the error on stderr.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpuio.h"

#define MAX_DEPTH 64

static int fail(const char *what, int code) {
    fprintf(stderr, "read_file: %s failed: %s (%d): %s\n", what, dpuio_code_name(code), code,
            dpuio_last_error_message());
    return 1;
}

struct listing {
    unsigned entries;
    uint64_t bytes;
};

static int count_entry(void *ctx, const dpuio_dirent *entry) {
    struct listing *l = ctx;
    l->entries++;
    if (entry->attr.kind == DPUIO_KIND_FILE) l->bytes += entry->attr.size;
    return 0; /* go on */
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s PATH [CHUNK_BYTES [DEPTH]]   (agent from $DPUIO_AGENT)\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    uint64_t chunk = argc > 2 ? strtoull(argv[2], NULL, 10) : (1u << 20);
    unsigned depth = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 8;
    if (chunk == 0 || depth == 0 || depth > MAX_DEPTH) {
        fprintf(stderr, "read_file: CHUNK_BYTES must be > 0 and DEPTH 1..%d\n", MAX_DEPTH);
        return 2;
    }

    dpuio_attach_options options;
    dpuio_attach_options_init(&options);
    options.client_name = "read_file example";
    dpuio_client *client = NULL;
    int rc = dpuio_attach(&options, &client);
    if (rc != DPUIO_OK) return fail("attach", rc);
    printf("libdpuio %s attached\n", dpuio_version());

    dpuio_limits limits;
    if ((rc = dpuio_client_limits(client, &limits)) != DPUIO_OK) return fail("limits", rc);
    if (chunk > limits.max_io_bytes) chunk = limits.max_io_bytes;

    /* The directory holding the file, listed with a callback. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, "/");
    struct listing listing = {0, 0};
    if ((rc = dpuio_readdir(client, dir, count_entry, &listing)) < 0) return fail("readdir", rc);
    printf("dir %s: %u entries, %" PRIu64 " bytes in files\n", dir, listing.entries, listing.bytes);

    dpuio_file *file = NULL;
    if ((rc = dpuio_open(client, path, DPUIO_O_RDONLY, &file)) != DPUIO_OK) return fail("open", rc);
    uint64_t size = 0;
    if ((rc = dpuio_file_size(file, &size)) != DPUIO_OK) return fail("size", rc);
    printf("stat %s: size=%" PRIu64 "\n", path, size);

    dpuio_region *region = NULL;
    rc = dpuio_region_create(client, (size_t)(chunk * depth), DPUIO_REGION_WRITE_BY_AGENT, &region);
    if (rc != DPUIO_OK) return fail("region_create", rc);
    const unsigned char *memory = dpuio_region_ptr(region);

    dpuio_batch *batch = NULL;
    if ((rc = dpuio_batch_create(client, &batch)) != DPUIO_OK) return fail("batch_create", rc);

    /* Slot s holds the chunk at file offset done_at[s]; completions can come in any
     * order, so the checksum is taken chunk by chunk in file order. */
    uint64_t slot_offset[MAX_DEPTH];
    int slot_ready[MAX_DEPTH] = {0};
    uint64_t slot_bytes[MAX_DEPTH] = {0};
    uint64_t next = 0, checked = 0, hash = 14695981039346656037ull, requests = 0;
    unsigned in_flight = 0, max_in_flight = 0;
    for (unsigned s = 0; s < depth && next < size; s++, next += chunk) {
        uint64_t len = size - next < chunk ? size - next : chunk;
        slot_offset[s] = next;
        rc = dpuio_batch_prep_read(batch, file, region, s * chunk, len, next, s);
        if (rc != DPUIO_OK) return fail("prep_read", rc);
        in_flight++;
    }
    while (checked < size) {
        if ((rc = dpuio_batch_submit(batch)) < 0) return fail("submit", rc);
        if (in_flight > max_in_flight) max_in_flight = in_flight;
        dpuio_completion done[MAX_DEPTH];
        int n = dpuio_batch_wait(batch, done, MAX_DEPTH, 1, 30000);
        if (n < 0) return fail("wait", n);
        if (n == 0) {
            fprintf(stderr, "read_file: no completion within 30 s\n");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            unsigned s = (unsigned)done[i].user_data;
            if (done[i].result < 0) {
                fprintf(stderr, "read_file: read at %" PRIu64 " failed: %s (agent status %d)\n",
                        slot_offset[s], dpuio_code_name((int)done[i].result), done[i].status);
                return 1;
            }
            slot_ready[s] = 1;
            slot_bytes[s] = (uint64_t)done[i].result;
            in_flight--;
            requests++;
        }
        /* Checksum every slot that is next in file order, then reuse it. */
        for (int progress = 1; progress;) {
            progress = 0;
            for (unsigned s = 0; s < depth; s++) {
                if (!slot_ready[s] || slot_offset[s] != checked) continue;
                hash = fnv1a(hash, memory + s * chunk, (size_t)slot_bytes[s]);
                checked += slot_bytes[s];
                slot_ready[s] = 0;
                if (slot_bytes[s] == 0) checked = size; /* the file shrank */
                progress = 1;
                if (next < size) {
                    uint64_t len = size - next < chunk ? size - next : chunk;
                    slot_offset[s] = next;
                    rc = dpuio_batch_prep_read(batch, file, region, s * chunk, len, next, s);
                    if (rc != DPUIO_OK) return fail("prep_read", rc);
                    next += len;
                    in_flight++;
                }
            }
        }
    }
    printf("read %s: %" PRIu64 " bytes in %" PRIu64 " requests of up to %" PRIu64
           " bytes, up to %u in flight, fnv1a64=%016" PRIx64 "\n",
           path, checked, requests, chunk, max_in_flight, hash);

    if ((rc = dpuio_batch_destroy(batch)) != DPUIO_OK) return fail("batch_destroy", rc);
    if ((rc = dpuio_region_destroy(region)) != DPUIO_OK) return fail("region_destroy", rc);
    if ((rc = dpuio_close(file)) != DPUIO_OK) return fail("close", rc);
    if ((rc = dpuio_detach(client)) != DPUIO_OK) return fail("detach", rc);
    return 0;
}
