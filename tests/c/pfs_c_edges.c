/*
 * pfs_c_edges: the edges of the C API (include/pfs.h, libpfs), one mode
 * per run, run by tests/tests/c_abi.rs, which reads the results from the
 * segment:
 *
 *   pfs_c_edges owner SHM_DIR SERVICE   ends of waits and statements that
 *                                       the ending thread did not begin
 *   pfs_c_edges lost SHM_DIR SERVICE THREADS EVENTS
 *                                       THREADS threads, 16 thread records
 *   pfs_c_edges names SHM_DIR SERVICE   thread names: OS and pfs_set_thread_name
 *   pfs_c_edges config SHM_DIR          pfs_config_t checks, pfs_strerror
 *   pfs_c_edges abi SHM_DIR             PFS_ABI_VERSION and pfs_check_abi
 *   pfs_c_edges abi_late SHM_DIR        an ABI check that fails after pfs_init
 *   pfs_c_edges key_dtor SHM_DIR SERVICE THREADS
 *                                       events ended by pthread key destructors
 *   pfs_c_edges tasks SHM_DIR SERVICE   async tasks (pfs_task_t) resumed by two
 *                                       threads in turn
 *   pfs_c_edges abandoned SHM_DIR SERVICE
 *                                       statements never ended (an exception
 *                                       between begin and end), begun again
 *   pfs_c_edges warnings SHM_DIR        where warnings go: standard error,
 *                                       the program's handler, nowhere
 *
 * Standard output: JSON lines. The modes owner, lost, names, abi_late,
 * key_dtor, tasks and abandoned print
 * {"ready":true,"segment":PATH,...} once their events are recorded, keep
 * their threads alive until standard input reaches end of file, then
 * exit. The others print one line and exit. Any unexpected result exits
 * with status 1 and a message on standard error.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pfs.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "pfs_c_edges: check failed at line %d: %s\n",   \
                    __LINE__, #cond);                                       \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* The text a macro expands to, as a string. */
#define STRINGIFY(x) #x
#define EXPANDED(x) STRINGIFY(x)

static void init_or_die(const char *shm_dir, const char *service, uint32_t max_threads) {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.service_name = service;
    cfg.shm_dir = shm_dir;
    cfg.max_threads = max_threads;
    cfg.flags = PFS_CONFIG_NO_RECLAIM;
    int rc = pfs_init_with(&cfg);
    if (rc != PFS_OK) {
        char msg[512];
        pfs_init_error(msg, sizeof msg);
        fprintf(stderr, "pfs_init_with: %s: %s\n", pfs_strerror(rc), msg);
        exit(1);
    }
}

static void print_segment_line(const char *extra) {
    char path[512];
    size_t n = pfs_segment_path(path, sizeof path);
    CHECK(n > 0 && n < sizeof path);
    printf("{\"ready\":true,\"segment\":\"%s\"%s}\n", path, extra);
    fflush(stdout);
}

static void wait_for_eof(void) {
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
}

/* A step-by-step handshake between two threads. */
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_changed = PTHREAD_COND_INITIALIZER;
static int step = 0;

static void set_step(int s) {
    pthread_mutex_lock(&step_lock);
    step = s;
    pthread_cond_broadcast(&step_changed);
    pthread_mutex_unlock(&step_lock);
}

static void await_step(int s) {
    pthread_mutex_lock(&step_lock);
    while (step < s) pthread_cond_wait(&step_changed, &step_lock);
    pthread_mutex_unlock(&step_lock);
}

/* ---- owner ---------------------------------------------------------- */

static const pfs_wait_class_t *OWNED;
static const pfs_statement_class_t *OWNED_ST;
static pfs_wait_t shared_w;
static pfs_statement_t shared_st;
static pfs_wait_t *orphan_w;
static unsigned char stale[sizeof(pfs_wait_t)];

/* Begins a wait and a statement, lets main try to end them, then ends
 * them itself: main's ends must be no-ops (NUMBER_OF_BYTES 7, not 999). */
static void *begins_and_waits(void *arg) {
    (void)arg;
    pfs_wait_begin(&shared_w, OWNED, PFS_OP_LOCK, 1);
    pfs_statement_begin(&shared_st, OWNED_ST);
    set_step(1);
    await_step(2);
    pfs_wait_end_bytes(&shared_w, 7);
    pfs_statement_set_rows_sent(&shared_st, 1);
    pfs_statement_end(&shared_st);
    return NULL;
}

/* Begins a wait and exits without ending it: its context is freed. */
static void *begins_and_exits(void *arg) {
    (void)arg;
    pfs_wait_begin(orphan_w, OWNED, PFS_OP_LOCK, 2);
    return NULL;
}

