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
    let header = String::from_utf8(out).expect("the header is UTF-8");
    parenthesise_negative_macros(&header)
}

/// `#define NAME -6` as `#define NAME (-6)`: an unparenthesised negative
/// macro misparses in `x-NAME` (`x--6`). cbindgen has no setting for it.
fn parenthesise_negative_macros(header: &str) -> String {
    let mut out = String::with_capacity(header.len() + 64);
    for line in header.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let fixed = body.strip_prefix("#define ").and_then(|rest| {
            let (name, value) = rest.split_once(' ')?;
            let digits = value.strip_prefix('-')?;
            digits
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| format!("#define {name} ({value})"))
        });
        match fixed {
            Some(f) => {
                out.push_str(&f);
                out.push_str(&line[body.len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
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
        "int32_t pfs_set_thread_name(const char *name)",
        "const char *pfs_strerror(int32_t code)",
        "uint32_t pfs_abi_version(void)",
        "int32_t pfs_check_abi(uint32_t abi_version,",
        "#define PFS_ABI_VERSION 0",
        "#define PFS_CONFIG_INIT {",
        "#define PFS_CHECK_ABI()",
        "#define PFS_SERVICE_NAME_MAX 64",
        "} pfs_wait_t;",
        "uint64_t _opaque[PFS_WAIT_WORDS];",
        "#define PFS_OP_WRITE 13",
        "#define PFS_ERR_INVALID_ARGUMENT (-1)",
        "#define PFS_ERR_NO_THREAD_RECORD (-12)",
    ] {
        assert!(h.contains(f), "pfs.h lacks `{f}`:\n{h}");
    }
    for line in h.lines().filter(|l| l.starts_with("#define ")) {
        assert!(
            !line.contains(" -"),
            "unparenthesised negative macro: {line}"
        );
    }
}
