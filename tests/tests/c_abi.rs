//! The C ABI end to end: C programs built with `cc` against `libdpuio` (shared and
//! static) and `include/dpuio.h`, run against a real agent.
//!
//! * `examples/c/read_file.c` reads a file with a batch of requests in flight; its
//!   checksum must match the file's bytes.
//! * A C program written here walks the error paths (NULL and destroyed handles,
//!   missing paths, a full ring, calls after detach) and runs I/O from several threads
//!   on one client.
//!
//! `libdpuio.so` and `libdpuio.a` are built by cargo before this test runs: the crate
//! is a dev-dependency, and cargo builds every crate type of a library it builds.
//!
//! Each test gives its agent and its C programs a `DPUIO_CONFIG_DIR` of their own (the
//! agent writes its development client bundle there, the library reads it), so tests
//! running at once never share one, nor the user's `~/.config/dpuio`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dpuio_tests::{AgentProcess, hermetic};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

/// target/<profile>/deps: where cargo puts the crate types of a library it builds as a
/// dependency (only a library built on its own is copied up to target/<profile>), so
/// this is the libdpuio built from the sources under test.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("target/<profile>/deps").to_owned();
    for name in ["libdpuio.so", "libdpuio.a"] {
        assert!(
            dir.join(name).is_file(),
            "{} is missing: cargo builds it before this test, as a dev-dependency of dpuio-tests",
            dir.join(name).display()
        );
    }
    dir
}

enum Link {
    Shared,
    Static,
}

/// Compile C sources against the header and the library.
fn cc(name: &str, source: &Path, link: Link, out_dir: &Path) -> PathBuf {
    let lib = library_dir();
    let exe = out_dir.join(name);
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(source)
        .arg("-I")
        .arg(workspace().join("host-shim/capi/include"));
    match link {
        Link::Shared => {
            cmd.arg("-L").arg(&lib).arg("-ldpuio").arg(format!("-Wl,-rpath,{}", lib.display()));
        }
        Link::Static => {
            // What `--print native-static-libs` lists for libdpuio.a.
            cmd.arg(lib.join("libdpuio.a")).args([
                "-lucp",
                "-luct",
                "-lucs",
                "-lucm",
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
            ]);
        }
    }
    let out = cmd.output().expect("run cc");
    assert!(out.status.success(), "cc {} failed:\n{}", source.display(), String::from_utf8_lossy(&out.stderr));
    exe
}

/// A real agent in `dir/agent`, with `dir/config` as its `DPUIO_CONFIG_DIR`.
struct TestAgent {
    agent: AgentProcess,
    config_dir: PathBuf,
}

impl TestAgent {
    fn start(dir: &Path) -> TestAgent {
        // The harness gives the agent `agent/client` as its DPUIO_CONFIG_DIR: the
        // development client bundle lands there, never in ~/.config/dpuio.
        let agent = AgentProcess::start(&dir.join("agent"), &[]);
        let config_dir = agent.client_dir();
        TestAgent { agent, config_dir }
    }

