//! Gives `libpfs.so` its SONAME, `libpfs.so.<PFS_ABI_VERSION>`: a program
//! linked against it records that name (`NEEDED`), so the dynamic loader
//! never pairs it with a library of another ABI. `PFS_SONAME` tells the
//! crate the name, whose number a unit test checks against
//! `PFS_ABI_VERSION`.

/// The ABI's version, the SONAME's number: raise it (and
/// `PFS_ABI_VERSION` in `src/abi.rs`) on every incompatible change.
const ABI_VERSION: u32 = 0;

fn main() {
    let soname = format!("libpfs.so.{ABI_VERSION}");
    println!("cargo:rustc-env=PFS_SONAME={soname}");
    // ELF targets only (macOS names a library by its install name).
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    if family == "unix"
        && !matches!(
            os.as_str(),
            "macos" | "ios" | "tvos" | "watchos" | "visionos"
        )
    {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
