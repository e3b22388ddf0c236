//! Pre-deployment profiling data: prefill TTFT and throughput against input length, decode ITL
//! and throughput against KV-cache usage and context length.
//!
//! Reads both upstream layouts of a `profile_results_dir`:
//! `selected_{prefill,decode}_interpolation/raw_data.npz`, or `prefill_raw_data.json` and
//! `decode_raw_data.json` (the ConfigMap form). Units: tokens, milliseconds, tokens/s per GPU;
//! `kv_usage` is a fraction of `max_kv_tokens`.
//!
//! Profiles come from users (a ConfigMap in the policy's namespace), so reading one has a bounded
//! cost: the file sizes, the decompressed size of each NPZ entry and of the whole archive, the
//! number of entries, each array's shape (checked in the `.npy` header before anything is
//! allocated) and the number of samples are capped ([`MAX_PROFILE_FILE_BYTES`],
//! [`MAX_NPZ_ENTRY_BYTES`], [`MAX_NPZ_TOTAL_BYTES`], [`MAX_NPZ_ENTRIES`], [`MAX_NPY_ELEMENTS`],
//! [`MAX_PREFILL_POINTS`], [`MAX_DECODE_POINTS`]). Real profiles are far below every cap: the
//! largest published ones have 17 prefill and 41 decode samples per configuration.

use std::{
    collections::BTreeMap,
    io::{Cursor, Read},
};

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, ReadNpyExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zip::ZipArchive;

/// File names of the two layouts.
pub const PREFILL_NPZ: &str = "selected_prefill_interpolation/raw_data.npz";
/// Decode NPZ, relative to the profile directory.
pub const DECODE_NPZ: &str = "selected_decode_interpolation/raw_data.npz";
/// Prefill JSON, relative to the profile directory (also the ConfigMap key).
pub const PREFILL_JSON: &str = "prefill_raw_data.json";
/// Decode JSON, relative to the profile directory (also the ConfigMap key).
pub const DECODE_JSON: &str = "decode_raw_data.json";
/// ConfigMap `binaryData` keys of the NPZ form.
pub const PREFILL_NPZ_KEY: &str = "prefill_raw_data.npz";
/// ConfigMap `binaryData` key of the decode NPZ.
pub const DECODE_NPZ_KEY: &str = "decode_raw_data.npz";

/// Fewest prefill samples a cubic spline needs.
pub const MIN_PREFILL_POINTS: usize = 4;
/// Fewest decode samples a triangulation needs.
pub const MIN_DECODE_POINTS: usize = 3;
/// Most prefill samples (ISLs) a profile may have: a sweep measures tens.
pub const MAX_PREFILL_POINTS: usize = 1_000;
/// Most decode samples a profile may have: a sweep measures tens to hundreds. Building the
/// performance model of a profile at this cap takes well under a second (see
/// `PerformanceModel::build_bounded`).
pub const MAX_DECODE_POINTS: usize = 10_000;
/// Largest profile file (NPZ or JSON) read, in bytes. A ConfigMap holds at most 1 MiB.
pub const MAX_PROFILE_FILE_BYTES: usize = 4 * 1024 * 1024;
/// Largest decompressed NPZ entry (one `.npy` array), in bytes: room for
/// [`MAX_NPY_ELEMENTS`] 8-byte numbers and the header.
pub const MAX_NPZ_ENTRY_BYTES: u64 = 1024 * 1024;
/// Largest total of the decompressed entries read from one NPZ file, in bytes.
pub const MAX_NPZ_TOTAL_BYTES: u64 = 4 * 1024 * 1024;
/// Most entries an NPZ file may list (a profile has 3 or 5 arrays; pre-swept sweeps up to 15).
pub const MAX_NPZ_ENTRIES: usize = 64;
/// Most numbers one `.npy` array may hold, from the shape in its header (multi-row sweeps are
/// read, then refused with a message saying to select one row).
pub const MAX_NPY_ELEMENTS: u64 = 100_000;
/// Longest `.npy` header, in bytes (numpy pads headers to 64 bytes; version 1 allows 65535).
const MAX_NPY_HEADER_BYTES: usize = 65_536;