    /// Run a C program against this agent, with the agent's config directory.
    fn run(&self, exe: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(exe);
        hermetic(&mut cmd, &self.agent.data_dir.join(".home"))
            .args(args)
            .env("DPUIO_AGENT", self.agent.url())
            .env("DPUIO_CONFIG_DIR", &self.config_dir)
            .output()
            .expect("run C program")
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn pattern_file(agent: &TestAgent, name: &str, bytes: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..bytes).map(|i| (i.wrapping_mul(31).wrapping_add(i >> 12) % 253) as u8).collect();
    agent.agent.seed_file(&format!("/data/{name}"), &data);
    data
}

#[test]
fn read_file_example_reads_the_right_bytes_shared_and_static() {
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path());
    let data = pattern_file(&agent, "blob.bin", (9 << 20) + 12345);
    pattern_file(&agent, "other.bin", 100);
    let example = workspace().join("examples/c/read_file.c");
    for (link, name) in [(Link::Shared, "read_file_shared"), (Link::Static, "read_file_static")] {
        let exe = cc(name, &example, link, dir.path());
        let out = agent.run(&exe, &["/data/blob.bin", "1048576", "4"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{name}:\n{stdout}");
        assert!(stdout.contains("dir /data: 2 entries"), "{stdout}");
        assert!(stdout.contains(&format!("size={}", data.len())), "{stdout}");
        assert!(stdout.contains("up to 4 in flight"), "{stdout}");
        assert!(stdout.contains(&format!("fnv1a64={:016x}", fnv1a(&data))), "checksum differs: {stdout}");

        let missing = agent.run(&exe, &["/data/nope.bin"]);
        assert_eq!(missing.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&missing.stderr);
        assert!(stderr.contains("open failed: NOT_FOUND (-2): dpuio_open: open /data/nope.bin: NOT_FOUND"), "{stderr}");
    }
}

/// Error paths and threads, in C.
const ERRORS_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dpuio.h"

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "line %d: check failed: %s (last error: %s)\n", __LINE__, #cond, \
            dpuio_last_error_message()); exit(1); } } while (0)
#define OK(call) do { int rc_ = (call); if (rc_ < 0) { \
    fprintf(stderr, "line %d: %s -> %s: %s\n", __LINE__, #call, dpuio_code_name(rc_), \
            dpuio_last_error_message()); exit(1); } } while (0)
#define EXPECT(call, code, text) do { int rc_ = (call); if (rc_ != (code) || \
    !strstr(dpuio_last_error_message(), (text))) { \
    fprintf(stderr, "line %d: %s -> %d (%s), wanted %s containing \"%s\"; message: %s\n", \
            __LINE__, #call, rc_, dpuio_code_name(rc_), #code, (text), dpuio_last_error_message()); \
    exit(1); } \
    printf("ok %-34s %s\n", dpuio_code_name(rc_), dpuio_last_error_message()); } while (0)

struct job { dpuio_file *file; dpuio_client *client; unsigned long long sum; int rc; };

static void *reader(void *arg) {
    struct job *j = arg;
    dpuio_region *r = NULL;
    j->rc = dpuio_region_create(j->client, 1 << 16, DPUIO_REGION_READ_WRITE, &r);
    if (j->rc) return NULL;
    for (int round = 0; round < 20; round++) {
        uint64_t n = 0;
        j->rc = dpuio_pread(j->file, r, 0, 1 << 16, (uint64_t)round << 16, &n);
        if (j->rc) return NULL;
        const unsigned char *p = dpuio_region_ptr(r);
        for (uint64_t i = 0; i < n; i++) j->sum += p[i];
    }
    j->rc = dpuio_region_destroy(r);
    return NULL;
}

