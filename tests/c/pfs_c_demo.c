/*
 * pfs_c_demo: a C program instrumented through libpfs (include/pfs.h),
 * run by tests/tests/c_abi.rs as a separate process.
 *
 *   pfs_c_demo SHM_DIR SERVICE THREADS ITERATIONS
 *
 * Each of THREADS threads declares an actor, then runs ITERATIONS
 * statements (statement/capp/query), each with two stages
 * (stage/capp/parsing with one mutex wait, stage/capp/executing with two
 * file writes of 512 bytes), one error every fifth statement, then one
 * condition wait outside any statement, and accounts three allocations
 * of 1000 bytes of memory/capp/buffer, freeing one. The threads then stay
 * alive (their records and histories readable) until standard input
 * reaches end of file; then they exit and the program prints a last line.
 *
 * Standard output: one JSON line when ready, {"ready":true,...,"threads":
 * [{"thread_id":T,"last_statement":E},...]} (each thread's pfs_thread_id
 * and the pfs_statement_event_id of its last statement), one when
 * done, {"done":true}. Misuse of the API (NULL pointers, invalid UTF-8,
 * wrong names, double ends) is exercised first: any unexpected result
 * exits with status 1 and a message on standard error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pfs.h"

static const pfs_wait_class_t *MUTEX, *FILE_IO, *COND;
static const pfs_stage_class_t *PARSING, *EXECUTING;
static const pfs_statement_class_t *QUERY;
static const pfs_memory_class_t *BUFFER;
static long ITERATIONS;
/* The data file's OBJECT_NAME, interned once after pfs_init. */
static uint32_t DATA_NAME = PFS_NO_OBJECT_NAME;
#define DATA_PATH "/var/lib/capp/data.db"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int workers_done = 0;
static uint64_t thread_ids[64], last_statement_ids[64];
static int release = 0;

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "pfs_c_demo: check failed at line %d: %s\n",  \
                    __LINE__, #cond);                                     \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

