//! The dereference step: read what a policy points at, in its own namespace: the target DGD,
//! the profile (a built-in one, or a ConfigMap) and, once per planner state, the warm-up trace
//! and Prometheus history the predictors start from.

use std::{collections::HashMap, sync::Arc, sync::Mutex, time::Duration};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use planner_api::PlannerPolicy;
use planner_core::{
    interpolation::PerformanceModel,
    profile::{ConfigMapEntries, Profile},
    state::SlaPlanner,
    trace,
};

use crate::{
    controller::common::{KubeError, chain},
    lookup::{self, LookupError, TargetLookup},
    sources::prometheus::{PrometheusClient, SeriesFilter},
};

/// Intervals of Prometheus history replayed into the predictors after a restart.
pub const HISTORY_INTERVALS: usize = 50;

/// Reads the policy's target DGD, of either served version (see [`lookup::target_graph`]).
pub async fn target(client: &Client, policy: &PlannerPolicy) -> Result<TargetLookup, KubeError> {
    let namespace = policy.namespace().unwrap_or_default();
    lookup::target_graph(client, &namespace, &policy.spec.target_ref.name)
        .await
        .map_err(|LookupError::Kube { action, source }| KubeError { action, source })
}

/// Longest bearer token read from a Secret (service-account tokens are about 1 KiB).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The field naming the Prometheus bearer token's Secret.
const TOKEN_FIELD: &str = "spec.metrics.prometheus.bearerTokenSecret";

/// Why the bearer token the policy names cannot be used; the message says what to fix, is shown
/// in `MetricsAvailable`, and never carries the Secret's data.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The Secret cannot be read.
    #[error("{TOKEN_FIELD}: cannot read Secret {name:?}: {error}")]
    Unreadable {
        /// The Secret.
        name: String,
        /// The API server's error.
        error: String,
    },
    /// There is no such Secret.
    #[error("{TOKEN_FIELD}: Secret {name:?} not found in namespace {namespace:?}")]
    NotFound {
        /// The Secret.
        name: String,
        /// The policy's namespace.
        namespace: String,
    },
    /// The Secret has no such key.
    #[error("{TOKEN_FIELD}: Secret {name:?} has no key {key:?}")]
    NoKey {
        /// The Secret.
        name: String,
        /// The key.
        key: String,
    },
    /// The key holds something else than a token.
    #[error(
        "{TOKEN_FIELD}: key {key:?} of Secret {name:?} is not a token; allowed: 1 to {MAX_TOKEN_BYTES} bytes of text on one line"
    )]
    NotAToken {
        /// The Secret.
        name: String,
        /// The key.
        key: String,
    },
}

/// The bearer token the policy names for Prometheus (`None`: it names none), read from its
/// Secret on every call so a rotated token is used at once.
pub async fn prometheus_token(client: &Client, policy: &PlannerPolicy) -> Result<Option<String>, TokenError> {
    let Some(reference) = &policy.spec.metrics.prometheus.bearer_token_secret else {
        return Ok(None);
    };
    let namespace = policy.namespace().unwrap_or_default();
    let name = reference.name.clone();
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get_opt(&reference.name)
        .await
        .map_err(|error| TokenError::Unreadable {
            name: name.clone(),
            error: chain(&error),
        })?
        .ok_or_else(|| TokenError::NotFound {
            name: name.clone(),
            namespace: namespace.clone(),
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(&reference.key))
        .map(|value| value.0.as_slice())
        .ok_or_else(|| TokenError::NoKey {
            name: name.clone(),
            key: reference.key.clone(),
        })?;
    let token = std::str::from_utf8(bytes)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES && !t.contains(char::is_control))
        .ok_or_else(|| TokenError::NotAToken {
            name: name.clone(),
            key: reference.key.clone(),
        })?;
    Ok(Some(token.to_string()))
}