int main(void) {
    dpuio_attach_options o;
    dpuio_attach_options_init(&o);
    o.rings = 3;
    o.ring_entries = 8;
    dpuio_client *c = NULL;
    OK(dpuio_attach(&o, &c));

    /* The transport `auto` chose, by the name `transports` takes. */
    char name[32];
    int len = dpuio_client_transport(c, name, sizeof name);
    CHECK(len > 0 && (size_t)len == strlen(name));
    CHECK(!strcmp(name, "ucx") || !strncmp(name, "ofi-", 4));
    printf("ok transport %s\n", name);
    EXPECT(dpuio_client_transport(c, name, 2), DPUIO_E_OUT_OF_RANGE, "bytes, buf has 2");
    EXPECT(dpuio_client_transport(c, NULL, 8), DPUIO_E_INVALID_ARGUMENT, "buf is NULL");

    /* Bad arguments never crash. */
    dpuio_attr a;
    EXPECT(dpuio_stat(NULL, "/", &a), DPUIO_E_INVALID_ARGUMENT, "client handle is NULL");
    EXPECT(dpuio_stat(c, NULL, &a), DPUIO_E_INVALID_ARGUMENT, "path is NULL");
    EXPECT(dpuio_stat(c, "/", NULL), DPUIO_E_INVALID_ARGUMENT, "out is NULL");
    EXPECT(dpuio_stat(c, "/nope", &a), DPUIO_E_NOT_FOUND, "/nope");
    EXPECT(dpuio_stat((dpuio_client *)&a, "/", &a), DPUIO_E_INVALID_ARGUMENT, "not a live client handle");
    EXPECT(dpuio_mkdir(c, "/x/y", 0), DPUIO_E_NOT_FOUND, "mkdir /x/y");
    EXPECT(dpuio_mkdir(c, "/x", 0x80), DPUIO_E_INVALID_ARGUMENT, "unknown flags 0x80");
    EXPECT(dpuio_open(c, "/x", DPUIO_O_EXCL, NULL), DPUIO_E_INVALID_ARGUMENT, "out is NULL");

    /* Namespace round trip. */
    OK(dpuio_mkdir(c, "/work/a", DPUIO_MKDIR_PARENTS));
    dpuio_file *f = NULL;
    OK(dpuio_open(c, "/work/a/f.bin", DPUIO_O_RDWR | DPUIO_O_CREAT | DPUIO_O_EXCL, &f));
    EXPECT(dpuio_open(c, "/work/a/f.bin", DPUIO_O_CREAT | DPUIO_O_EXCL, &f), DPUIO_E_ALREADY_EXISTS, "f.bin");
    EXPECT(dpuio_remove(c, "/work", 0), DPUIO_E_FAILED_PRECONDITION, "/work");

    /* Write 1.25 MiB with an array of requests, read it back with a batch. */
    dpuio_region *w = NULL, *r = NULL;
    OK(dpuio_region_create(c, 5 << 18, DPUIO_REGION_READ_BY_AGENT, &w));
    OK(dpuio_region_create(c, 5 << 18, DPUIO_REGION_WRITE_BY_AGENT, &r));
    unsigned char *wp = dpuio_region_ptr(w);
    CHECK(wp && dpuio_region_len(w) == 5 << 18);
    for (size_t i = 0; i < 5 << 18; i++) wp[i] = (unsigned char)(i * 7 + 1);
    dpuio_batch *b = NULL;
    OK(dpuio_batch_create(c, &b));
    dpuio_io ios[5];
    for (int i = 0; i < 5; i++) {
        ios[i] = (dpuio_io){DPUIO_OP_WRITE, i == 4 ? DPUIO_IO_SYNC : 0, f, w,
                            (uint64_t)i << 18, 1 << 18, (uint64_t)i << 18, 100 + i};
    }
    CHECK(dpuio_batch_prep(b, ios, 5) == 5);
    CHECK(dpuio_batch_in_flight(b) == 5 && dpuio_batch_room(b) == 3);
    CHECK(dpuio_batch_submit(b) == 5);
    dpuio_completion done[8];
    int got = 0;
    while (got < 5) {
        int n = dpuio_batch_wait(b, done, 8, 1, 10000);
        CHECK(n > 0);
        for (int i = 0; i < n; i++) CHECK(done[i].result == 1 << 18 && done[i].user_data >= 100);
        got += n;
    }
    CHECK(dpuio_batch_in_flight(b) == 0);
    CHECK(dpuio_batch_wait(b, done, 8, 1, 0) == 0); /* nothing in flight: returns at once */

    /* Mistakes are refused at prep time, with the index of the bad entry. */
    ios[2].region = NULL;
    EXPECT(dpuio_batch_prep(b, ios, 5), DPUIO_E_INVALID_ARGUMENT, "ios[2]: the region handle is NULL");
    CHECK(dpuio_batch_in_flight(b) == 0);
    EXPECT(dpuio_batch_prep_read(b, f, r, 5 << 18, 1, 0, 0), DPUIO_E_OUT_OF_RANGE, "outside the");
    EXPECT(dpuio_batch_prep_read(b, f, r, 0, 0, 0, 0), DPUIO_E_INVALID_ARGUMENT, "length is 0");
    for (int i = 0; i < 8; i++) OK(dpuio_batch_prep_read(b, f, r, 0, 16, 0, i));
    EXPECT(dpuio_batch_prep_read(b, f, r, 0, 16, 0, 9), DPUIO_E_RESOURCE_EXHAUSTED, "ring is full");
    CHECK(dpuio_batch_submit(b) == 8);
    CHECK(dpuio_batch_wait(b, done, 8, 8, 10000) == 8);

    for (int i = 0; i < 5; i++) OK(dpuio_batch_prep_read(b, f, r, (uint64_t)i << 18, 1 << 18, (uint64_t)i << 18, i));
    OK(dpuio_batch_submit(b));
    /* Room for 2 completions in this call: the other 3 stay for the next one. */
    CHECK(dpuio_batch_wait(b, done, 2, 2, 10000) == 2);
    CHECK(dpuio_batch_in_flight(b) == 3);
    CHECK(dpuio_batch_wait(b, done + 2, 3, 3, 10000) == 3);
    for (int i = 0; i < 5; i++) CHECK(done[i].result == 1 << 18 && done[i].status == 0);
    CHECK(memcmp(dpuio_region_ptr(r), wp, 5 << 18) == 0);
    /* A read through a region the agent may not write completes with an error. */
    OK(dpuio_batch_prep_read(b, f, w, 0, 16, 0, 7));
    OK(dpuio_batch_submit(b));
    CHECK(dpuio_batch_wait(b, done, 8, 1, 10000) == 1);
    CHECK(done[0].result == DPUIO_E_PERMISSION_DENIED && done[0].status != 0);
    printf("ok completion %s (agent status %d)\n", dpuio_code_name((int)done[0].result), done[0].status);

    /* Every ring held by a batch: the next batch is refused, not blocked forever. */
    dpuio_batch *b2 = NULL, *b3 = NULL, *b4 = NULL;
    OK(dpuio_batch_create(c, &b2));
    OK(dpuio_batch_create(c, &b3));
    EXPECT(dpuio_batch_create(c, &b4), DPUIO_E_RESOURCE_EXHAUSTED, "all 3 rings");
    OK(dpuio_batch_destroy(b3));
    OK(dpuio_batch_destroy(b2));

    /* Four threads reading through one client (pread takes a ring per call). */
    dpuio_file *ro = NULL;
    OK(dpuio_open(c, "/data/blob.bin", DPUIO_O_RDONLY, &ro));
    pthread_t t[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct job){ro, c, 0, 0};
        CHECK(pthread_create(&t[i], NULL, reader, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(jobs[i].rc == 0);
        CHECK(jobs[i].sum == jobs[0].sum);
    }
    printf("threads sum=%llu\n", jobs[0].sum);

    /* Listing with an iterator. */
    dpuio_dir *d = NULL;
    OK(dpuio_dir_open(c, "/work/a", 1, &d));
    dpuio_dirent e;
    CHECK(dpuio_dir_next(d, &e) == 1 && strcmp(e.name, "f.bin") == 0 && e.attr.size == 5 << 18);
    CHECK(dpuio_dir_next(d, &e) == 0);
    OK(dpuio_dir_close(d));

    OK(dpuio_rename(c, "/work/a/f.bin", "/work/a/g.bin"));
    dpuio_file *h = NULL;
    OK(dpuio_open(c, "/work/a/h.bin", DPUIO_O_CREAT | DPUIO_O_TRUNC, &h));
    EXPECT(dpuio_rename(c, "/work/a/g.bin", "/work/a/h.bin"), DPUIO_E_ALREADY_EXISTS, "h.bin");

    /* A whole-file put replaces g.bin (1.25 MiB) with 3 bytes in one step, and leaves
       no temporary file; a put of nothing empties it; bad arguments are refused. */
    OK(dpuio_put(c, "/work/a/g.bin", "abc", 3));
    OK(dpuio_stat(c, "/work/a/g.bin", &a));
    CHECK(a.size == 3);
    dpuio_file *g = NULL;
    uint64_t gn = 0;
    OK(dpuio_open(c, "/work/a/g.bin", DPUIO_O_RDONLY, &g));
    OK(dpuio_pread(g, r, 0, 16, 0, &gn));
    CHECK(gn == 3 && memcmp(dpuio_region_ptr(r), "abc", 3) == 0);
    OK(dpuio_close(g));
    OK(dpuio_put(c, "/work/a/new.bin", NULL, 0));
    OK(dpuio_stat(c, "/work/a/new.bin", &a));
    CHECK(a.size == 0);
    EXPECT(dpuio_put(c, "/work/a/g.bin", NULL, 5), DPUIO_E_INVALID_ARGUMENT, "data is NULL but len is 5");
    EXPECT(dpuio_put(c, "/work/a/", "x", 1), DPUIO_E_INVALID_ARGUMENT, "needs a file name");
    EXPECT(dpuio_put(c, "/nodir/x", "x", 1), DPUIO_E_NOT_FOUND, "nodir");
    int entries = 0;
    OK(dpuio_dir_open(c, "/work/a", 0, &d));
    while (dpuio_dir_next(d, &e) == 1) {
        CHECK(strstr(e.name, ".dpuio-put.") == NULL);
        entries++;
    }
    OK(dpuio_dir_close(d));
    CHECK(entries == 3); /* g.bin, h.bin, new.bin */

    /* Used after destroy: refused by the handle registry. */
    OK(dpuio_region_destroy(w));
    EXPECT(dpuio_region_destroy(w), DPUIO_E_INVALID_ARGUMENT, "not a live region handle");
    CHECK(dpuio_region_ptr(w) == NULL);
    EXPECT(dpuio_batch_prep_read(b, f, w, 0, 1, 0, 0), DPUIO_E_INVALID_ARGUMENT, "not a live region handle");
    EXPECT(dpuio_batch_prep_read(b, f, (dpuio_region *)f, 0, 1, 0, 0), DPUIO_E_INVALID_ARGUMENT,
           "expected a region handle, got a file handle");

    /* After detach, objects of the client say so. */
    OK(dpuio_detach(c));
    EXPECT(dpuio_fsync(f), DPUIO_E_CLOSED, "detached");
    EXPECT(dpuio_batch_submit(b), DPUIO_E_CLOSED, "detached");
    EXPECT(dpuio_stat(c, "/", &a), DPUIO_E_INVALID_ARGUMENT, "not a live client handle");
    OK(dpuio_batch_destroy(b));
    OK(dpuio_region_destroy(r));
    OK(dpuio_close(f));
    OK(dpuio_close(ro));
    OK(dpuio_close(h));
    printf("all ok\n");
    return 0;
}
"#;

#[test]
fn error_paths_threads_and_batches_from_c() {
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path());
    pattern_file(&agent, "blob.bin", 20 << 16);
    let source = dir.path().join("errors.c");
    std::fs::write(&source, ERRORS_C).unwrap();
    let exe = cc("errors", &source, Link::Shared, dir.path());
    let out = agent.run(&exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.ends_with("all ok\n"), "{stdout}");
}