/// Why profiling data could not be used. Every variant names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Neither layout is present.
    #[error(
        "no profiling data in {dir}: expected {PREFILL_NPZ} and {DECODE_NPZ}, or {PREFILL_JSON} and {DECODE_JSON}"
    )]
    NotFound {
        /// The directory searched.
        dir: String,
    },
    /// A file could not be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not a valid NPZ or JSON document.
    #[error("{file} is not valid {format}: {reason}")]
    Format {
        /// The file.
        file: String,
        /// `NPZ` or `JSON`.
        format: &'static str,
        /// The parser's explanation.
        reason: String,
    },
    /// A required array (or, in a ConfigMap, a required key) is absent.
    #[error("{file}: missing field `{field}`; {}", present_keys(present))]
    MissingField {
        /// The file.
        file: String,
        /// The array's name.
        field: &'static str,
        /// The fields (or keys) the file has, so a misspelt or renamed one shows.
        present: Vec<String>,
    },
    /// A ConfigMap has neither key of one part of the profile.
    #[error(
        "{config_map}: no binaryData key `{binary}` and no data key `{text}`; {}",
        present_keys(present)
    )]
    MissingKey {
        /// The ConfigMap.
        config_map: String,
        /// The `binaryData` key of the NPZ form.
        binary: &'static str,
        /// The `data` key of the JSON form.
        text: &'static str,
        /// The keys it has (`data.<key>`, `binaryData.<key>`).
        present: Vec<String>,
    },
    /// An array has a shape or type that is not a list of numbers.
    #[error("{file}: field `{field}` {reason}")]
    BadField {
        /// The file.
        file: String,
        /// The array's name.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Arrays that pair up have different lengths.
    #[error("{file}: fields `{field}` ({len}) and `{other}` ({other_len}) must have the same length")]
    LengthMismatch {
        /// The file.
        file: String,
        /// First array.
        field: &'static str,
        /// Its length.
        len: usize,
        /// Second array.
        other: &'static str,
        /// Its length.
        other_len: usize,
    },
    /// Too few samples to interpolate.
    #[error("{file}: field `{field}` has {len} points, at least {min} are needed")]
    TooFewPoints {
        /// The file.
        file: String,
        /// The array's name.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// A value is NaN, infinite, or out of its allowed range.
    #[error("{file}: field `{field}`[{index}] = {value} is invalid: {allowed}")]
    BadValue {
        /// The file.
        file: String,
        /// The array's name.
        field: &'static str,
        /// Position in the array.
        index: usize,
        /// The value.
        value: f64,
        /// What values are allowed.
        allowed: &'static str,
    },
    /// The data exceeds one of this module's caps.
    #[error("{file}: {what} exceeds the limit of {limit}")]
    TooLarge {
        /// The file (for a ConfigMap, `ConfigMap <name>/<key>`).
        file: String,
        /// What is too large, e.g. the entry or field and its size.
        what: String,
        /// The limit, with its unit.
        limit: String,
    },
    /// No built-in profile has that name.
    #[error("unknown built-in profile {name:?}; built-in profiles: {known}")]
    UnknownBuiltin {
        /// The name asked for.
        name: String,
        /// The names available.
        known: String,
    },
}

/// How [`ProfileError::MissingField`] lists what a file has.
fn present_keys(present: &[String]) -> String {
    if present.is_empty() {
        "it has none".to_string()
    } else {
        format!("it has: {}", present.join(", "))
    }
}

/// The entries of a ConfigMap holding a profile, borrowed from whatever holds the ConfigMap:
/// `data` (text) and `binary_data` (bytes) by key.
#[derive(Clone, Debug, Default)]
pub struct ConfigMapEntries<'a> {
    /// The ConfigMap's `data`.
    pub data: BTreeMap<&'a str, &'a str>,
    /// The ConfigMap's `binaryData`, decoded.
    pub binary_data: BTreeMap<&'a str, &'a [u8]>,
}

impl ConfigMapEntries<'_> {
    /// Every key, `data` first, for errors.
    fn keys(&self) -> Vec<String> {
        let data = self.data.keys().map(|key| format!("data.{key}"));
        let binary = self.binary_data.keys().map(|key| format!("binaryData.{key}"));
        data.chain(binary).collect()
    }
}

/// Prefill measurements, sorted by input length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillProfile {
    /// Input sequence lengths (tokens), strictly increasing.
    pub isl: Vec<f64>,
    /// Time to first token (ms) at each ISL.
    pub ttft_ms: Vec<f64>,
    /// Prefill throughput (tokens/s per GPU) at each ISL.
    pub thpt_per_gpu: Vec<f64>,
}

/// Decode measurements over (KV usage, context length).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeProfile {
    /// KV-cache usage as a fraction of `max_kv_tokens`.
    pub kv_usage: Vec<f64>,
    /// Context length (tokens): ISL + OSL/2.
    pub context_length: Vec<f64>,
    /// Inter-token latency (ms).
    pub itl_ms: Vec<f64>,
    /// Decode throughput (tokens/s per GPU).
    pub thpt_per_gpu: Vec<f64>,
    /// KV-cache capacity of one engine, in tokens.
    pub max_kv_tokens: f64,
}

/// A complete profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Prefill curves.
    pub prefill: PrefillProfile,
    /// Decode surfaces.
    pub decode: DecodeProfile,
}

/// A profile compiled into the binary.
struct Builtin {
    name: &'static str,
    prefill_npz: &'static [u8],
    decode_npz: &'static [u8],
    /// Factor applied to both throughput columns when the profile is loaded.
    ///
    /// The H100 Llama-3.3-70B files are one row of upstream's pre-swept sweep, which divided
    /// every row's engine throughput by the sweep's `gpu_count` (8), whatever the row's tensor
    /// parallelism: `prefill_thpt_per_gpu * 8 == isl / ttft` in all three rows. A TP4 engine
    /// has 4 GPUs, so its per-GPU throughput is twice the published figure (four times for
    /// TP2), and a planner fed the published one buys twice the engines its latencies need
    /// (the simulator showed it). The files in `config/profiles/` stay byte-identical to
    /// upstream's (the golden parity test reads them); the correction is made here.
    throughput_scale: f64,
    /// GPUs of one engine (the tensor-parallel degree of the profiled configuration).
    engine_gpus: u32,
}

/// The profiles compiled into the binary, from `config/profiles/`.
const BUILTIN: [Builtin; 4] = [
    Builtin {
        name: "h200-llama3.1-8b-tp1",
        prefill_npz: include_bytes!(
            "../../../config/profiles/h200-llama3.1-8b-tp1/selected_prefill_interpolation/raw_data.npz"
        ),
        decode_npz: include_bytes!(
            "../../../config/profiles/h200-llama3.1-8b-tp1/selected_decode_interpolation/raw_data.npz"
        ),
        throughput_scale: 1.0,
        engine_gpus: 1,
    },
    Builtin {
        name: "h100-llama3.3-70b-tp8",
        prefill_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp8/selected_prefill_interpolation/raw_data.npz"
        ),
        decode_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp8/selected_decode_interpolation/raw_data.npz"
        ),
        throughput_scale: 1.0,
        engine_gpus: 8,
    },
    Builtin {
        name: "h100-llama3.3-70b-tp4",
        prefill_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp4/selected_prefill_interpolation/raw_data.npz"
        ),
        decode_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp4/selected_decode_interpolation/raw_data.npz"
        ),
        throughput_scale: 2.0,
        engine_gpus: 4,
    },
    Builtin {
        name: "h100-llama3.3-70b-tp2",
        prefill_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp2/selected_prefill_interpolation/raw_data.npz"
        ),
        decode_npz: include_bytes!(
            "../../../config/profiles/h100-llama3.3-70b-tp2/selected_decode_interpolation/raw_data.npz"
        ),
        throughput_scale: 4.0,
        engine_gpus: 2,
    },
];

