// pfs_cxx_config: pfs.h from C++, compiled by tests/tests/c_abi.rs with
// g++ -Wall -Wextra -Werror (so -Wmissing-field-initializers, which
// `pfs_config_t cfg = {0};` trips in C++): PFS_CONFIG_INIT initialises
// every field, and PFS_CHECK_ABI() passes. Prints {"ok":true}.
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
    std::printf("{\"ok\":true}\n");
    return 0;
}
