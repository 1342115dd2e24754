//! The size the docs give for a segment with the default sizes (what `ls`
//! shows, which `--max-segment-size` bounds) is the size of the file a
//! default `init` creates, in whole MiB.

#[test]
fn the_documented_default_segment_size_is_the_file_s() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("readme").shm_dir(dir.path()))
        .expect("init with the default sizes");
    let path = pfs_client::segment_path().unwrap();
    let bytes = std::fs::metadata(path).unwrap().len();
    let said = format!("about {} MiB", (bytes as f64 / (1 << 20) as f64).round());
    for doc in ["README.md", "docs/SECURITY-segments.md"] {
        let text = std::fs::read_to_string(format!("{}/../{doc}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| panic!("read {doc}: {e}"));
        assert!(
            text.contains(&said),
            "{doc} should give a default segment as {said:?} ({bytes} bytes)"
        );
    }
}