/// Names of the built-in profiles.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|builtin| builtin.name)
}

/// GPUs of one engine of a built-in profile, `None` for an unknown name.
pub fn builtin_engine_gpus(name: &str) -> Option<u32> {
    BUILTIN.iter().find(|b| b.name == name).map(|b| b.engine_gpus)
}

impl Profile {
    /// A profile compiled into the binary.
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        let builtin =
            BUILTIN
                .iter()
                .find(|b| b.name == name)
                .ok_or_else(|| ProfileError::UnknownBuiltin {
                    name: name.to_string(),
                    known: builtin_names().collect::<Vec<_>>().join(", "),
                })?;
        let prefill_file = format!("builtin:{name}/{PREFILL_NPZ}");
        let decode_file = format!("builtin:{name}/{DECODE_NPZ}");
        let mut prefill = PrefillProfile::from_npz(builtin.prefill_npz, &prefill_file)?;
        let mut decode = DecodeProfile::from_npz(builtin.decode_npz, &decode_file)?;
        for thpt in prefill
            .thpt_per_gpu
            .iter_mut()
            .chain(decode.thpt_per_gpu.iter_mut())
        {
            *thpt *= builtin.throughput_scale;
        }
        Self::from_parts(prefill, &prefill_file, decode, &decode_file)
    }

    /// Reads an upstream `profile_results_dir` (NPZ layout first, then JSON) through `read`,
    /// which returns the bytes of a file by its path relative to the directory, or `None` when
    /// it does not exist; `dir` names the directory in errors. The caller does the I/O, so this
    /// crate stays free of it.
    pub fn from_dir_files(
        dir: &str,
        mut read: impl FnMut(&str) -> Result<Option<Vec<u8>>, ProfileError>,
    ) -> Result<Self, ProfileError> {
        let mut read = |relative: &str| -> Result<Option<(Vec<u8>, String)>, ProfileError> {
            Ok(read(relative)?.map(|bytes| (bytes, format!("{dir}/{relative}"))))
        };
        let not_found = || ProfileError::NotFound { dir: dir.to_string() };
        let prefill = match (read(PREFILL_NPZ)?, read(PREFILL_JSON)?) {
            (Some((bytes, file)), _) => (PrefillProfile::from_npz(&bytes, &file)?, file),
            (None, Some((bytes, file))) => (PrefillProfile::from_json(&bytes, &file)?, file),
            (None, None) => return Err(not_found()),
        };
        let decode = match (read(DECODE_NPZ)?, read(DECODE_JSON)?) {
            (Some((bytes, file)), _) => (DecodeProfile::from_npz(&bytes, &file)?, file),
            (None, Some((bytes, file))) => (DecodeProfile::from_json(&bytes, &file)?, file),
            (None, None) => return Err(not_found()),
        };
        Self::from_parts(prefill.0, &prefill.1, decode.0, &decode.1)
    }

    /// Reads an upstream `profile_results_dir` from the file system (as
    /// [`Profile::from_dir_files`]: the NPZ layout first, then the JSON one); errors name the
    /// files. The one place this crate reads files, behind the `fs` feature, so every tool reads
    /// a directory the same way and the planner maths stays free of I/O.
    #[cfg(any(test, feature = "fs"))]
    pub fn from_dir(dir: &std::path::Path) -> Result<Self, ProfileError> {
        Self::from_dir_files(&dir.display().to_string(), |relative| {
            let path = dir.join(relative);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ProfileError::Read {
                    file: path.display().to_string(),
                    source,
                }),
            }
        })
    }

    /// Builds a profile from the contents of a ConfigMap: `binary_data` holds the NPZ files, or
    /// `data` the JSON files, under the keys of this module's constants (the NPZ first, as in a
    /// directory). `source` names the ConfigMap in errors.
    pub fn from_config_map_entries(
        source: &str,
        entries: &ConfigMapEntries<'_>,
    ) -> Result<Self, ProfileError> {
        let name = |key: &str| format!("{source}/{key}");
        let missing = |binary: &'static str, text: &'static str| ProfileError::MissingKey {
            config_map: source.to_string(),
            binary,
            text,
            present: entries.keys(),
        };
        let prefill = if let Some(bytes) = entries.binary_data.get(PREFILL_NPZ_KEY) {
            let file = name(PREFILL_NPZ_KEY);
            (PrefillProfile::from_npz(bytes, &file)?, file)
        } else if let Some(text) = entries.data.get(PREFILL_JSON) {
            let file = name(PREFILL_JSON);
            (PrefillProfile::from_json(text.as_bytes(), &file)?, file)
        } else {
            return Err(missing(PREFILL_NPZ_KEY, PREFILL_JSON));
        };
        let decode = if let Some(bytes) = entries.binary_data.get(DECODE_NPZ_KEY) {
            let file = name(DECODE_NPZ_KEY);
            (DecodeProfile::from_npz(bytes, &file)?, file)
        } else if let Some(text) = entries.data.get(DECODE_JSON) {
            let file = name(DECODE_JSON);
            (DecodeProfile::from_json(text.as_bytes(), &file)?, file)
        } else {
            return Err(missing(DECODE_NPZ_KEY, DECODE_JSON));
        };
        Self::from_parts(prefill.0, &prefill.1, decode.0, &decode.1)
    }

    fn from_parts(
        prefill: PrefillProfile,
        prefill_file: &str,
        decode: DecodeProfile,
        decode_file: &str,
    ) -> Result<Self, ProfileError> {
        Ok(Self {
            prefill: prefill.validated(prefill_file)?,
            decode: decode.validated(decode_file)?,
        })
    }
}

