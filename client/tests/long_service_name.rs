//! A service name longer than a file name may be (300 bytes): `init`
//! succeeds, the segment's file name carries the name cut as the segment
//! keeps it (`SERVICE_NAME_BYTES`), and the segment says the same name.

use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::SERVICE_NAME_BYTES;

#[test]
fn a_long_service_name_is_cut_in_the_file_name_too() {
    let dir = tempfile::tempdir().unwrap();
    let long = "s".repeat(300);
    pfs_client::init_with(pfs_client::Config::new(long).shm_dir(dir.path()))
        .expect("init with a 300-byte service name");
    let path = pfs_client::segment_path().unwrap();
    let file = path.file_name().unwrap().to_str().unwrap();
    assert!(
        file.starts_with(&format!("{}.", "s".repeat(SERVICE_NAME_BYTES))),
        "{file}"
    );
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    assert_eq!(seg.service(), "s".repeat(SERVICE_NAME_BYTES));
}
