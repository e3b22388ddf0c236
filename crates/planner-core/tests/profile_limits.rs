//! Hostile profile data is refused before it costs memory or time: deflate bombs, `.npy` headers
//! claiming huge shapes, archives with many entries, JSON with too many points; every real
//! profile fits comfortably under the caps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::{
    io::{Cursor, Write},
    path::Path,
};

use ndarray::Array1;
use ndarray_npy::{NpzWriter, WriteNpyExt};
use planner_core::profile::{
    ConfigMapEntries, DECODE_JSON, DECODE_NPZ_KEY, DecodeProfile, PREFILL_JSON, PREFILL_NPZ_KEY,
    PrefillProfile, Profile,
};
use zip::{CompressionMethod, ZipWriter, write::SimpleFileOptions};

/// An NPZ of raw entries (name, bytes), deflated.
fn raw_npz(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    for (name, bytes) in entries {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// `.npy` bytes of a float vector.
fn npy(values: &[f64]) -> Vec<u8> {
    let mut bytes = Vec::new();
    Array1::from(values.to_vec()).write_npy(&mut bytes).unwrap();
    bytes
}

/// A `.npy` header claiming `shape`, followed by `data_bytes` bytes of data.
fn lying_npy(shape: &str, data_bytes: usize) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0_u8, data_bytes));
    bytes
}

fn prefill_npz_with_isl(isl: Vec<u8>) -> Vec<u8> {
    raw_npz(&[
        ("prefill_isl.npy", isl),
        ("prefill_ttft.npy", npy(&[1.0, 2.0, 3.0, 4.0])),
        ("prefill_thpt_per_gpu.npy", npy(&[1.0, 2.0, 3.0, 4.0])),
    ])
}

#[test]
fn a_deflate_bomb_is_cut_off_at_the_entry_cap() {
    // 16 MiB of zeros deflate to about 16 KiB.
    let mut npz = NpzWriter::new_compressed(Cursor::new(Vec::new()));
    npz.add_array("prefill_isl", &Array1::<f64>::zeros(2 * 1024 * 1024))
        .unwrap();
    let bytes = npz.finish().unwrap().into_inner();
    assert!(bytes.len() < 100 * 1024, "{} bytes", bytes.len());
    let entries = ConfigMapEntries {
        binary_data: [(PREFILL_NPZ_KEY, bytes.as_slice())].into(),
        ..ConfigMapEntries::default()
    };
    let error = Profile::from_config_map_entries("ConfigMap bomb", &entries)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("ConfigMap bomb/prefill_raw_data.npz")
            && error.contains("prefill_isl")
            && error.contains("exceeds the limit of 1048576 bytes per entry"),
        "{error}"
    );
}

#[test]
fn entries_are_capped_in_total_too() {
    // Five entries just under the per-entry cap each: more than the total cap together.
    let big = lying_npy("(130000,)", 130_000 * 8);
    let bytes = raw_npz(&[
        ("max_kv_tokens.npy", big.clone()),
        ("x_kv_usage.npy", big.clone()),
        ("y_context_length.npy", big.clone()),
        ("z_itl.npy", big.clone()),
        ("z_thpt_per_gpu.npy", big),
    ]);
    let error = DecodeProfile::from_npz(&bytes, "d.npz").unwrap_err().to_string();
    assert!(
        error.starts_with("d.npz: ") && error.contains("exceeds the limit of"),
        "{error}"
    );
}

#[test]
fn a_header_claiming_a_huge_shape_is_refused_before_allocating() {
    // 50 million floats would be a 400 MB allocation from a few bytes.
    let bytes = prefill_npz_with_isl(lying_npy("(50000000,)", 8));
    let error = PrefillProfile::from_npz(&bytes, "p.npz").unwrap_err().to_string();
    assert!(
        error.contains("p.npz")
            && error.contains("`prefill_isl` of shape [50000000]")
            && error.contains("exceeds the limit of 100000 numbers per array"),
        "{error}"
    );
    // A shape whose product overflows.
    let bytes = prefill_npz_with_isl(lying_npy("(4294967296, 4294967296, 4294967296)", 8));
    let error = PrefillProfile::from_npz(&bytes, "p.npz").unwrap_err().to_string();
    assert!(error.contains("exceeds the limit of 100000 numbers"), "{error}");
}

#[test]
fn nested_or_broken_headers_are_refused_without_parsing_them() {
    for header in [
        "((((((((((((((((((((((((((((((((((((((((((((((((1,)))))))))))))))))))))))))))))))))))))))))))))))",
        "[1, 2]",
        "(1, 'x')",
    ] {
        let bytes = prefill_npz_with_isl(lying_npy(header, 8));
        let error = PrefillProfile::from_npz(&bytes, "p.npz").unwrap_err().to_string();
        assert!(
            error.contains("`prefill_isl`") && error.contains("not a .npy array"),
            "{header}: {error}"
        );
    }
}