impl PrefillProfile {
    /// Parses the prefill NPZ.
    pub fn from_npz(bytes: &[u8], file: &str) -> Result<Self, ProfileError> {
        let mut npz = Npz::open(bytes, file)?;
        Ok(Self {
            isl: npz.vector("prefill_isl", MAX_PREFILL_POINTS)?,
            ttft_ms: npz.vector("prefill_ttft", MAX_PREFILL_POINTS)?,
            thpt_per_gpu: npz.vector("prefill_thpt_per_gpu", MAX_PREFILL_POINTS)?,
        })
    }

    /// Parses the prefill JSON.
    pub fn from_json(bytes: &[u8], file: &str) -> Result<Self, ProfileError> {
        let doc = parse_json(bytes, file)?;
        Ok(Self {
            isl: json_vector(&doc, file, "prefill_isl", MAX_PREFILL_POINTS)?,
            ttft_ms: json_vector(&doc, file, "prefill_ttft", MAX_PREFILL_POINTS)?,
            thpt_per_gpu: json_vector(&doc, file, "prefill_thpt_per_gpu", MAX_PREFILL_POINTS)?,
        })
    }

    /// Checks lengths and values, and sorts by ISL (scipy's `interp1d` sorts its input too).
    fn validated(self, file: &str) -> Result<Self, ProfileError> {
        same_length(file, ("prefill_isl", &self.isl), ("prefill_ttft", &self.ttft_ms))?;
        same_length(
            file,
            ("prefill_isl", &self.isl),
            ("prefill_thpt_per_gpu", &self.thpt_per_gpu),
        )?;
        if self.isl.len() < MIN_PREFILL_POINTS {
            return Err(ProfileError::TooFewPoints {
                file: file.to_string(),
                field: "prefill_isl",
                len: self.isl.len(),
                min: MIN_PREFILL_POINTS,
            });
        }
        at_most(file, "prefill_isl", self.isl.len(), MAX_PREFILL_POINTS)?;
        check_values(
            file,
            "prefill_isl",
            &self.isl,
            |v| v > 0.0,
            "a positive number of tokens",
        )?;
        check_values(
            file,
            "prefill_ttft",
            &self.ttft_ms,
            |v| v > 0.0,
            "a positive number of milliseconds",
        )?;
        check_values(
            file,
            "prefill_thpt_per_gpu",
            &self.thpt_per_gpu,
            |v| v >= 0.0,
            "a number >= 0",
        )?;
        let mut order: Vec<usize> = (0..self.isl.len()).collect();
        order.sort_by(|&a, &b| self.isl[a].total_cmp(&self.isl[b]));
        let pick = |values: &[f64]| order.iter().map(|&i| values[i]).collect::<Vec<_>>();
        let sorted = Self {
            isl: pick(&self.isl),
            ttft_ms: pick(&self.ttft_ms),
            thpt_per_gpu: pick(&self.thpt_per_gpu),
        };
        if let Some(i) = sorted.isl.windows(2).position(|w| w[0] == w[1]) {
            return Err(ProfileError::BadValue {
                file: file.to_string(),
                field: "prefill_isl",
                index: order[i + 1],
                value: sorted.isl[i + 1],
                allowed: "distinct input lengths (this one appears twice)",
            });
        }
        Ok(sorted)
    }
}

impl DecodeProfile {
    /// Parses the decode NPZ.
    pub fn from_npz(bytes: &[u8], file: &str) -> Result<Self, ProfileError> {
        let mut npz = Npz::open(bytes, file)?;
        let max_kv = npz.vector("max_kv_tokens", MAX_PREFILL_POINTS)?;
        Ok(Self {
            kv_usage: npz.vector("x_kv_usage", MAX_DECODE_POINTS)?,
            context_length: npz.vector("y_context_length", MAX_DECODE_POINTS)?,
            itl_ms: npz.vector("z_itl", MAX_DECODE_POINTS)?,
            thpt_per_gpu: npz.vector("z_thpt_per_gpu", MAX_DECODE_POINTS)?,
            max_kv_tokens: single(file, "max_kv_tokens", &max_kv)?,
        })
    }

    /// Parses the decode JSON (`max_kv_tokens` a number or a one-element list).
    pub fn from_json(bytes: &[u8], file: &str) -> Result<Self, ProfileError> {
        let doc = parse_json(bytes, file)?;
        let max_kv = match doc.get("max_kv_tokens") {
            Some(Value::Number(n)) => n.as_f64().into_iter().collect(),
            _ => json_vector(&doc, file, "max_kv_tokens", MAX_PREFILL_POINTS)?,
        };
        Ok(Self {
            kv_usage: json_vector(&doc, file, "x_kv_usage", MAX_DECODE_POINTS)?,
            context_length: json_vector(&doc, file, "y_context_length", MAX_DECODE_POINTS)?,
            itl_ms: json_vector(&doc, file, "z_itl", MAX_DECODE_POINTS)?,
            thpt_per_gpu: json_vector(&doc, file, "z_thpt_per_gpu", MAX_DECODE_POINTS)?,
            max_kv_tokens: single(file, "max_kv_tokens", &max_kv)?,
        })
    }

    fn validated(self, file: &str) -> Result<Self, ProfileError> {
        same_length(
            file,
            ("x_kv_usage", &self.kv_usage),
            ("y_context_length", &self.context_length),
        )?;
        same_length(file, ("x_kv_usage", &self.kv_usage), ("z_itl", &self.itl_ms))?;
        same_length(
            file,
            ("x_kv_usage", &self.kv_usage),
            ("z_thpt_per_gpu", &self.thpt_per_gpu),
        )?;
        if self.kv_usage.len() < MIN_DECODE_POINTS {
            return Err(ProfileError::TooFewPoints {
                file: file.to_string(),
                field: "x_kv_usage",
                len: self.kv_usage.len(),
                min: MIN_DECODE_POINTS,
            });
        }
        at_most(file, "x_kv_usage", self.kv_usage.len(), MAX_DECODE_POINTS)?;
        check_values(
            file,
            "x_kv_usage",
            &self.kv_usage,
            |v| v >= 0.0,
            "a fraction >= 0",
        )?;
        check_values(
            file,
            "y_context_length",
            &self.context_length,
            |v| v > 0.0,
            "a positive number of tokens",
        )?;
        check_values(
            file,
            "z_itl",
            &self.itl_ms,
            |v| v > 0.0,
            "a positive number of milliseconds",
        )?;
        check_values(
            file,
            "z_thpt_per_gpu",
            &self.thpt_per_gpu,
            |v| v >= 0.0,
            "a number >= 0",
        )?;
        check_values(
            file,
            "max_kv_tokens",
            &[self.max_kv_tokens],
            |v| v >= 1.0,
            "a positive number of tokens",
        )?;
        Ok(self)
    }
}

