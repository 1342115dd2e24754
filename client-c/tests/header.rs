//! `include/pfs.h` is what cbindgen generates from the crate now: the
//! committed header cannot drift from the Rust declarations and their
//! documentation. `PFS_BLESS=1 cargo test -p pfs-client-c --test header`
//! rewrites it.

use std::path::Path;

/// Generates the header from the crate's sources and `cbindgen.toml`.
fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn the_committed_header_is_fresh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/pfs.h");
    let fresh = generate();
    if std::env::var_os("PFS_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/pfs.h");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/pfs.h is stale: regenerate it with \
         `PFS_BLESS=1 cargo test -p pfs-client-c --test header`"
    );
}

/// The header declares the whole API (a declaration lost to a cbindgen
/// setting would leave C callers with implicit declarations).
#[test]
fn the_header_declares_every_entry_point() {
    let h = generate();
    for f in [
        "int32_t pfs_init(void)",
        "int32_t pfs_init_with(const pfs_config_t *config)",
        "size_t pfs_init_error(char *buf, size_t len)",
        "bool pfs_is_initialized(void)",
        "size_t pfs_segment_path(char *buf, size_t len)",
        "const pfs_wait_class_t *pfs_wait_class_register(const char *name)",
        "bool pfs_wait_class_enabled(const pfs_wait_class_t *cls)",
        "void pfs_wait_begin(pfs_wait_t *w,",
        "void pfs_wait_end(pfs_wait_t *w)",
        "void pfs_wait_end_bytes(pfs_wait_t *w, uint64_t bytes)",
        "const pfs_stage_class_t *pfs_stage_class_register(const char *name)",
        "void pfs_stage_enter(const pfs_stage_class_t *cls)",
        "void pfs_stage_progress(uint64_t completed, uint64_t estimated)",
        "void pfs_stage_end(void)",
        "pfs_statement_class_register(const char *name)",
        "void pfs_statement_begin(pfs_statement_t *st, const pfs_statement_class_t *cls)",
        "void pfs_statement_set_text(pfs_statement_t *st, const char *text)",
        "void pfs_statement_set_digest_text(pfs_statement_t *st, const char *digest_text)",
        "void pfs_statement_set_rows_sent(pfs_statement_t *st, uint64_t n)",
        "void pfs_statement_add_errors(pfs_statement_t *st, uint64_t n)",
        "void pfs_statement_end(pfs_statement_t *st)",
        "const pfs_memory_class_t *pfs_memory_class_register(const char *name)",
        "bool pfs_memory_alloc(pfs_memory_t *token, const pfs_memory_class_t *cls, uint64_t size)",
        "void pfs_memory_free(pfs_memory_t *token)",
        "int32_t pfs_set_thread_actor(const char *user, const char *host, const char *role)",
        "uint64_t pfs_thread_id(void)",
        "uint64_t pfs_statement_event_id(void)",
        "} pfs_wait_t;",
        "uint64_t _opaque[PFS_WAIT_WORDS];",
        "#define PFS_OP_WRITE 13",
        "#define PFS_ERR_INVALID_ARGUMENT -1",
    ] {
        assert!(h.contains(f), "pfs.h lacks `{f}`:\n{h}");
    }
}