#[test]
fn an_archive_with_many_entries_is_refused() {
    let entries: Vec<(String, Vec<u8>)> = (0..100).map(|i| (format!("e{i}.npy"), npy(&[1.0]))).collect();
    let entries: Vec<(&str, Vec<u8>)> = entries.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let error = PrefillProfile::from_npz(&raw_npz(&entries), "p.npz")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("p.npz") && error.contains("(100)") && error.contains("limit of 64 entries"),
        "{error}"
    );
}

#[test]
fn too_many_points_in_an_npz_are_refused() {
    let isl: Vec<f64> = (0..1001).map(f64::from).collect();
    let error = PrefillProfile::from_npz(&prefill_npz_with_isl(npy(&isl)), "p.npz")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`prefill_isl` with 1001 points exceeds the limit of 1000 points"),
        "{error}"
    );
}

#[test]
fn json_profiles_are_capped_in_points_and_size() {
    let numbers = |n: usize| {
        let items: Vec<String> = (0..n).map(|i| format!("{}", i + 1)).collect();
        format!("[{}]", items.join(","))
    };
    let decode = format!(
        r#"{{"x_kv_usage": {0}, "y_context_length": {0}, "z_itl": {0}, "z_thpt_per_gpu": {0}, "max_kv_tokens": 1000}}"#,
        numbers(10_001)
    );
    let prefill = format!(
        r#"{{"prefill_isl": {0}, "prefill_ttft": {0}, "prefill_thpt_per_gpu": {0}}}"#,
        numbers(20)
    );
    let entries = ConfigMapEntries {
        data: [(PREFILL_JSON, prefill.as_str()), (DECODE_JSON, decode.as_str())].into(),
        ..ConfigMapEntries::default()
    };
    let error = Profile::from_config_map_entries("ConfigMap big", &entries)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("ConfigMap big/decode_raw_data.json")
            && error.contains("`x_kv_usage` with 10001 points exceeds the limit of 10000 points"),
        "{error}"
    );
    let prefill = format!(
        r#"{{"prefill_isl": {0}, "prefill_ttft": {0}, "prefill_thpt_per_gpu": {0}}}"#,
        numbers(1001)
    );
    let error = PrefillProfile::from_json(prefill.as_bytes(), "p.json")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`prefill_isl` with 1001 points exceeds the limit of 1000 points"),
        "{error}"
    );
    let huge = format!(r#"{{"pad": "{}"}}"#, "x".repeat(5 * 1024 * 1024));
    let error = PrefillProfile::from_json(huge.as_bytes(), "p.json")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("p.json") && error.contains("exceeds the limit of 4194304 bytes"),
        "{error}"
    );
}

#[test]
fn every_real_profile_is_far_below_the_caps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/profiles");
    let mut loaded = 0;
    for profile in std::fs::read_dir(&root).unwrap() {
        let dir = profile.unwrap().path();
        let read = |relative: &str| std::fs::read(dir.join(relative)).unwrap();
        let prefill =
            PrefillProfile::from_npz(&read("selected_prefill_interpolation/raw_data.npz"), "prefill")
                .unwrap();
        let decode =
            DecodeProfile::from_npz(&read("selected_decode_interpolation/raw_data.npz"), "decode").unwrap();
        assert!(prefill.isl.len() * 10 <= 1_000 && decode.kv_usage.len() * 10 <= 10_000);
        loaded += 1;
    }
    assert_eq!(loaded, 4);
    // A multi-row pre-swept sweep is still read far enough to say what to do.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/profiles/pre_swept_h100_prefill.npz");
    let error = PrefillProfile::from_npz(&std::fs::read(fixture).unwrap(), "pre.npz")
        .unwrap_err()
        .to_string();
    assert!(error.contains("shape [3, 9]"), "{error}");
}

#[test]
fn the_decode_npz_key_is_read_from_binary_data() {
    let bytes = raw_npz(&[
        ("max_kv_tokens.npy", npy(&[1000.0])),
        ("x_kv_usage.npy", npy(&[0.1, 0.5, 0.9])),
        ("y_context_length.npy", npy(&[100.0, 500.0, 200.0])),
        ("z_itl.npy", npy(&[5.0, 6.0, 7.0])),
        ("z_thpt_per_gpu.npy", npy(&[1.0, 2.0, 3.0])),
    ]);
    let prefill =
        r#"{"prefill_isl": [1,2,3,4], "prefill_ttft": [1,2,3,4], "prefill_thpt_per_gpu": [1,2,3,4]}"#;
    let entries = ConfigMapEntries {
        data: [(PREFILL_JSON, prefill)].into(),
        binary_data: [(DECODE_NPZ_KEY, bytes.as_slice())].into(),
    };
    let profile = Profile::from_config_map_entries("ConfigMap ok", &entries).unwrap();
    assert_eq!(profile.decode.kv_usage, [0.1, 0.5, 0.9]);
}