/// An NPZ archive read with bounded cost: the archive's size and entry count are checked
/// before it is opened, each entry is decompressed through a capped reader, and each array's
/// shape is checked in its `.npy` header before ndarray-npy allocates for it.
struct Npz<'a> {
    archive: ZipArchive<Cursor<&'a [u8]>>,
    file: &'a str,
    /// Decompressed bytes read so far, against [`MAX_NPZ_TOTAL_BYTES`].
    total: u64,
}

impl<'a> Npz<'a> {
    fn open(bytes: &'a [u8], file: &'a str) -> Result<Self, ProfileError> {
        check_file_size(bytes, file)?;
        let format = |reason: String| ProfileError::Format {
            file: file.to_string(),
            format: "NPZ",
            reason,
        };
        // The zip reader reserves room for the entry count the end-of-central-directory record
        // claims (bounded only by the archive's size): check it first.
        if let Some(entries) = eocd_entry_counts(bytes).max()
            && entries > MAX_NPZ_ENTRIES
        {
            return Err(ProfileError::TooLarge {
                file: file.to_string(),
                what: format!("the archive's entry count ({entries})"),
                limit: format!("{MAX_NPZ_ENTRIES} entries"),
            });
        }
        let archive = ZipArchive::new(Cursor::new(bytes)).map_err(|e| format(e.to_string()))?;
        if archive.len() > MAX_NPZ_ENTRIES {
            return Err(ProfileError::TooLarge {
                file: file.to_string(),
                what: format!("the archive's entry count ({})", archive.len()),
                limit: format!("{MAX_NPZ_ENTRIES} entries"),
            });
        }
        Ok(Self {
            archive,
            file,
            total: 0,
        })
    }

    fn too_large(&self, what: String, limit: String) -> ProfileError {
        ProfileError::TooLarge {
            file: self.file.to_string(),
            what,
            limit,
        }
    }

    /// The decompressed bytes of one entry, within the per-entry and total caps.
    fn entry(&mut self, name: &str, field: &'static str) -> Result<Vec<u8>, ProfileError> {
        let file = self.file;
        let unreadable = |e: &dyn std::fmt::Display| ProfileError::BadField {
            file: file.to_string(),
            field,
            reason: format!("entry {name} cannot be decompressed: {e}"),
        };
        let entry_too_large = |size: String| ProfileError::TooLarge {
            file: file.to_string(),
            what: format!("entry {name} (field `{field}`), which decompresses to {size} bytes"),
            limit: format!("{MAX_NPZ_ENTRY_BYTES} bytes per entry"),
        };
        let remaining = MAX_NPZ_TOTAL_BYTES.saturating_sub(self.total);
        let mut entry = self.archive.by_name(name).map_err(|e| unreadable(&e))?;
        if entry.size() > MAX_NPZ_ENTRY_BYTES {
            return Err(entry_too_large(entry.size().to_string()));
        }
        // The declared size may lie: the capped reader is what bounds the work.
        let mut bytes = Vec::new();
        (&mut entry)
            .take(MAX_NPZ_ENTRY_BYTES.min(remaining).saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| unreadable(&e))?;
        let size = bytes.len() as u64;
        if size > MAX_NPZ_ENTRY_BYTES {
            return Err(entry_too_large(format!("more than {MAX_NPZ_ENTRY_BYTES}")));
        }
        if size > remaining {
            return Err(ProfileError::TooLarge {
                file: file.to_string(),
                what: format!(
                    "the decompressed size of the archive (more than {MAX_NPZ_TOTAL_BYTES} bytes with entry {name})"
                ),
                limit: format!("{MAX_NPZ_TOTAL_BYTES} bytes in total"),
            });
        }
        self.total += size;
        Ok(bytes)
    }

    /// Reads one array as `f64` whatever its numeric dtype; a single row of a 2-D array is
    /// accepted. More than `max_points` values are refused.
    fn vector(&mut self, field: &'static str, max_points: usize) -> Result<Vec<f64>, ProfileError> {
        let file = self.file;
        let entry = format!("{field}.npy");
        let names: Vec<&str> = self.archive.file_names().collect();
        let name = if names.contains(&entry.as_str()) {
            entry
        } else if names.contains(&field) {
            field.to_string()
        } else {
            return Err(ProfileError::MissingField {
                file: file.to_string(),
                field,
                present: names
                    .iter()
                    .map(|name| name.trim_end_matches(".npy").to_string())
                    .collect(),
            });
        };
        let bytes = self.entry(&name, field)?;
        let bad = |reason: String| ProfileError::BadField {
            file: file.to_string(),
            field,
            reason,
        };
        let shape = npy_shape(&bytes).map_err(|e| bad(format!("is not a .npy array: {e}")))?;
        let elements = shape
            .iter()
            .try_fold(1_u64, |product, &dim| product.checked_mul(dim))
            .filter(|&n| n <= MAX_NPY_ELEMENTS);
        let Some(elements) = elements else {
            return Err(self.too_large(
                format!("field `{field}` of shape {shape:?}"),
                format!("{MAX_NPY_ELEMENTS} numbers per array"),
            ));
        };
        let is_vector = match shape.as_slice() {
            [] | [_] => true,
            [rows, _] => *rows == 1,
            _ => false,
        };
        if !is_vector {
            return Err(bad(format!(
                "has shape {shape:?}; expected one row of samples (select one configuration)"
            )));
        }
        if elements > max_points as u64 {
            return Err(self.too_large(
                format!("field `{field}` with {elements} points"),
                format!("{max_points} points"),
            ));
        }
        let array = read_npy_as_f64(&bytes).map_err(|e| bad(format!("is not a numeric array: {e}")))?;
        Ok(array.iter().copied().collect())
    }
}

