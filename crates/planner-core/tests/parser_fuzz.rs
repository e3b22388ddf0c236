//! Property tests over the parsers of user data (profile NPZ and JSON, Mooncake traces): any
//! input gives a value or an error, never a panic, and models built from whatever parses are
//! built without panicking either. The caps keep every case cheap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::{path::Path, sync::OnceLock};

use planner_core::{
    interpolation::PerformanceModel,
    profile::{
        ConfigMapEntries, DECODE_JSON, DECODE_NPZ_KEY, DecodeProfile, PREFILL_JSON, PREFILL_NPZ_KEY,
        PrefillProfile, Profile,
    },
    trace::{bucketize, parse_mooncake_jsonl},
};
use proptest::prelude::*;

fn published(relative: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../config/profiles/h200-llama3.1-8b-tp1")
            .join(relative),
    )
    .unwrap()
}

fn prefill_npz() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| published("selected_prefill_interpolation/raw_data.npz"))
}

fn decode_npz() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| published("selected_decode_interpolation/raw_data.npz"))
}

/// Edits of a byte string: overwrite, insert, delete, truncate.
#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<usize>(), 1_usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => any::<usize>().prop_map(Edit::Truncate),
    ];
    proptest::collection::vec(edit, 1..8)
}

fn apply(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut bytes = bytes.to_vec();
    for edit in edits {
        if bytes.is_empty() {
            break;
        }
        match edit {
            Edit::Set(i, b) => {
                let i = i % bytes.len();
                bytes[i] = *b;
            }
            Edit::Insert(i, extra) => {
                let i = i % bytes.len();
                bytes.splice(i..i, extra.iter().copied());
            }
            Edit::Delete(i, n) => {
                let i = i % bytes.len();
                let end = (i + n).min(bytes.len());
                bytes.drain(i..end);
            }
            Edit::Truncate(n) => bytes.truncate(n % bytes.len()),
        }
    }
    bytes
}

/// Whatever parses and validates also builds (or is refused) without panicking.
fn build_if_valid(text: &[(&str, &str)], binary: &[(&str, &[u8])]) {
    let entries = ConfigMapEntries {
        data: text.iter().copied().collect(),
        binary_data: binary.iter().copied().collect(),
    };
    if let Ok(profile) = Profile::from_config_map_entries("ConfigMap fuzz", &entries) {
        let _ = PerformanceModel::new(&profile);
    }
}

/// JSON values of bounded size: numbers (some not finite-looking), strings, lists, objects.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e6_f64..1e6).prop_map(serde_json::Value::from),
        "[a-z0-9 ]{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic_any_profile_reader(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = PrefillProfile::from_npz(&bytes, "p.npz");
        let _ = DecodeProfile::from_npz(&bytes, "d.npz");
        let _ = PrefillProfile::from_json(&bytes, "p.json");
        let _ = DecodeProfile::from_json(&bytes, "d.json");
    }

    #[test]
    fn mutated_npz_profiles_never_panic(prefill in edits(), decode in edits()) {
        let prefill = apply(prefill_npz(), &prefill);
        let decode = apply(decode_npz(), &decode);
        let _ = PrefillProfile::from_npz(&prefill, "p.npz");
        let _ = DecodeProfile::from_npz(&decode, "d.npz");
        build_if_valid(&[], &[(PREFILL_NPZ_KEY, &prefill), (DECODE_NPZ_KEY, &decode)]);
    }

    #[test]
    fn json_profiles_with_arbitrary_fields_never_panic(
        isl in json_value(),
        ttft in json_value(),
        kv in proptest::collection::vec(0.0_f64..1.5, 0..40),
        context in proptest::collection::vec(-10.0_f64..20_000.0, 0..40),
        itl in json_value(),
        max_kv in json_value(),
    ) {
        let prefill = serde_json::json!({
            "prefill_isl": isl, "prefill_ttft": ttft, "prefill_thpt_per_gpu": [1, 2, 3, 4],
        })
        .to_string();
        let decode = serde_json::json!({
            "x_kv_usage": kv, "y_context_length": context, "z_itl": itl,
            "z_thpt_per_gpu": kv, "max_kv_tokens": max_kv,
        })
        .to_string();
        build_if_valid(&[(PREFILL_JSON, &prefill), (DECODE_JSON, &decode)], &[]);
    }

    #[test]
    fn valid_shaped_json_profiles_build_or_are_refused(
        points in proptest::collection::vec((0.0_f64..1.0, 1.0_f64..20_000.0, 0.1_f64..100.0), 0..80),
        isl in proptest::collection::btree_set(1_u32..20_000, 0..30),
    ) {
        // Shapes that validate, values that may be degenerate (collinear, duplicated).
        let isl: Vec<u32> = isl.into_iter().collect();
        let prefill = serde_json::json!({
            "prefill_isl": isl, "prefill_ttft": vec![5.0; isl.len()],
            "prefill_thpt_per_gpu": vec![1000.0; isl.len()],
        })
        .to_string();
        let decode = serde_json::json!({
            "x_kv_usage": points.iter().map(|p| (p.0 * 8.0).round() / 8.0).collect::<Vec<_>>(),
            "y_context_length": points.iter().map(|p| p.1.round()).collect::<Vec<_>>(),
            "z_itl": points.iter().map(|p| p.2).collect::<Vec<_>>(),
            "z_thpt_per_gpu": points.iter().map(|p| p.2 * 10.0).collect::<Vec<_>>(),
            "max_kv_tokens": 100_000,
        })
        .to_string();
        build_if_valid(&[(PREFILL_JSON, &prefill), (DECODE_JSON, &decode)], &[]);
    }

    #[test]
    fn arbitrary_traces_never_panic(text in "(\\PC{0,80}\n){0,20}", interval in proptest::num::f64::ANY) {
        if let Ok(records) = parse_mooncake_jsonl(&text) {
            let _ = bucketize(&records, interval);
        }
    }

    #[test]
    fn trace_lines_with_arbitrary_fields_never_panic(
        lines in proptest::collection::vec((json_value(), json_value(), json_value(), json_value()), 0..20),
        interval in 0.001_f64..1e6,
    ) {
        let text: String = lines
            .iter()
            .map(|(t, i, o, extra)| {
                serde_json::json!({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": extra})
                    .to_string()
                    + "\n"
            })
            .collect();
        if let Ok(records) = parse_mooncake_jsonl(&text) {
            let buckets = bucketize(&records, interval);
            prop_assert!(buckets.len() <= records.len());
        }
    }
}