/* Leaves a copy of a begun wait where a later thread's stack may be
 * (what a reused stack holds), then ends its own wait and exits. */
static void *leaves_a_copy(void *arg) {
    (void)arg;
    pfs_wait_t w;
    pfs_wait_begin(&w, OWNED, PFS_OP_LOCK, 3);
    memcpy(stale, &w, sizeof w);
    pfs_wait_end(&w);
    return NULL;
}

/* An uninitialised wait on a stack that holds what an exited thread left. */
static void *ends_stale_memory(void *arg) {
    (void)arg;
    pfs_wait_t w;
    memcpy(&w, stale, sizeof w);
    pfs_wait_end_bytes(&w, 1000);
    pfs_statement_t st;
    memset(&st, 0xa5, sizeof st);
    pfs_statement_set_rows_sent(&st, 1000);
    pfs_statement_end(&st);
    return NULL;
}

static int owner(const char *shm_dir, const char *service) {
    /* Freed memory is overwritten (as MALLOC_PERTURB_ does): a write
     * through an exited thread's context would crash or show. */
    CHECK(mallopt(M_PERTURB, 0xa5) == 1);
    OWNED = pfs_wait_class_register("wait/synch/mutex/cedge/owned");
    OWNED_ST = pfs_statement_class_register("statement/cedge/owned");
    CHECK(OWNED && OWNED_ST);
    init_or_die(shm_dir, service, 0);

    /* A wait and a statement begun on a live thread: another thread's end
     * and set are no-ops; the owner still ends them. */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, begins_and_waits, NULL) == 0);
    await_step(1);
    pfs_wait_end_bytes(&shared_w, 999);
    pfs_wait_end(&shared_w);
    pfs_statement_set_rows_sent(&shared_st, 1000);
    pfs_statement_add_errors(&shared_st, 1000);
    pfs_statement_end(&shared_st);
    set_step(2);
    CHECK(pthread_join(t, NULL) == 0);

    /* A wait begun on a thread that has exited since. */
    orphan_w = malloc(sizeof *orphan_w);
    CHECK(orphan_w != NULL);
    CHECK(pthread_create(&t, NULL, begins_and_exits, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    pfs_wait_end_bytes(orphan_w, 1000);
    free(orphan_w);

    /* What an exited thread left on a stack, ended by a later thread and
     * by this one; and garbage. */
    CHECK(pthread_create(&t, NULL, leaves_a_copy, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(pthread_create(&t, NULL, ends_stale_memory, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    pfs_wait_end_bytes((pfs_wait_t *)(void *)stale, 1000);
    pfs_wait_t garbage;
    memset(&garbage, 0x5a, sizeof garbage);
    pfs_wait_end(&garbage);

    /* Recorded: the owner's wait (7 bytes) and leaves_a_copy's (0 bytes),
     * one statement with ROWS_SENT 1, no error; six ends refused as
     * another thread's (counted), the garbage's not. */
    print_segment_line("");
    wait_for_eof();
    return 0;
}

/* ---- abandoned ------------------------------------------------------ */

/* Ten statements of one struct, three of them left open (as an exception
 * between begin and end leaves them) and begun again; then one left open
 * with a statement inside it (an exception through both), its struct
 * begun again; then one on its own. Recorded: twelve `abandoned`
 * statements, ROWS_SENT 10, four errors (the four ended by the next
 * begin), no `inner` one (forgotten with its outer one); the last
 * statement nested in none of them. */
static int abandoned(const char *shm_dir, const char *service) {
    const pfs_statement_class_t *req = pfs_statement_class_register("statement/cedge/abandoned");
    const pfs_statement_class_t *inner_cls = pfs_statement_class_register("statement/cedge/inner");
    const pfs_statement_class_t *after = pfs_statement_class_register("statement/cedge/after");
    CHECK(req && inner_cls && after);
    init_or_die(shm_dir, service, 0);
    pfs_statement_t st;
    for (int i = 0; i < 10; i++) {
        PFS_STATEMENT_BEGIN(&st, req);
        pfs_statement_set_rows_sent(&st, 1);
        if (i % 3 == 1) continue; /* "an exception": never ended */
        pfs_statement_end(&st);
    }
    pfs_statement_t outer, inner;
    PFS_STATEMENT_BEGIN(&outer, req);
    PFS_STATEMENT_BEGIN(&inner, inner_cls); /* both abandoned */
    PFS_STATEMENT_BEGIN(&outer, req);
    pfs_statement_end(&outer);
    pfs_statement_t top;
    PFS_STATEMENT_BEGIN(&top, after);
    pfs_statement_end(&top);
    print_segment_line("");
    wait_for_eof();
    return 0;
}

/* ---- warnings ------------------------------------------------------- */

static char last_warning[512];

static void record_warning(const char *message, void *user) {
    (*(int *)user)++;
    snprintf(last_warning, sizeof last_warning, "%s", message);
}

/* A handler that names none once it has run: no lock is held while it
 * runs, so it can. */
static void once_then_none(const char *message, void *user) {
    record_warning(message, user);
    pfs_set_warning_handler(NULL, NULL);
}

/* A statement before pfs_init (standard error: the library's default,
 * from its load), a misnamed class with a handler named (the handler),
 * then two more with a handler that drops the next, then another with
 * none (nowhere). */
static int warnings(const char *shm_dir) {
    const pfs_statement_class_t *early = pfs_statement_class_register("statement/cedge/early");
    CHECK(early != NULL);
    /* A misnamed class before pfs_init: said (not counted), once. */
    CHECK(pfs_wait_class_register("stage/cedge/early") == NULL);
    CHECK(pfs_wait_class_register("stage/cedge/early") == NULL);
    pfs_statement_t st;
    PFS_STATEMENT_BEGIN(&st, early);
    pfs_statement_end(&st);
    init_or_die(shm_dir, "c-warnings", 0);
    int handled = 0;
    pfs_set_warning_handler(record_warning, &handled);
    CHECK(pfs_wait_class_register("stage/cedge/handled") == NULL);
    int after_handler = handled;
    int once = 0;
    pfs_set_warning_handler(once_then_none, &once);
    CHECK(pfs_wait_class_register("stage/cedge/once") == NULL);
    CHECK(pfs_wait_class_register("stage/cedge/after_once") == NULL);
    CHECK(once == 1);
    pfs_set_warning_handler(NULL, NULL);
    CHECK(pfs_wait_class_register("stage/cedge/dropped") == NULL);
    /* The handler's text: one line naming the class. */
    int names_it = strncmp(last_warning, "pfs: not a PFS wait instrument name", 35) == 0 &&
                   strstr(last_warning, "stage/cedge/once") != NULL &&
                   strchr(last_warning, '\n') == NULL;
    printf("{\"handled\":%d,\"after_none\":%d,\"names_it\":%s}\n", after_handler, handled,
           names_it ? "true" : "false");
    return 0;
}

/* ---- lost ----------------------------------------------------------- */

static const pfs_wait_class_t *BUSY;
static long LOST_EVENTS_PER_THREAD;
static pthread_barrier_t started, recorded;

static void *records_events(void *arg) {
    (void)arg;
    /* Every thread is alive before any registers: the first 16 to
     * register take the 16 records and keep them until all are done. */
    pthread_barrier_wait(&started);
    for (long i = 0; i < LOST_EVENTS_PER_THREAD; i++) {
        pfs_wait_t w;
        pfs_wait_begin(&w, BUSY, PFS_OP_LOCK, (uint64_t)i);
        pfs_wait_end(&w);
    }
    /* A lookup for a log line, not an event: no loss counted for it. */
    (void)pfs_thread_id();
    (void)pfs_thread_id();
    pthread_barrier_wait(&recorded);
    await_step(1);
    return NULL;
}

static int lost(const char *shm_dir, const char *service, long threads, long events) {
    CHECK(threads > 0 && threads <= 256);
    LOST_EVENTS_PER_THREAD = events;
    BUSY = pfs_wait_class_register("wait/synch/mutex/cedge/busy");
    init_or_die(shm_dir, service, 16);
    CHECK(pthread_barrier_init(&started, NULL, (unsigned)threads) == 0);
    CHECK(pthread_barrier_init(&recorded, NULL, (unsigned)threads + 1) == 0);
    pthread_t tids[256];
    for (long t = 0; t < threads; t++)
        CHECK(pthread_create(&tids[t], NULL, records_events, NULL) == 0);
    pthread_barrier_wait(&recorded);
    print_segment_line("");
    wait_for_eof();
    set_step(1);
    for (long t = 0; t < threads; t++) CHECK(pthread_join(tids[t], NULL) == 0);
    return 0;
}

/* ---- names ---------------------------------------------------------- */

static const pfs_wait_class_t *NAMED;
static uint64_t named_ids[4];
static pthread_barrier_t named;

static void one_wait(void) {
    pfs_wait_t w;
    pfs_wait_begin(&w, NAMED, PFS_OP_LOCK, 0);
    pfs_wait_end(&w);
}

static void *named_thread(void *arg) {
    long which = (long)arg;
    switch (which) {
    case 0: /* named by the OS only */
        CHECK(pthread_setname_np(pthread_self(), "c-os-named") == 0);
        one_wait();
        break;
    case 1: /* named through the API before its first event */
        CHECK(pfs_set_thread_name("pfs-named-worker") == PFS_OK);
        one_wait();
        break;
    case 2: /* registered under its OS name, renamed after */
        CHECK(pthread_setname_np(pthread_self(), "c-before") == 0);
        one_wait();
        CHECK(pfs_set_thread_name("renamed-later") == PFS_OK);
        break;
    default: /* a name longer than the column: cut to 32 bytes */
        CHECK(pfs_set_thread_name("a-thread-name-of-forty-bytes-long-xxxxxx") == PFS_OK);
        one_wait();
        break;
    }
    CHECK(pfs_set_thread_name(NULL) == PFS_ERR_INVALID_ARGUMENT);
    CHECK(pfs_set_thread_name("") == PFS_ERR_INVALID_ARGUMENT);
    named_ids[which] = pfs_thread_id();
    CHECK(named_ids[which] != 0);
    pthread_barrier_wait(&named);
    await_step(1);
    return NULL;
}

static int names(const char *shm_dir, const char *service) {
    NAMED = pfs_wait_class_register("wait/synch/mutex/cedge/named");
    CHECK(pfs_set_thread_name("too-early") == PFS_ERR_NOT_INITIALIZED);
    init_or_die(shm_dir, service, 0);
    /* Names of the wrong family, or no name: NULL, and each counted in
     * pfs_lost_total{kind="instrument_classes"}. */
    CHECK(pfs_wait_class_register("stage/cedge/not_a_wait") == NULL);
    CHECK(pfs_stage_class_register("wait/synch/mutex/cedge/not_a_stage") == NULL);
    CHECK(pfs_statement_class_register("statement/") == NULL);
    CHECK(pfs_memory_class_register("mem/cedge/buf") == NULL);
    /* A forked child names nothing: the segment is its parent's. */
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0)
        _exit(pfs_set_thread_name("child") == PFS_ERR_FORKED && pfs_init() == PFS_ERR_FORKED ? 0
                                                                                             : 1);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(pthread_barrier_init(&named, NULL, 5) == 0);
    pthread_t tids[4];
    for (long t = 0; t < 4; t++)
        CHECK(pthread_create(&tids[t], NULL, named_thread, (void *)t) == 0);
    pthread_barrier_wait(&named);
    char extra[256];
    snprintf(extra, sizeof extra,
             ",\"os\":%llu,\"api\":%llu,\"renamed\":%llu,\"long\":%llu",
             (unsigned long long)named_ids[0], (unsigned long long)named_ids[1],
             (unsigned long long)named_ids[2], (unsigned long long)named_ids[3]);
    print_segment_line(extra);
    wait_for_eof();
    set_step(1);
    for (long t = 0; t < 4; t++) CHECK(pthread_join(tids[t], NULL) == 0);
    return 0;
}

/* ---- config --------------------------------------------------------- */

/* pfs_init_with(cfg) fails with `code` and a message containing `what`. */
static void rejected(const pfs_config_t *cfg, int code, const char *what) {
    int rc = pfs_init_with(cfg);
    char msg[512];
    pfs_init_error(msg, sizeof msg);
    if (rc != code || strstr(msg, what) == NULL) {
        fprintf(stderr, "pfs_c_edges: expected %d (%s) mentioning \"%s\", got %d: %s\n", code,
                pfs_strerror(code), what, rc, msg);
        exit(1);
    }
    CHECK(!pfs_is_initialized());
}

static int config(const char *shm_dir) {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.shm_dir = shm_dir;
    cfg.consumer_rules = "events_waits_histroy=ON"; /* PFS_CONSUMERS rejects it */
    rejected(&cfg, PFS_ERR_INVALID_ARGUMENT, "pfs_config_t.consumer_rules");
    cfg.consumer_rules = NULL;
    cfg.flags = PFS_CONFIG_NO_RECLAIM | 0x100;
    rejected(&cfg, PFS_ERR_INVALID_ARGUMENT, "pfs_config_t.flags has unknown bits 0x100");
    cfg.flags = 0;
    cfg.max_threads = UINT32_MAX;
    rejected(&cfg, PFS_ERR_INVALID_ARGUMENT,
             "pfs_config_t.max_threads is 4294967295; expected 1 to 1048576");
    cfg.max_threads = 0;
    cfg.history_len = 5000;
    rejected(&cfg, PFS_ERR_INVALID_ARGUMENT, "pfs_config_t.history_len is 5000");
    cfg.history_len = 0;

    CHECK(strcmp(pfs_strerror(PFS_OK), "success") == 0);
    CHECK(strcmp(pfs_strerror(PFS_ERR_INVALID_ARGUMENT), "invalid argument") == 0);
    CHECK(strcmp(pfs_strerror(12345), "unknown pfs error code") == 0);
    for (int c = PFS_ERR_NO_THREAD_RECORD; c < PFS_OK; c++)
        CHECK(strcmp(pfs_strerror(c), "unknown pfs error code") != 0);
    /* Negative codes are parenthesised (CERT PRE02-C), as any
     * expression-like macro should be. */
    CHECK(strcmp(EXPANDED(PFS_ERR_IO), "(-6)") == 0);
    CHECK(strcmp(EXPANDED(PFS_ERR_NO_THREAD_RECORD), "(-12)") == 0);

    /* A 399-byte service name is cut to PFS_SERVICE_NAME_MAX bytes. */
    char service[400];
    memset(service, 's', 399);
    service[399] = '\0';
    cfg.service_name = service;
    int rc = pfs_init_with(&cfg);
    if (rc != PFS_OK) {
        char msg[512];
        pfs_init_error(msg, sizeof msg);
        fprintf(stderr, "pfs_init_with (long name): %s: %s\n", pfs_strerror(rc), msg);
        return 1;
    }
    char path[1024];
    CHECK(pfs_segment_path(path, sizeof path) < sizeof path);
    printf("{\"segment\":\"%s\",\"pid\":%ld}\n", path, (long)getpid());
    return 0;
}

/* ---- abi ------------------------------------------------------------ */

static int abi(const char *shm_dir) {
    CHECK(pfs_abi_version() == PFS_ABI_VERSION);
    CHECK(PFS_CHECK_ABI() == PFS_OK);
    /* A header whose pfs_wait_t is one word smaller is refused, and so is
     * every initialisation after that. */
    CHECK(pfs_check_abi(PFS_ABI_VERSION, sizeof(pfs_config_t), sizeof(pfs_wait_t) - 8,
                        sizeof(pfs_statement_t), sizeof(pfs_memory_t)) == PFS_ERR_ABI_MISMATCH);
    char msg[512];
    pfs_init_error(msg, sizeof msg);
    CHECK(strstr(msg, "sizeof(pfs_wait_t)") != NULL);
    CHECK(pfs_check_abi(PFS_ABI_VERSION + 1, sizeof(pfs_config_t), sizeof(pfs_wait_t),
                        sizeof(pfs_statement_t), sizeof(pfs_memory_t)) == PFS_ERR_ABI_MISMATCH);
    pfs_init_error(msg, sizeof msg);
    CHECK(strstr(msg, "PFS_ABI_VERSION 1 (this libpfs: 0)") != NULL);
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.shm_dir = shm_dir;
    CHECK(pfs_init_with(&cfg) == PFS_ERR_ABI_MISMATCH);
    CHECK(pfs_init() == PFS_ERR_ABI_MISMATCH);
    CHECK(!pfs_is_initialized());
    /* A matching check after a failed one still fails: the library stays
     * off, and a second component must not be told otherwise. */
    CHECK(PFS_CHECK_ABI() == PFS_ERR_ABI_MISMATCH);
    /* The segment path of an uninitialised library is "", written. */
    char path[8] = "ZZZZZZZ";
    CHECK(pfs_segment_path(path, sizeof path) == 0 && path[0] == '\0');
    printf("{\"abi\":%u}\n", pfs_abi_version());
    return 0;
}

/* An ABI check that fails after initialisation (a program that checks
 * late): the library must stop touching the program's structs, which are
 * not its size, and record nothing more. Every byte of a wait, statement
 * and memory struct begun and ended afterwards stays as the program left
 * it; the test reads the segment for what was recorded. */
static int abi_late(const char *shm_dir) {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.shm_dir = shm_dir;
    cfg.service_name = "c-abi-late";
    CHECK(pfs_init_with(&cfg) == PFS_OK);
    const pfs_wait_class_t *cls = pfs_wait_class_register("wait/synch/mutex/c/late");
    const pfs_statement_class_t *st = pfs_statement_class_register("statement/c/late");
    const pfs_stage_class_t *sg = pfs_stage_class_register("stage/c/late");
    const pfs_memory_class_t *mc = pfs_memory_class_register("memory/c/late");
    pfs_wait_t w;
    pfs_wait_begin(&w, cls, PFS_OP_LOCK, 1);
    pfs_wait_end(&w);
    CHECK(pfs_check_abi(PFS_ABI_VERSION, sizeof(pfs_config_t), sizeof(pfs_wait_t) - 8,
                        sizeof(pfs_statement_t), sizeof(pfs_memory_t)) == PFS_ERR_ABI_MISMATCH);
    pfs_wait_t late;
    memset(&late, 0xAB, sizeof late);
    pfs_wait_begin(&late, cls, PFS_OP_LOCK, 2);
    pfs_wait_end(&late);
    pfs_statement_t s;
    memset(&s, 0xAB, sizeof s);
    pfs_statement_begin(&s, st);
    pfs_stage_enter(sg);
    pfs_stage_end();
    pfs_statement_end(&s);
    pfs_memory_t m;
    memset(&m, 0xAB, sizeof m);
    int counted = pfs_memory_alloc(&m, mc, 4096);
    pfs_memory_free(&m);
    int untouched = 1;
    for (size_t i = 0; i < sizeof late; i++) untouched &= ((unsigned char *)&late)[i] == 0xAB;
    for (size_t i = 0; i < sizeof s; i++) untouched &= ((unsigned char *)&s)[i] == 0xAB;
    for (size_t i = 0; i < sizeof m; i++) untouched &= ((unsigned char *)&m)[i] == 0xAB;
    char extra[128];
    snprintf(extra, sizeof extra, ",\"untouched\":%d,\"counted\":%d,\"initialized\":%d", untouched,
             counted, pfs_is_initialized());
    print_segment_line(extra);
    wait_for_eof();
    return 0;
}

/* ---- key_dtor --------------------------------------------------------- */

/* A server's per-thread session kept in thread-specific data and ended by
 * the key's destructor, which glibc runs after the library's own
 * thread-exit hook has folded the thread's record: the ends must touch
 * nothing of the thread's (freed) context. The memory's free is counted
 * (on the process's row); the wait and the statement are not. */
struct session {
    pfs_statement_t st;
    pfs_wait_t w;
    pfs_memory_t m;
};
static pthread_key_t session_key;
static const pfs_statement_class_t *session_st;
static const pfs_wait_class_t *session_w;
static const pfs_memory_class_t *session_m;

static void session_end(void *p) {
    struct session *s = p;
    pfs_wait_end(&s->w);
    pfs_statement_set_rows_sent(&s->st, 1);
    pfs_statement_set_text(&s->st, "ended by a key destructor");
    pfs_statement_end(&s->st);
    pfs_memory_free(&s->m);
    free(s);
}

static void *session_thread(void *arg) {
    (void)arg;
    struct session *s = malloc(sizeof *s);
    CHECK(s != NULL);
    CHECK(pthread_setspecific(session_key, s) == 0);
    pfs_statement_begin(&s->st, session_st);
    pfs_wait_begin(&s->w, session_w, PFS_OP_LOCK, 0);
    CHECK(pfs_memory_alloc(&s->m, session_m, 100));
    return NULL;
}

static int key_dtor(const char *shm_dir, const char *service, long threads) {
    init_or_die(shm_dir, service, 64);
    session_st = pfs_statement_class_register("statement/cedge/session");
    session_w = pfs_wait_class_register("wait/synch/mutex/cedge/session");
    session_m = pfs_memory_class_register("memory/cedge/session");
    CHECK(session_st && session_w && session_m);
    CHECK(pthread_key_create(&session_key, session_end) == 0);
    for (long i = 0; i < threads; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, session_thread, NULL) == 0);
        CHECK(pthread_join(t, NULL) == 0);
    }
    print_segment_line("");
    wait_for_eof();
    return 0;
}

/* ---- env ------------------------------------------------------------ */

/* pfs_init() from the PFS_* environment: prints its code, its message
 * and the segment path (empty when it failed). */
static int env(void) {
    int rc = pfs_init();
    char msg[512] = "";
    char path[512] = "";
    if (rc != PFS_OK) pfs_init_error(msg, sizeof msg);
    else CHECK(pfs_segment_path(path, sizeof path) > 0);
    for (char *c = msg; *c; c++)
        if (*c == '"' || *c == '\\') *c = '\'';
    printf("{\"rc\":%d,\"error\":\"%s\",\"segment\":\"%s\"}\n", rc, msg, path);
    return 0;
}

/* ---- tasks ---------------------------------------------------------- */

/* Two tasks resumed in turn by two threads, four resumes each, every
 * resume entered (pfs_task_enter/exit) and recording a stage and a wait;
 * each task's statement begun at its first resume and ended at its last,
 * on the other thread. A third task is freed with its statement open
 * (cancelled). Each thread has a statement of its own open meanwhile,
 * which none of the tasks' events may nest in. */
static const pfs_statement_class_t *T_REQUEST, *T_OWN;
static const pfs_stage_class_t *T_STAGE;
static const pfs_wait_class_t *T_WAIT;
static pfs_task_t *task_of[4];
static pthread_barrier_t turns;

static void task_resume(pfs_task_t *t, int resume, int k) {
    CHECK(pfs_task_enter(t) == PFS_OK);
    if (resume == 0) {
        PFS_TASK_STATEMENT_BEGIN(t, T_REQUEST);
        /* One statement per task at a time. */
        CHECK(pfs_task_statement_begin(t, T_REQUEST) == PFS_ERR_INVALID_ARGUMENT);
        pfs_task_statement_set_text(t, k == 0 ? "task zero" : "task one");
    }
    PFS_STAGE_ENTER(T_STAGE);
    pfs_wait_t w;
    PFS_WAIT_BEGIN(&w, T_WAIT, PFS_OP_LOCK, (uint64_t)k);
    usleep(500);
    pfs_wait_end(&w);
    if (resume == 3) {
        pfs_task_statement_set_rows_sent(t, 10 + (uint64_t)k);
        pfs_task_statement_add_errors(t, (uint64_t)k);
        CHECK(pfs_task_statement_end(t) == PFS_OK);
    }
    CHECK(pfs_task_exit(t) == PFS_OK);
}

static void *task_resumer(void *arg) {
    long me = (long)arg;
    pfs_statement_t own;
    PFS_STATEMENT_BEGIN(&own, T_OWN);
    for (int resume = 0; resume < 4; resume++) {
        pthread_barrier_wait(&turns);
        if (resume % 2 == me)
            for (int k = 0; k < 2; k++) task_resume(task_of[k], resume, k);
    }
    pthread_barrier_wait(&turns);
    pfs_statement_end(&own);
    return NULL;
}

/* Tries a task another thread has entered: refused, nothing done. */
static void *task_intruder(void *arg) {
    pfs_task_t *t = arg;
    CHECK(pfs_task_enter(t) == PFS_ERR_TASK_NOT_HERE);
    CHECK(pfs_task_exit(t) == PFS_ERR_TASK_NOT_HERE);
    CHECK(pfs_task_statement_end(t) == PFS_ERR_TASK_NOT_HERE);
    return NULL;
}

static int tasks(const char *shm_dir, const char *service) {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.service_name = service;
    cfg.shm_dir = shm_dir;
    cfg.flags = PFS_CONFIG_NO_RECLAIM;
    cfg.consumer_rules = "events_%_history_long=ON";
    CHECK(pfs_init_with(&cfg) == PFS_OK);
    T_REQUEST = pfs_statement_class_register("statement/cedge/task_request");
    T_OWN = pfs_statement_class_register("statement/cedge/thread_own");
    T_STAGE = pfs_stage_class_register("stage/cedge/task_step");
    T_WAIT = pfs_wait_class_register("wait/synch/mutex/cedge/task_lock");
    for (int k = 0; k < 4; k++) CHECK((task_of[k] = pfs_task_new()) != NULL);
    CHECK(pfs_task_enter(NULL) == PFS_ERR_INVALID_ARGUMENT);
    CHECK(pthread_barrier_init(&turns, NULL, 2) == 0);
    pthread_t tids[2];
    for (long t = 0; t < 2; t++)
        CHECK(pthread_create(&tids[t], NULL, task_resumer, (void *)t) == 0);
    for (long t = 0; t < 2; t++) CHECK(pthread_join(tids[t], NULL) == 0);
    /* The third task: a statement needs the task entered here; begun,
     * a stage entered, then freed with both open (cancelled). */
    CHECK(pfs_task_statement_begin(task_of[2], T_REQUEST) == PFS_ERR_TASK_NOT_HERE);
    CHECK(pfs_task_enter(task_of[2]) == PFS_OK);
    PFS_TASK_STATEMENT_BEGIN(task_of[2], T_REQUEST);
    pfs_task_statement_set_text(task_of[2], "task two");
    PFS_STAGE_ENTER(T_STAGE);
    /* Another thread cannot enter, exit or end it meanwhile. */
    pthread_t intruder;
    CHECK(pthread_create(&intruder, NULL, task_intruder, task_of[2]) == 0);
    CHECK(pthread_join(intruder, NULL) == 0);
    CHECK(pfs_task_exit(task_of[2]) == PFS_OK);
    /* The fourth: its statement ended after its last resume, outside it
     * (a completion callback): inside the task all the same. */
    CHECK(pfs_task_enter(task_of[3]) == PFS_OK);
    PFS_TASK_STATEMENT_BEGIN(task_of[3], T_REQUEST);
    pfs_task_statement_set_text(task_of[3], "task three");
    /* NULL texts are no-ops: the text stays, no digest of "". */
    pfs_task_statement_set_text(task_of[3], NULL);
    pfs_task_statement_set_digest_text(task_of[3], NULL);
    PFS_STAGE_ENTER(T_STAGE);
    CHECK(pfs_task_exit(task_of[3]) == PFS_OK);
    CHECK(pfs_task_statement_end(task_of[3]) == PFS_OK);
    CHECK(pfs_task_thread_id(NULL) == 0);
    for (int k = 0; k < 4; k++) {
        CHECK(pfs_task_thread_id(task_of[k]) != 0);
        CHECK(pfs_task_thread_id(task_of[k]) != pfs_thread_id());
    }
    /* Tasks entered out of order on one thread: a, then b. a cannot
     * leave (nor be freed) before b; each keeps its own THREAD_ID; the
     * thread gets its own back once both left in order. */
    pfs_task_t *a = pfs_task_new(), *b = pfs_task_new();
    CHECK(a != NULL && b != NULL);
    uint64_t me = pfs_thread_id();
    CHECK(pfs_task_enter(a) == PFS_OK);
    uint64_t a_id = pfs_task_thread_id(a);
    CHECK(a_id != 0 && a_id != me && pfs_thread_id() == a_id);
    CHECK(pfs_task_enter(b) == PFS_OK);
    uint64_t b_id = pfs_task_thread_id(b);
    CHECK(b_id != 0 && b_id != a_id && pfs_thread_id() == b_id);
    CHECK(pfs_task_thread_id(a) == a_id);
    CHECK(pfs_task_exit(a) == PFS_ERR_TASK_NOT_INNERMOST);
    CHECK(pfs_thread_id() == b_id);
    pfs_task_free(a); /* not freed: entered under b */
    CHECK(pfs_task_thread_id(a) == a_id && pfs_thread_id() == b_id);
    CHECK(pfs_task_exit(b) == PFS_OK);
    CHECK(pfs_thread_id() == a_id);
    CHECK(pfs_task_exit(a) == PFS_OK);
    CHECK(pfs_thread_id() == me);
    pfs_task_free(b);
    pfs_task_free(a);
    CHECK(pfs_thread_id() == me);
    CHECK(strstr(pfs_strerror(PFS_ERR_TASK_NOT_INNERMOST), "exit") != NULL);
    char extra[160];
    snprintf(extra, sizeof extra, ",\"main\":%llu,\"task_zero\":%llu,\"task_one\":%llu",
             (unsigned long long)pfs_thread_id(),
             (unsigned long long)pfs_task_thread_id(task_of[0]),
             (unsigned long long)pfs_task_thread_id(task_of[1]));
    for (int k = 0; k < 4; k++) pfs_task_free(task_of[k]);
    print_segment_line(extra);
    wait_for_eof();
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "owner") == 0 && argc == 4) return owner(argv[2], argv[3]);
    if (strcmp(mode, "lost") == 0 && argc == 6)
        return lost(argv[2], argv[3], strtol(argv[4], NULL, 10), strtol(argv[5], NULL, 10));
    if (strcmp(mode, "names") == 0 && argc == 4) return names(argv[2], argv[3]);
    if (strcmp(mode, "config") == 0 && argc == 3) return config(argv[2]);
    if (strcmp(mode, "abi") == 0 && argc == 3) return abi(argv[2]);
    if (strcmp(mode, "abi_late") == 0 && argc == 3) return abi_late(argv[2]);
    if (strcmp(mode, "key_dtor") == 0 && argc == 5)
        return key_dtor(argv[2], argv[3], strtol(argv[4], NULL, 10));
    if (strcmp(mode, "env") == 0 && argc == 2) return env();
    if (strcmp(mode, "tasks") == 0 && argc == 4) return tasks(argv[2], argv[3]);
    if (strcmp(mode, "abandoned") == 0 && argc == 4) return abandoned(argv[2], argv[3]);
    if (strcmp(mode, "warnings") == 0 && argc == 3) return warnings(argv[2]);
    fprintf(stderr,
            "usage: %s owner|lost|names|config|abi|abi_late|key_dtor|tasks|abandoned SHM_DIR [SERVICE ...] | env\n",
            argv[0]);
    return 2;
}
