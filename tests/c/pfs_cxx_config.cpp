// pfs_cxx_config: pfs.h from C++, compiled by tests/tests/c_abi.rs with
// g++ -Wall -Wextra -Werror (so -Wmissing-field-initializers, which
// `pfs_config_t cfg = {0};` trips in C++): PFS_CONFIG_INIT initialises
// every field, PFS_CHECK_ABI() passes, and the SOURCE macros
// (PFS_WAIT_BEGIN, PFS_STAGE_ENTER, PFS_STATEMENT_BEGIN,
// PFS_TASK_STATEMENT_BEGIN) compile. Prints
// {"ok":true}.
#include <cstdio>
#include <cstdlib>

#include "pfs.h"

int main() {
    pfs_config_t cfg = PFS_CONFIG_INIT;
    cfg.service_name = "cxx";
    if (cfg.shm_dir != nullptr || cfg.max_threads != 0 || cfg.flags != 0 ||
        cfg.consumer_rules != nullptr) {
        std::fprintf(stderr, "PFS_CONFIG_INIT left a field set\n");
        return 1;
    }
    int rc = PFS_CHECK_ABI();
    if (rc != PFS_OK) {
        std::fprintf(stderr, "PFS_CHECK_ABI: %s\n", pfs_strerror(rc));
        return 1;
    }
    // Without pfs_init: no-ops, compiled as a C++ program would use them.
    const pfs_wait_class_t *m = pfs_wait_class_register("wait/synch/mutex/cxx/m");
    pfs_wait_t w;
    PFS_WAIT_BEGIN(&w, m, PFS_OP_LOCK, 0);
    pfs_wait_end(&w);
    pfs_statement_t st;
    PFS_STATEMENT_BEGIN(&st, pfs_statement_class_register("statement/cxx/q"));
    PFS_STAGE_ENTER(pfs_stage_class_register("stage/cxx/s"));
    pfs_statement_end(&st);
    pfs_task_t *task = pfs_task_new();
    if (task == nullptr || pfs_task_enter(task) != PFS_OK) {
        std::fprintf(stderr, "pfs_task_new/enter failed\n");
        return 1;
    }
    PFS_TASK_STATEMENT_BEGIN(task, pfs_statement_class_register("statement/cxx/t"));
    pfs_task_statement_end(task);
    pfs_task_exit(task);
    pfs_task_free(task);
    std::printf("{\"ok\":true}\n");
    return 0;
}
