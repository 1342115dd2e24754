/* An application's POSIX thread habits meet libpfs (tests/tests/c_abi.rs):
 *
 *   pfs_c_posix_threads sigwait DIR
 *     A service that calls pfs_init, then blocks SIGTERM in all its threads
 *     and waits for it in one with sigwait (the usual shutdown). A SIGTERM
 *     sent to the process must reach sigwait, not kill the process through
 *     a thread of the library. Prints "sigwait SIGNO".
 *
 *   pfs_c_posix_threads cancel DIR ROUNDS
 *     A pool that cancels its workers at once, ROUNDS times: each worker is
 *     cancelled while its first event registers it (a slow path with
 *     system calls). The process must survive. Prints "survived ROUNDS".
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pfs.h"

static const pfs_wait_class_t *work_lock;

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        pfs_wait_t w;
        pfs_wait_begin(&w, work_lock, PFS_OP_LOCK, 0);
        pfs_wait_end(&w);
        pthread_testcancel();
    }
    return NULL;
}

static int init(const char *dir, const char *service) {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.shm_dir = dir;
    cfg.service_name = service;
    int rc = pfs_init_with(&cfg);
    if (rc != PFS_OK) {
        fprintf(stderr, "pfs_init_with: %d\n", rc);
        exit(3);
    }
    work_lock = pfs_wait_class_register("wait/synch/mutex/posix/work");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "sigwait") == 0) {
        init(argv[2], "posix-sigwait");
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &term, NULL);
        kill(getpid(), SIGTERM);
        int sig = 0;
        if (sigwait(&term, &sig) != 0) {
            return 4;
        }
        printf("sigwait %d\n", sig);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "cancel") == 0) {
        init(argv[2], "posix-cancel");
        int rounds = atoi(argv[3]);
        for (int i = 0; i < rounds; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, worker, NULL) != 0) {
                return 5;
            }
            pthread_cancel(t);
            pthread_join(t, NULL);
        }
        printf("survived %d\n", rounds);
        return 0;
    }
    fprintf(stderr, "usage: %s sigwait DIR | cancel DIR ROUNDS\n", argv[0]);
    return 2;
}