/// A batch loop that runs until `STOP` exists: each round reads the whole file in
/// 1 MiB requests through one batch and checks its checksum. Prints the rounds and the
/// longest one.
const RESTART_C: &str = r#"
#include <dpuio.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)
#define CHUNKS 8

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what, int code) {
    fprintf(stderr, "%s: %d %s\n", what, code, dpuio_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const char *path = argv[1], *stop = argv[2];
    uint64_t want = strtoull(argv[3], NULL, 16);
    dpuio_attach_options o;
    dpuio_attach_options_init(&o);
    o.transports = "ucx-shm";
    o.rings = 2;
    o.resume_wait_ms = 30000;
    dpuio_client *c;
    int rc = dpuio_attach(&o, &c);
    if (rc) return fail("attach", rc);
    dpuio_file *f;
    if ((rc = dpuio_open(c, path, DPUIO_O_RDONLY, &f))) return fail("open", rc);
    dpuio_region *r;
    if ((rc = dpuio_region_create(c, (size_t)CHUNK * CHUNKS, DPUIO_REGION_WRITE_BY_AGENT, &r))) return fail("region", rc);
    const unsigned char *mem = dpuio_region_ptr(r);
    dpuio_batch *b;
    if ((rc = dpuio_batch_create(c, &b))) return fail("batch", rc);
    unsigned rounds = 0;
    double longest = 0;
    while (access(stop, F_OK) != 0) {
        double t0 = now();
        for (unsigned i = 0; i < CHUNKS; i++) {
            rc = dpuio_batch_prep_read(b, f, r, (uint64_t)i * CHUNK, CHUNK, (uint64_t)i * CHUNK, i);
            if (rc) return fail("prep", rc);
        }
        if ((rc = dpuio_batch_submit(b)) != CHUNKS) return fail("submit", rc);
        dpuio_completion done[CHUNKS];
        size_t got = 0;
        while (got < CHUNKS) {
            rc = dpuio_batch_wait(b, done + got, CHUNKS - got, CHUNKS - got, -1);
            if (rc < 0) return fail("wait", rc);
            got += (size_t)rc;
        }
        for (unsigned i = 0; i < CHUNKS; i++) {
            if (done[i].result != CHUNK) {
                fprintf(stderr, "round %u: request %" PRIu64 " ended %" PRId64 " (status %d)\n", rounds,
                        done[i].user_data, done[i].result, done[i].status);
                return 1;
            }
        }
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t k = 0; k < (size_t)CHUNK * CHUNKS; k++) h = (h ^ mem[k]) * 0x100000001b3ull;
        if (h != want) {
            fprintf(stderr, "round %u: checksum %016" PRIx64 ", want %016" PRIx64 "\n", rounds, h, want);
            return 1;
        }
        double took = now() - t0;
        if (took > longest) longest = took;
        rounds++;
        memset((void *)mem, 0, (size_t)CHUNK * CHUNKS);
    }
    dpuio_batch_destroy(b);
    dpuio_region_destroy(r);
    dpuio_close(f);
    dpuio_detach(c);
    printf("rounds %u longest_ms %.0f\n", rounds, longest * 1000);
    return 0;
}
"#;