/// Why a performance model could not be built from its profile.
#[derive(Debug, thiserror::Error)]
pub enum ModelBuildError {
    /// The profile's data is not valid.
    #[error(transparent)]
    Profile(#[from] planner_core::profile::ProfileError),
    /// The profile's curves cannot be interpolated.
    #[error(transparent)]
    Interpolation(#[from] planner_core::interpolation::InterpolationError),
    /// The ConfigMap's entries are not a usable profile.
    #[error(transparent)]
    ConfigMap(#[from] planner_core::interpolation::ModelError),
}

/// Why the profile cannot be used; the message is shown in `ProfileLoaded`.
#[derive(Debug, thiserror::Error)]
pub enum ProfileLoadError {
    /// The spec names no profile.
    #[error("spec.profile is required in sla and observe modes: set builtin or configMapRef")]
    Missing,
    /// The ConfigMap does not exist.
    #[error("spec.profile.configMapRef: ConfigMap {0:?} does not exist in the policy's namespace")]
    NotFound(String),
    /// The ConfigMap cannot be read.
    #[error(transparent)]
    Read(#[from] KubeError),
    /// The data is not a usable profile.
    #[error("{0}")]
    Invalid(String),
}

/// Models built at once. Each build is CPU-bound (bounded by the profile caps of
/// `planner_core::profile`) and runs on the blocking pool, so the async runtime that serves the
/// webhook, renews the lease and answers `/healthz` never waits for one.
const MODEL_BUILDS: usize = 2;
/// Longest wait for one model build (a model at the caps builds in well under a second).
const MODEL_BUILD_TIMEOUT: Duration = Duration::from_secs(20);

/// Performance models by profile, shared by the policies that use the same one. A ConfigMap's
/// model is keyed by its resourceVersion, so an edit builds a new one; a deleted policy's
/// ConfigMap models go with the next edit of that ConfigMap (built-in ones are a fixed few).
/// A profile that fails to build is remembered too, so it is not rebuilt on every reconcile.
pub struct ModelCache {
    models: Mutex<HashMap<String, Result<Arc<PerformanceModel>, String>>>,
    builds: Arc<tokio::sync::Semaphore>,
    build_timeout: Duration,
}

impl Default for ModelCache {
    fn default() -> Self {
        Self {
            models: Mutex::default(),
            builds: Arc::new(tokio::sync::Semaphore::new(MODEL_BUILDS)),
            build_timeout: MODEL_BUILD_TIMEOUT,
        }
    }
}

impl ModelCache {
    /// The performance model of the policy's profile, and a description of its source.
    pub async fn model(
        &self,
        client: &Client,
        policy: &PlannerPolicy,
    ) -> Result<(Arc<PerformanceModel>, String), ProfileLoadError> {
        let Some(profile) = &policy.spec.profile else {
            return Err(ProfileLoadError::Missing);
        };
        if let Some(builtin) = profile.builtin {
            let name = builtin.name();
            let model = self
                .cached(
                    format!("builtin:{name}"),
                    move || -> Result<_, ModelBuildError> {
                        let profile = Profile::builtin(name)?;
                        Ok(PerformanceModel::new(&profile)?)
                    },
                )
                .await?;
            return Ok((model, format!("builtin {name}")));
        }
        let Some(reference) = &profile.config_map_ref else {
            return Err(ProfileLoadError::Missing);
        };
        let namespace = policy.namespace().unwrap_or_default();
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let cm = config_maps
            .get_opt(&reference.name)
            .await
            .map_err(KubeError::on(format!("read ConfigMap {}", reference.name)))?
            .ok_or_else(|| ProfileLoadError::NotFound(reference.name.clone()))?;
        let key = format!(
            "configmap:{namespace}/{}@{}",
            reference.name,
            cm.resource_version().unwrap_or_default()
        );
        let source = format!("ConfigMap {}", reference.name);
        let shown = source.clone();
        let model = self
            .cached(key, move || {
                PerformanceModel::from_config_map_entries(&shown, &config_map_entries(&cm))
                    .map_err(ModelBuildError::from)
            })
            .await?;
        Ok((model, source))
    }

    /// The model (or build error) cached under `key`, else built by `build` on the blocking pool
    /// (at most [`MODEL_BUILDS`] at once, each awaited for at most [`MODEL_BUILD_TIMEOUT`]).
    async fn cached<E: std::fmt::Display + Send + 'static>(
        &self,
        key: String,
        build: impl FnOnce() -> Result<PerformanceModel, E> + Send + 'static,
    ) -> Result<Arc<PerformanceModel>, ProfileLoadError> {
        let find = |key: &str| self.models.lock().ok().and_then(|m| m.get(key).cloned());
        if let Some(cached) = find(&key) {
            return cached.map_err(ProfileLoadError::Invalid);
        }
        // The semaphore is never closed; without a permit the build would only be unbounded.
        let permit = Arc::clone(&self.builds).acquire_owned().await.ok();
        if let Some(cached) = find(&key) {
            return cached.map_err(ProfileLoadError::Invalid);
        }
        // The permit goes with the build: a build that outlives the timeout still holds its slot
        // until it really ends, so timed-out builds never pile up on the blocking pool.
        let task = tokio::task::spawn_blocking(move || {
            let built = build().map_err(|e| e.to_string());
            drop(permit);
            built
        });
        let built = match tokio::time::timeout(self.build_timeout, task).await {
            Ok(Ok(built)) => built.map(Arc::new),
            Ok(Err(join)) => Err(format!("building the performance model failed: {join}")),
            Err(_) => Err(format!(
                "building the performance model took longer than {:?}; use a smaller profile",
                self.build_timeout
            )),
        };
        if let Ok(mut models) = self.models.lock() {
            // Older versions of the same ConfigMap are not needed any more.
            if let Some((prefix, _)) = key.split_once('@') {
                models.retain(|k, _| !k.starts_with(prefix));
            }
            models.insert(key, built.clone());
        }
        built.map_err(ProfileLoadError::Invalid)
    }
}

/// A ConfigMap's entries as the profile reader takes them, borrowed.
pub fn config_map_entries(cm: &ConfigMap) -> ConfigMapEntries<'_> {
    ConfigMapEntries {
        data: cm
            .data
            .iter()
            .flatten()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect(),
        binary_data: cm
            .binary_data
            .iter()
            .flatten()
            .map(|(key, value)| (key.as_str(), value.0.as_slice()))
            .collect(),
    }
}

/// Feeds the policy's warm-up trace, if any, to a new planner.
pub async fn warm_up(client: &Client, policy: &PlannerPolicy, planner: &mut SlaPlanner, interval: Duration) {
    let Some(warmup) = &policy.spec.predictor.warmup_trace else {
        return;
    };
    let namespace = policy.namespace().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let reference = &warmup.config_map_ref;
    let text = match config_maps.get_opt(&reference.name).await {
        Ok(Some(cm)) => cm.data.and_then(|mut d| d.remove(&reference.key)),
        Ok(None) => None,
        Err(error) => {
            warn!(error = %chain(&error), "cannot read the warm-up trace ConfigMap");
            None
        }
    };
    let Some(text) = text else {
        warn!(configmap = %reference.name, key = %reference.key, "warm-up trace not found; starting cold");
        return;
    };
    match trace::parse_mooncake_jsonl(&text) {
        Ok(records) => {
            let buckets = trace::bucketize(&records, interval.as_secs_f64());
            info!(
                intervals = buckets.len(),
                "warmed the predictors up from the trace"
            );
            planner.warm_up(&buckets);
        }
        Err(error) => warn!(%error, "the warm-up trace cannot be read; starting cold"),
    }
}

/// Replays recent intervals from Prometheus so a restart does not start the predictors cold.
pub async fn restore(
    client: &PrometheusClient,
    filter: &SeriesFilter,
    planner: &mut SlaPlanner,
    interval: Duration,
    now_unix_s: f64,
) {
    // End one interval ago: the current interval is observed by the first tick.
    let end = now_unix_s - interval.as_secs_f64();
    match client
        .history(filter, interval.as_secs().max(1), HISTORY_INTERVALS, end)
        .await
    {
        Ok(history) => {
            info!(
                intervals = history.len(),
                "restored predictor history from Prometheus"
            );
            planner.replay(&history);
        }
        Err(error) => info!(%error, "no Prometheus history to restore; starting cold"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A slow build leaves the (single-threaded) runtime free: a timer task keeps ticking while
    /// the model is built; concurrent requests for one key build it at most once per permit, and
    /// later ones reuse it.
    #[tokio::test(flavor = "current_thread")]
    async fn models_are_built_off_the_async_runtime() {
        let cache = ModelCache::default();
        let ticks = Arc::new(AtomicU32::new(0));
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let builds = Arc::new(AtomicU32::new(0));
        let build = |builds: Arc<AtomicU32>| {
            move || {
                builds.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(300));
                let profile = Profile::builtin("h200-llama3.1-8b-tp1").map_err(|e| e.to_string())?;
                PerformanceModel::new(&profile).map_err(|e| e.to_string())
            }
        };
        let (a, b) = tokio::join!(
            cache.cached("k".into(), build(Arc::clone(&builds))),
            cache.cached("k".into(), build(Arc::clone(&builds))),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(builds.load(Ordering::Relaxed) <= 2);
        let again = cache
            .cached("k".into(), build(Arc::clone(&builds)))
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&again, &a) || Arc::ptr_eq(&again, &b));
        assert!(builds.load(Ordering::Relaxed) <= 2);
        assert!(
            ticks.load(Ordering::Relaxed) >= 10,
            "the runtime was blocked: {} ticks",
            ticks.load(Ordering::Relaxed)
        );
        ticker.abort();
    }

    /// A build that outlives its timeout keeps its slot until it ends (the next build waits for
    /// it), and a failed build is remembered: the same key is not built again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timed_out_builds_keep_their_slot_and_failures_are_cached() {
        let cache = ModelCache {
            models: Mutex::default(),
            builds: Arc::new(tokio::sync::Semaphore::new(1)),
            build_timeout: Duration::from_millis(100),
        };
        let slow_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::clone(&slow_done);
        let slow = cache
            .cached("slow".into(), move || {
                std::thread::sleep(Duration::from_millis(600));
                done.store(true, Ordering::SeqCst);
                Err::<PerformanceModel, _>("never used")
            })
            .await;
        let message = slow.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("took longer than 100ms"), "{message}");
        assert!(
            !slow_done.load(Ordering::SeqCst),
            "the timeout came before the build ended"
        );

        let done = Arc::clone(&slow_done);
        let next = cache
            .cached("next".into(), move || {
                Err(format!(
                    "started after the slow build ended: {}",
                    done.load(Ordering::SeqCst)
                ))
            })
            .await;
        assert_eq!(
            next.err().map(|e| e.to_string()).as_deref(),
            Some("started after the slow build ended: true")
        );

        let builds = Arc::new(AtomicU32::new(0));
        for _ in 0..3 {
            let builds = Arc::clone(&builds);
            let bad = cache
                .cached("bad@1".into(), move || {
                    builds.fetch_add(1, Ordering::Relaxed);
                    Err::<PerformanceModel, _>("not a profile")
                })
                .await;
            assert_eq!(bad.err().map(|e| e.to_string()).as_deref(), Some("not a profile"));
        }
        assert_eq!(builds.load(Ordering::Relaxed), 1);
    }
}