/// The array in `.npy` bytes whose header was checked, as `f64` whatever its numeric dtype.
fn read_npy_as_f64(bytes: &[u8]) -> Result<ArrayD<f64>, ReadNpyError> {
    match ArrayD::<f64>::read_npy(bytes) {
        Ok(array) => Ok(array),
        Err(_) => match ArrayD::<i64>::read_npy(bytes) {
            Ok(array) => Ok(array.mapv(|v| v as f64)),
            Err(_) => ArrayD::<i32>::read_npy(bytes).map(|a| a.mapv(f64::from)),
        },
    }
}

/// The shape in a `.npy` header, read without allocating from anything the header claims. Only
/// flat headers of plain dtypes are accepted (`{'descr': '<f8', 'fortran_order': False,
/// 'shape': (17,), }`), so the full header parser that runs later sees nothing nested.
fn npy_shape(bytes: &[u8]) -> Result<Vec<u64>, String> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if !bytes.starts_with(MAGIC) {
        return Err("no \\x93NUMPY magic string".into());
    }
    let byte = |i: usize| bytes.get(i).copied().ok_or("the header is cut short");
    let (length, start) = match byte(6)? {
        1 => (usize::from(u16::from_le_bytes([byte(8)?, byte(9)?])), 10),
        2 | 3 => (
            u32::from_le_bytes([byte(8)?, byte(9)?, byte(10)?, byte(11)?]) as usize,
            12,
        ),
        version => return Err(format!("unsupported .npy format version {version}")),
    };
    if length > MAX_NPY_HEADER_BYTES {
        return Err(format!(
            "the header is {length} bytes long, at most {MAX_NPY_HEADER_BYTES} are allowed"
        ));
    }
    let header = bytes
        .get(start..start + length)
        .ok_or("the header is cut short")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not UTF-8")?;
    let count = |c: char| header.matches(c).count();
    if count('{') != 1 || count('}') != 1 || count('(') != 1 || count(')') != 1 || header.contains('[') {
        return Err("the header is not a flat dictionary of a plain numeric dtype".into());
    }
    let key = header
        .find("'shape'")
        .or_else(|| header.find("\"shape\""))
        .ok_or("the header has no shape")?;
    let rest = &header[key..];
    let (open, close) = rest
        .find('(')
        .zip(rest.find(')'))
        .filter(|(open, close)| open < close)
        .ok_or("the header's shape is not a tuple")?;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|dim| !dim.is_empty())
        .map(|dim| {
            dim.trim_end_matches('L')
                .parse::<u64>()
                .map_err(|_| format!("the header's shape has a dimension {dim:?}"))
        })
        .collect()
}

/// Entry counts of every end-of-central-directory record candidate in the archive's tail.
fn eocd_entry_counts(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    const SIGNATURE: &[u8] = b"PK\x05\x06";
    // The record is 22 bytes plus a comment of at most 65535.
    let tail_start = bytes.len().saturating_sub(22 + 65_535);
    bytes[tail_start..]
        .windows(22)
        .filter(|w| w.starts_with(SIGNATURE))
        .map(|w| usize::from(u16::from_le_bytes([w[10], w[11]])))
}

fn check_file_size(bytes: &[u8], file: &str) -> Result<(), ProfileError> {
    if bytes.len() > MAX_PROFILE_FILE_BYTES {
        return Err(ProfileError::TooLarge {
            file: file.to_string(),
            what: format!("the file's size ({} bytes)", bytes.len()),
            limit: format!("{MAX_PROFILE_FILE_BYTES} bytes"),
        });
    }
    Ok(())
}

fn at_most(file: &str, field: &'static str, len: usize, max: usize) -> Result<(), ProfileError> {
    if len > max {
        return Err(ProfileError::TooLarge {
            file: file.to_string(),
            what: format!("field `{field}` with {len} points"),
            limit: format!("{max} points"),
        });
    }
    Ok(())
}

fn parse_json(bytes: &[u8], file: &str) -> Result<Value, ProfileError> {
    check_file_size(bytes, file)?;
    serde_json::from_slice(bytes).map_err(|e| ProfileError::Format {
        file: file.to_string(),
        format: "JSON",
        reason: e.to_string(),
    })
}

fn json_vector(
    doc: &Value,
    file: &str,
    field: &'static str,
    max_points: usize,
) -> Result<Vec<f64>, ProfileError> {
    let value = doc.get(field).ok_or_else(|| ProfileError::MissingField {
        file: file.to_string(),
        field,
        present: doc
            .as_object()
            .map(|object| object.keys().cloned().collect())
            .unwrap_or_default(),
    })?;
    let items = value.as_array().ok_or_else(|| ProfileError::BadField {
        file: file.to_string(),
        field,
        reason: "must be a list of numbers".into(),
    })?;
    at_most(file, field, items.len(), max_points)?;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_f64().ok_or_else(|| ProfileError::BadField {
                file: file.to_string(),
                field,
                reason: format!("item {index} is {item}, not a number"),
            })
        })
        .collect()
}

fn single(file: &str, field: &'static str, values: &[f64]) -> Result<f64, ProfileError> {
    match values {
        [value] => Ok(*value),
        _ => Err(ProfileError::BadField {
            file: file.to_string(),
            field,
            reason: format!("must hold one number, has {}", values.len()),
        }),
    }
}