#[test]
fn a_c_batch_loop_keeps_running_through_kill_9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = TestAgent::start(dir.path());
    let data = pattern_file(&agent, "blob.bin", 8 << 20);
    let source = dir.path().join("restart.c");
    std::fs::write(&source, RESTART_C).unwrap();
    let exe = cc("restart", &source, Link::Shared, dir.path());
    let stop = dir.path().join("stop");
    let mut cmd = Command::new(&exe);
    hermetic(&mut cmd, &agent.agent.data_dir.join(".home"))
        .args(["/data/blob.bin", stop.to_str().unwrap(), &format!("{:016x}", fnv1a(&data))])
        .env("DPUIO_AGENT", agent.agent.url())
        .env("DPUIO_CONFIG_DIR", &agent.config_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let program = cmd.spawn().expect("start the C loop");
    std::thread::sleep(std::time::Duration::from_secs(1));
    agent.agent.signal("KILL");
    agent.agent.wait(std::time::Duration::from_secs(10));
    let _restarted = agent.agent.restart(); // serves until the loop stops
    std::thread::sleep(std::time::Duration::from_secs(2));
    std::fs::write(&stop, b"").unwrap();
    let out = program.wait_with_output().expect("the C loop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let longest_ms: f64 = stdout
        .split_whitespace()
        .skip_while(|w| *w != "longest_ms")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no figures in {stdout:?}"));
    assert!(longest_ms <= 5000.0, "a round stalled {longest_ms} ms (at most 5 s)");
}