static void *worker(void *arg) {
    long id = (long)arg;
    char text[64];
    int verdict = pfs_set_thread_actor("capp", "localhost", "worker");
    CHECK(verdict == (PFS_ACTOR_INSTRUMENTED | PFS_ACTOR_HISTORY));
    thread_ids[id] = pfs_thread_id();
    CHECK(thread_ids[id] != 0);
    CHECK(pfs_statement_event_id() == 0);

    for (long i = 0; i < ITERATIONS; i++) {
        pfs_statement_t st;
        PFS_STATEMENT_BEGIN(&st, QUERY); /* SOURCE: this line */
        last_statement_ids[id] = pfs_statement_event_id();
        CHECK(last_statement_ids[id] != 0);
        snprintf(text, sizeof text, "SELECT %ld FROM t%ld", i, id);
        pfs_statement_set_text(&st, text);
        pfs_statement_set_digest_text(&st, "SELECT ? FROM t?");
        pfs_statement_set_rows_examined(&st, 10);
        pfs_statement_set_rows_sent(&st, 2);

        PFS_STAGE_ENTER(PARSING);
        pfs_wait_t w;
        PFS_WAIT_BEGIN(&w, MUTEX, PFS_OP_LOCK, (uint64_t)(uintptr_t)&lock);
        pfs_wait_end(&w);

        PFS_STAGE_ENTER(EXECUTING);
        for (int k = 0; k < 2; k++) {
            pfs_wait_t io; /* the first unnamed, the second named */
            if (k == 0)
                PFS_WAIT_BEGIN(&io, FILE_IO, PFS_OP_WRITE, 42);
            else
                PFS_WAIT_BEGIN_NAMED(&io, FILE_IO, PFS_OP_WRITE, 42, DATA_NAME);
            pfs_wait_end_bytes(&io, 512);
        }
        if (i % 5 == 0) pfs_statement_add_errors(&st, 1);
        pfs_statement_end(&st); /* ends the executing stage too */
        CHECK(pfs_statement_event_id() == 0);
    }

    pfs_wait_t cw; /* a wait outside any statement: no nesting; no SOURCE */
    pfs_wait_begin(&cw, COND, PFS_OP_WAIT, 7);
    pfs_wait_end(&cw);

    pfs_memory_t blocks[3];
    for (int k = 0; k < 3; k++) CHECK(pfs_memory_alloc(&blocks[k], BUFFER, 1000));
    pfs_memory_free(&blocks[0]);
    pfs_memory_free(&blocks[0]); /* a second free of one token: no-op */

    pthread_mutex_lock(&lock);
    workers_done++;
    pthread_cond_broadcast(&changed);
    while (!release) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Misuse never crashes and records nothing. */
static void misuse(void) {
    CHECK(pfs_wait_class_register(NULL) == NULL);
    CHECK(pfs_wait_class_register("stage/capp/parsing") == NULL);
    CHECK(pfs_wait_class_register("wait/synch/mutex/capp/\xff") == NULL);
    CHECK(pfs_stage_class_register("statement/capp/query") == NULL);
    CHECK(pfs_statement_class_register("memory/capp/x") == NULL);
    CHECK(pfs_memory_class_register("wait/io/file/capp/x") == NULL);
    CHECK(pfs_set_thread_actor(NULL, "h", "r") == PFS_ERR_INVALID_ARGUMENT);
    CHECK(pfs_set_thread_actor("u\xfe", "h", "r") == PFS_ERR_INVALID_ARGUMENT);

    CHECK(pfs_object_name(NULL) == PFS_NO_OBJECT_NAME);
    CHECK(pfs_object_name("/tmp/\xff") == PFS_NO_OBJECT_NAME);
    pfs_wait_t w;
    pfs_wait_begin_named(NULL, FILE_IO, PFS_OP_READ, 0, 0);
    pfs_wait_begin_named(&w, NULL, PFS_OP_READ, 0, 0);
    pfs_wait_end(&w);
    PFS_WAIT_BEGIN_NAMED(&w, NULL, PFS_OP_READ, 0, PFS_NO_OBJECT_NAME);
    pfs_wait_end(&w);
    pfs_wait_begin(NULL, MUTEX, PFS_OP_LOCK, 0);
    pfs_wait_begin(&w, NULL, PFS_OP_LOCK, 0);
    pfs_wait_end(&w);
    PFS_WAIT_BEGIN(NULL, MUTEX, PFS_OP_LOCK, 0);
    PFS_WAIT_BEGIN(&w, NULL, PFS_OP_LOCK, 0);
    pfs_wait_end(&w);
    pfs_wait_begin_at(&w, NULL, PFS_OP_LOCK, 0, NULL);
    pfs_wait_end(&w);
    PFS_STAGE_ENTER(NULL);
    pfs_stage_enter_at(NULL, NULL);
    pfs_wait_end(NULL);
    pfs_wait_end_bytes(NULL, 1);
    pfs_stage_enter(NULL);
    pfs_statement_t st;
    pfs_statement_begin(&st, NULL);
    pfs_statement_set_text(&st, "not recorded");
    pfs_statement_end(&st);
    PFS_STATEMENT_BEGIN(&st, NULL);
    PFS_STATEMENT_BEGIN(NULL, QUERY);
    pfs_statement_end(&st);
    pfs_statement_set_text(NULL, NULL);
    pfs_statement_end(NULL);
    pfs_memory_t m;
    CHECK(!pfs_memory_alloc(&m, NULL, 10));
    pfs_memory_free(&m);
    CHECK(!pfs_memory_alloc(NULL, BUFFER, 10));
    pfs_memory_free(NULL);
    CHECK(pfs_init_with(NULL) == PFS_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s SHM_DIR SERVICE THREADS ITERATIONS\n", argv[0]);
        return 2;
    }
    long threads = strtol(argv[3], NULL, 10);
    ITERATIONS = strtol(argv[4], NULL, 10);

    /* Classes may be registered before pfs_init; before it, every call is
     * a no-op. */
    MUTEX = pfs_wait_class_register("wait/synch/mutex/capp/lock");
    FILE_IO = pfs_wait_class_register("wait/io/file/capp/data");
    COND = pfs_wait_class_register("wait/synch/cond/capp/changed");
    PARSING = pfs_stage_class_register("stage/capp/parsing");
    EXECUTING = pfs_stage_class_register("stage/capp/executing");
    QUERY = pfs_statement_class_register("statement/capp/query");
    BUFFER = pfs_memory_class_register("memory/capp/buffer");
    CHECK(MUTEX && FILE_IO && COND && PARSING && EXECUTING && QUERY && BUFFER);
    CHECK(MUTEX == pfs_wait_class_register("wait/synch/mutex/capp/lock"));
    CHECK(!pfs_is_initialized());
    CHECK(pfs_object_name(DATA_PATH) == PFS_NO_OBJECT_NAME); /* before init */
    pfs_wait_t early;
    pfs_wait_begin(&early, MUTEX, PFS_OP_LOCK, 1); /* not counted */
    pfs_wait_end(&early);
    misuse();

    pfs_config_t cfg = {0};
    cfg.service_name = argv[2];
    cfg.shm_dir = argv[1];
    cfg.history_len = 32;
    cfg.flags = PFS_CONFIG_NO_RECLAIM;
    int rc = pfs_init_with(&cfg);
    if (rc != PFS_OK) {
        char msg[256];
        pfs_init_error(msg, sizeof msg);
        fprintf(stderr, "pfs_init_with: %d: %s\n", rc, msg);
        return 1;
    }
    CHECK(pfs_is_initialized());
    CHECK(pfs_init() == PFS_ERR_ALREADY_INITIALIZED);
    char msg[256];
    CHECK(pfs_init_error(msg, sizeof msg) > 0 && strstr(msg, "already") != NULL);
    CHECK(pfs_wait_class_enabled(MUTEX));
    misuse();
    DATA_NAME = pfs_object_name(DATA_PATH);
    CHECK(DATA_NAME != PFS_NO_OBJECT_NAME);
    CHECK(pfs_object_name(DATA_PATH) == DATA_NAME); /* one handle per text */

    pthread_t tids[64];
    CHECK(threads > 0 && threads <= 64);
    for (long t = 0; t < threads; t++)
        CHECK(pthread_create(&tids[t], NULL, worker, (void *)t) == 0);

    pthread_mutex_lock(&lock);
    while (workers_done < threads) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);

    char path[512];
    size_t n = pfs_segment_path(path, sizeof path);
    CHECK(n > 0 && n < sizeof path);
    printf("{\"ready\":true,\"pid\":%ld,\"segment\":\"%s\",\"threads\":[", (long)getpid(), path);
    for (long t = 0; t < threads; t++)
        printf("%s{\"thread_id\":%llu,\"last_statement\":%llu}", t ? "," : "",
               (unsigned long long)thread_ids[t], (unsigned long long)last_statement_ids[t]);
    printf("]}\n");
    fflush(stdout);

    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }

    pthread_mutex_lock(&lock);
    release = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    for (long t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    printf("{\"done\":true}\n");
    fflush(stdout);
    return 0;
}