fn same_length(file: &str, a: (&'static str, &[f64]), b: (&'static str, &[f64])) -> Result<(), ProfileError> {
    if a.1.len() == b.1.len() {
        return Ok(());
    }
    Err(ProfileError::LengthMismatch {
        file: file.to_string(),
        field: a.0,
        len: a.1.len(),
        other: b.0,
        other_len: b.1.len(),
    })
}

fn check_values(
    file: &str,
    field: &'static str,
    values: &[f64],
    allowed: impl Fn(f64) -> bool,
    description: &'static str,
) -> Result<(), ProfileError> {
    match values.iter().position(|&v| !v.is_finite() || !allowed(v)) {
        None => Ok(()),
        Some(index) => Err(ProfileError::BadValue {
            file: file.to_string(),
            field,
            index,
            value: values[index],
            allowed: description,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn prefill_json(isl: &str, ttft: &str, thpt: &str) -> String {
        format!(r#"{{"prefill_isl": {isl}, "prefill_ttft": {ttft}, "prefill_thpt_per_gpu": {thpt}}}"#)
    }

    fn load_prefill(json: &str) -> Result<PrefillProfile, ProfileError> {
        PrefillProfile::from_json(json.as_bytes(), "p.json")?.validated("p.json")
    }

    #[test]
    fn every_builtin_profile_loads() {
        for name in builtin_names() {
            let profile = Profile::builtin(name).unwrap();
            assert!(profile.prefill.isl.len() >= MIN_PREFILL_POINTS, "{name}");
            assert!(profile.decode.max_kv_tokens > 0.0, "{name}");
        }
        let h200 = Profile::builtin("h200-llama3.1-8b-tp1").unwrap();
        assert_eq!(h200.prefill.isl.len(), 17);
        assert_eq!(h200.decode.kv_usage.len(), 41);
        assert_eq!(h200.decode.max_kv_tokens, 945029.0);
    }

    #[test]
    fn builtin_prefill_throughput_is_per_gpu_of_the_engine() {
        // One request at a time: an engine's prefill throughput is isl / ttft, so per GPU it is
        // that over the engine's GPUs (the tensor-parallel degree in the profile's name).
        for (name, engine_gpus) in [
            ("h200-llama3.1-8b-tp1", 1.0),
            ("h100-llama3.3-70b-tp8", 8.0),
            ("h100-llama3.3-70b-tp4", 4.0),
            ("h100-llama3.3-70b-tp2", 2.0),
        ] {
            assert_eq!(builtin_engine_gpus(name), Some(engine_gpus as u32), "{name}");
            let prefill = Profile::builtin(name).unwrap().prefill;
            for ((isl, ttft_ms), thpt) in prefill
                .isl
                .iter()
                .zip(&prefill.ttft_ms)
                .zip(&prefill.thpt_per_gpu)
            {
                let engine = isl / ttft_ms * 1000.0;
                assert!(
                    (thpt * engine_gpus / engine - 1.0).abs() < 1e-3,
                    "{name}: isl {isl}: {thpt} tokens/s/GPU x {engine_gpus} GPUs != {engine}"
                );
            }
        }
    }

    #[test]
    fn builtin_decode_throughput_scales_with_prefill() {
        // The decode columns were divided by the same sweep-wide GPU count.
        let published = Profile::from_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/profiles/h100-llama3.3-70b-tp4"),
        )
        .unwrap();
        let builtin = Profile::builtin("h100-llama3.3-70b-tp4").unwrap();
        for (corrected, raw) in builtin
            .decode
            .thpt_per_gpu
            .iter()
            .zip(&published.decode.thpt_per_gpu)
        {
            assert_eq!(*corrected, raw * 2.0);
        }
        assert_eq!(builtin.decode.itl_ms, published.decode.itl_ms);
        assert_eq!(builtin.prefill.ttft_ms, published.prefill.ttft_ms);
    }

    #[test]
    fn unknown_builtin_lists_the_known_ones() {
        let error = Profile::builtin("a100").unwrap_err().to_string();
        assert!(error.contains("h200-llama3.1-8b-tp1"), "{error}");
    }

    fn fixture(relative: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/profiles")
            .join(relative)
    }

    #[test]
    fn json_and_npz_of_the_same_data_agree() {
        // The exports wrap arrays as {dtype, shape, data}; unwrap them into the upstream JSON
        // layout to compare both readers on identical numbers.
        let unwrap = |path: PathBuf| -> String {
            let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            let map: serde_json::Map<String, Value> = doc
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v["data"].clone()))
                .collect();
            Value::Object(map).to_string()
        };
        let prefill = unwrap(fixture("h200-export/prefill.json"));
        let decode = unwrap(fixture("h200-export/decode.json"));
        let entries = ConfigMapEntries {
            data: [(PREFILL_JSON, prefill.as_str()), (DECODE_JSON, decode.as_str())].into(),
            binary_data: BTreeMap::new(),
        };
        let from_json = Profile::from_config_map_entries("cm", &entries).unwrap();
        assert_eq!(from_json, Profile::builtin("h200-llama3.1-8b-tp1").unwrap());
    }

    #[test]
    fn reads_the_upstream_json_example() {
        let profile = Profile::from_dir(&fixture("qwen3-0.6b")).unwrap();
        assert_eq!(profile.prefill.isl, [128.0, 256.0, 512.0, 1024.0, 2048.0]);
        assert_eq!(profile.decode.kv_usage.len(), 20);
    }

    #[test]
    fn missing_directory_says_what_is_expected() {
        let error = Profile::from_dir(Path::new("/nonexistent/profile"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(PREFILL_NPZ) && error.contains(PREFILL_JSON),
            "{error}"
        );
    }

    #[test]
    fn bad_prefill_data_is_named() {
        let cases = [
            (
                prefill_json("[1,2,3]", "[1,2,3]", "[1,2,3]"),
                "has 3 points, at least 4",
            ),
            (
                prefill_json("[1,2,3,4]", "[1,2,3]", "[1,2,3,4]"),
                "`prefill_isl` (4) and `prefill_ttft` (3)",
            ),
            (
                prefill_json("[1,2,3,4]", "[1,2,-3,4]", "[1,2,3,4]"),
                "`prefill_ttft`[2] = -3",
            ),
            (
                prefill_json("[1,2,2,4]", "[1,2,3,4]", "[1,2,3,4]"),
                "appears twice",
            ),
            (
                prefill_json("[1,2,3,4]", "[1,2,3,4]", "\"fast\""),
                "`prefill_thpt_per_gpu` must be a list",
            ),
            (
                r#"{"prefill_isl": [1,2,3,4], "prefill_ttft": [1,2,3,4]}"#.into(),
                "missing field `prefill_thpt_per_gpu`",
            ),
            (
                prefill_json("[1,2,3,4]", "[1,2,3,0]", "[1,2,3,4]"),
                "`prefill_ttft`[3] = 0",
            ),
            ("{not json".into(), "p.json is not valid JSON"),
        ];
        for (json, expected) in cases {
            let error = load_prefill(&json).unwrap_err().to_string();
            assert!(error.contains(expected), "{json}: {error}");
            assert!(error.contains("p.json"), "error does not name the file: {error}");
        }
    }

    #[test]
    fn nan_is_rejected() {
        let profile = PrefillProfile {
            isl: vec![1.0, 2.0, 3.0, 4.0],
            ttft_ms: vec![1.0, f64::NAN, 3.0, 4.0],
            thpt_per_gpu: vec![1.0; 4],
        };
        let error = profile.validated("p").unwrap_err().to_string();
        assert!(error.contains("`prefill_ttft`[1] = NaN"), "{error}");
    }

    #[test]
    fn prefill_is_sorted_by_isl() {
        let profile = load_prefill(&prefill_json("[4,1,3,2]", "[40,10,30,20]", "[4,1,3,2]")).unwrap();
        assert_eq!(profile.isl, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(profile.ttft_ms, [10.0, 20.0, 30.0, 40.0]);
    }

    #[test]
    fn bad_decode_data_is_named() {
        let json = r#"{"x_kv_usage": [0.1, 0.2, 0.3], "y_context_length": [100, 100, 200],
                       "z_itl": [5, 6, 7], "z_thpt_per_gpu": [1, 2, 3], "max_kv_tokens": [0]}"#;
        let error = DecodeProfile::from_json(json.as_bytes(), "d.json")
            .unwrap()
            .validated("d.json")
            .unwrap_err();
        assert!(error.to_string().contains("`max_kv_tokens`[0] = 0"), "{error}");
        let npz_error = DecodeProfile::from_npz(b"not a zip", "d.npz")
            .unwrap_err()
            .to_string();
        assert!(npz_error.contains("d.npz is not valid NPZ"), "{npz_error}");
    }

    /// An NPZ file of float arrays.
    fn npz(arrays: &[(&str, &[f64])]) -> Vec<u8> {
        let mut npz = ndarray_npy::NpzWriter::new(Cursor::new(Vec::new()));
        for (name, values) in arrays {
            npz.add_array(*name, &ndarray::Array1::from(values.to_vec()))
                .unwrap();
        }
        npz.finish().unwrap().into_inner()
    }

    #[test]
    fn a_missing_array_lists_the_arrays_present() {
        let bytes = npz(&[
            ("prefill_isl", &[1.0, 2.0, 3.0, 4.0]),
            ("prefill_ttft_ms", &[1.0, 2.0, 3.0, 4.0]),
            ("prefill_thpt_per_gpu", &[1.0, 2.0, 3.0, 4.0]),
        ]);
        let error = PrefillProfile::from_npz(&bytes, "p.npz").unwrap_err().to_string();
        assert_eq!(
            error,
            "p.npz: missing field `prefill_ttft`; it has: prefill_isl, prefill_ttft_ms, prefill_thpt_per_gpu"
        );
        let error = PrefillProfile::from_json(b"[1, 2]", "p.json")
            .unwrap_err()
            .to_string();
        assert_eq!(error, "p.json: missing field `prefill_isl`; it has none");
    }

    #[test]
    fn nan_in_an_npz_is_named_with_its_index() {
        let bytes = npz(&[
            ("prefill_isl", &[1.0, 2.0, 3.0, 4.0]),
            ("prefill_ttft", &[1.0, 2.0, f64::NAN, 4.0]),
            ("prefill_thpt_per_gpu", &[1.0, 2.0, 3.0, 4.0]),
        ]);
        let error = PrefillProfile::from_npz(&bytes, "p.npz")
            .unwrap()
            .validated("p.npz")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("p.npz: field `prefill_ttft`[2] = NaN is invalid"),
            "{error}"
        );
    }

    #[test]
    fn a_config_map_without_a_part_lists_its_keys() {
        let entries = ConfigMapEntries {
            data: [("prefill_raw_data.json", "{}")].into(),
            binary_data: [("decode.npz", b"PK".as_slice())].into(),
        };
        let error = Profile::from_config_map_entries("ConfigMap p", &entries)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "ConfigMap p/prefill_raw_data.json: missing field `prefill_isl`; it has none"
        );
        let entries = ConfigMapEntries {
            binary_data: [("decode.npz", b"PK".as_slice())].into(),
            ..ConfigMapEntries::default()
        };
        let error = Profile::from_config_map_entries("ConfigMap p", &entries)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "ConfigMap p: no binaryData key `prefill_raw_data.npz` and no data key `prefill_raw_data.json`; it has: binaryData.decode.npz"
        );
    }

    #[test]
    fn multi_row_pre_swept_arrays_are_refused() {
        let bytes = std::fs::read(fixture("pre_swept_h100_prefill.npz")).unwrap();
        let error = PrefillProfile::from_npz(&bytes, "pre.npz")
            .unwrap_err()
            .to_string();
        assert!(error.contains("shape [3, 9]"), "{error}");
    }
}
