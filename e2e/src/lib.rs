//! Helpers for the end-to-end tests, which run against whatever cluster `KUBECONFIG` names (the
//! local control plane of `make cluster-up`, or kind): a namespace per test that is dumped when
//! the test fails and deleted afterwards, installing the generated CRDs, waiting for a condition
//! with a timeout, and admission checks (`accepts` / `rejects`) through the real API server.

use std::{
    fmt::Debug,
    future::Future,
    hash::{BuildHasher, RandomState},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::FutureExt;
use k8s_openapi::{
    api::core::v1::{Event, Namespace, ServiceAccount},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::{GroupVersionKind, Request, Status},
    discovery::{self, Discovery, Scope, verbs},
    runtime::wait::{Condition, await_condition, conditions},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub mod chart;
pub mod dynamo;
pub mod dynamo_runtime;
pub mod upstream;

/// Errors of the helpers and of tests that use `?`.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager of everything the tests write.
pub const FIELD_MANAGER: &str = "planner-operator-e2e";

/// Set (to anything) to keep each test's namespace for inspection instead of deleting it.
pub const KEEP_NAMESPACE_ENV: &str = "E2E_KEEP_NAMESPACE";

/// A client for the cluster `KUBECONFIG` names (or the in-cluster config).
pub async fn client() -> Result<Client> {
    Client::try_default()
        .await
        .map_err(|e| format!("no cluster to test against (is KUBECONFIG set? `make cluster-up`): {e}").into())
}

/// The repository root (the parent of the `e2e` crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The debug `planner-operator` binary `make e2e` builds, in `CARGO_TARGET_DIR` when set.
pub fn operator_binary() -> PathBuf {
    debug_binary("planner-operator")
}

/// The debug `planner-sim` binary (the synthetic frontend) `make e2e` builds.
pub fn sim_binary() -> PathBuf {
    debug_binary("planner-sim")
}

fn debug_binary(name: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("debug")
        .join(name)
}

/// Every `*.yaml` file of a folder, sorted by name.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The YAML documents of a file, as JSON; empty documents are skipped.
pub fn load_yaml(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut docs = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| format!("{} is not valid YAML: {e}", path.display()))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// What a bad fixture (`operator/tests/fixtures/invalid/`) must be rejected for: its
/// `# field:` and `# reason:` header lines.
#[derive(Debug, Clone)]
pub struct Expectation {
    pub field: String,
    pub reason: String,
}

pub fn expectation(path: &Path) -> Result<Expectation> {
    let text = std::fs::read_to_string(path)?;
    let header = |name: &str| -> Result<String> {
        let prefix = format!("# {name}:");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix).map(|v| v.trim().to_string()))
            .ok_or_else(|| format!("{} has no `{prefix}` line", path.display()).into())
    };
    Ok(Expectation {
        field: header("field")?,
        reason: header("reason")?,
    })
}

/// Waits until `condition` holds for the object `name`, for at most `timeout`. Returns the object
/// that satisfied it (`None` when the condition was met by the object being gone).
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    condition: impl Condition<K>,
    timeout: Duration,
) -> Result<Option<K>>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(format!(
            "timed out after {timeout:?} waiting for {} {name}",
            short_type_name::<K>()
        )
        .into()),
    }
}

/// Polls `check` every half second until it returns `true`, for at most `timeout`; for
/// conditions over several objects, where `wait_for` (one object) does not fit.
pub async fn poll_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_error = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            let detail = last_error
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            return Err(format!("timed out after {timeout:?} waiting for {what}{detail}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn short_type_name<K>() -> &'static str {
    let name = std::any::type_name::<K>();
    name.rsplit("::").next().unwrap_or(name)
}

/// Applies every CRD of `config/crd/` (this operator's) and today's Grove topology CRD (from
/// `../shared/upstream/grove/`, see [`upstream::grove_crds`]) server-side (the DGD CRD is too large
/// for a client-side apply's annotation) and waits until each is Established. Idempotent, so every
/// test that needs the CRDs calls it. Returns the CRD names.
pub async fn install_crds(client: &Client) -> Result<Vec<String>> {
    let mut files = yaml_files(&repo_root().join("config/crd"))?;
    files.extend(upstream::grove_crds()?);
    apply_crds(client, &files).await
}

/// Applies the CRDs of `files` server-side under the tests' field manager (so a CRD of the same
/// name applied before is replaced, field for field) and waits until each is Established.
/// Returns the CRD names.
pub async fn apply_crds(client: &Client, files: &[PathBuf]) -> Result<Vec<String>> {
    let mut crds = Vec::new();
    for path in files {
        for crd in load_yaml(path)? {
            crds.push((path.display().to_string(), crd));
        }
    }
    apply_crd_objects(client, &crds).await
}

/// Applies CRDs given as `(where from, object)` as [`apply_crds`] does.
pub async fn apply_crd_objects(client: &Client, crds: &[(String, Value)]) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force().validation_strict();
    let mut names = Vec::new();
    for (origin, crd) in crds {
        let name = crd["metadata"]["name"]
            .as_str()
            .ok_or_else(|| format!("{origin}: CRD without metadata.name"))?
            .to_string();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| format!("applying {origin}: {e}"))?;
        names.push(name);
    }
    for name in &names {
        wait_for(
            &api,
            name,
            conditions::is_crd_established(),
            Duration::from_secs(60),
        )
        .await?;
    }
    // Established is not yet served: after a CRD of the same name was deleted and created again,
    // API discovery lags for a moment. Wait until every served version lists the resource.
    for (_, crd) in crds {
        let (Some(group), Some(plural)) = (
            crd["spec"]["group"].as_str(),
            crd["spec"]["names"]["plural"].as_str(),
        ) else {
            continue;
        };
        let served = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str());
        for version in served {
            let group_version = format!("{group}/{version}");
            poll_until(
                &format!("{plural} to be served at {group_version}"),
                Duration::from_secs(60),
                || async {
                    Ok(match client.list_api_group_resources(&group_version).await {
                        Ok(list) => list.resources.iter().any(|r| r.name == plural),
                        Err(_) => false,
                    })
                },
            )
            .await?;
        }
    }
    Ok(names)
}

/// A namespace of its own for one test; see [`in_namespace`].
#[derive(Clone)]
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

/// Held shared by every [`in_namespace`] test and exclusively by [`in_namespace_exclusive`] ones:
/// a test that runs a cluster-wide operator (it reconciles every namespace's DGDs) must not
/// overlap with tests that run their own operator or expect nobody to touch their objects.
static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Runs a test body in a fresh namespace (`e2e-<test>-<random>`). When the body fails or panics,
/// the namespace's objects and events are printed; then the namespace is deleted, unless
/// `E2E_KEEP_NAMESPACE` is set. The body's error or panic is passed on. Runs alongside other
/// `in_namespace` tests, never alongside an [`in_namespace_exclusive`] one.
pub async fn in_namespace<F, Fut>(test: &str, body: F) -> Result<()>
where
    F: FnOnce(TestNamespace) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let _shared = CLUSTER.read().await;
    run_in_namespace(test, body).await
}

/// [`in_namespace`] for a test that acts on the whole cluster (a cluster-wide operator): it waits
/// until no other `in_namespace` test runs, and they wait for it.
pub async fn in_namespace_exclusive<F, Fut>(test: &str, body: F) -> Result<()>
where
    F: FnOnce(TestNamespace) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let _exclusive = CLUSTER.write().await;
    run_in_namespace(test, body).await
}

async fn run_in_namespace<F, Fut>(test: &str, body: F) -> Result<()>
where
    F: FnOnce(TestNamespace) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let namespace = TestNamespace::create(client().await?, test).await?;
    let outcome = AssertUnwindSafe(body(namespace.clone())).catch_unwind().await;
    if !matches!(outcome, Ok(Ok(()))) {
        namespace.dump().await;
    }
    if std::env::var_os(KEEP_NAMESPACE_ENV).is_some() {
        eprintln!(
            "{KEEP_NAMESPACE_ENV} is set: keeping namespace {}",
            namespace.name
        );
    } else if let Err(e) = namespace.delete().await {
        eprintln!("could not delete namespace {}: {e}", namespace.name);
    }
    match outcome {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A random lowercase suffix, unique enough for namespace names of concurrent tests.
pub(crate) fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let seed = (nanos, std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut n = RandomState::new().hash_one(seed);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..6)
        .map(|_| {
            let c = alphabet[(n % 36) as usize] as char;
            n /= 36;
            c
        })
        .collect()
}

impl TestNamespace {
    /// Creates the namespace and waits for its `default` service account, without which the
    /// ServiceAccount admission plugin rejects pods.
    pub async fn create(client: Client, test: &str) -> Result<Self> {
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let name = format!("e2e-{}-{}", slug.trim_matches('-'), random_suffix());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"planner-operator.dev/e2e": "true"}}
        }))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| format!("creating namespace {name}: {e}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_for(
            &accounts,
            "default",
            conditions::is_created(),
            Duration::from_secs(60),
        )
        .await?;
        Ok(Self { client, name })
    }

    pub async fn delete(&self) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces.delete(&self.name, &DeleteParams::background()).await?;
        Ok(())
    }

    /// The Events (`events.k8s.io/v1`) in this namespace.
    pub async fn events(&self) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
        let events: Api<k8s_openapi::api::events::v1::Event> = self.api();
        Ok(events.list(&ListParams::default()).await?.items)
    }

    /// A typed API for this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates `object` (YAML/JSON of any kind the server serves) with strict field validation and
    /// returns what the server stored. Namespaced objects are created in this namespace;
    /// cluster-scoped ones are only dry-run, so that tests leave nothing outside their namespace.
    pub async fn accepts(&self, object: &Value) -> Result<DynamicObject> {
        let describe = describe(object);
        self.create_strict(object, false)
            .await?
            .map_err(|status| format!("{describe} was rejected: {}", status.message).into())
    }

    /// Asserts that the API server rejects `object` with a message that contains `reason`, and
    /// returns the rejection. Always a dry run: an object the server wrongly accepts is not
    /// stored, so it cannot disturb the next check.
    pub async fn rejects(&self, object: &Value, reason: &str) -> Result<Status> {
        let describe = describe(object);
        match self.create_strict(object, true).await? {
            Ok(_) => {
                Err(format!("{describe} was accepted; expected a rejection containing {reason:?}").into())
            }
            Err(status) if status.message.contains(reason) => Ok(*status),
            Err(status) => Err(format!(
                "{describe} was rejected, but the message does not contain {reason:?}: {}",
                status.message
            )
            .into()),
        }
    }

    /// `POST` with `fieldValidation=Strict` (kube's `PostParams` has no such field, so the query
    /// parameter is added to the request). `Ok(Err(status))` is the API server's rejection;
    /// `Err` is anything else (no such kind, transport).
    async fn create_strict(
        &self,
        object: &Value,
        dry_run: bool,
    ) -> Result<Result<DynamicObject, Box<Status>>> {
        let api_version = object["apiVersion"].as_str().ok_or("object has no apiVersion")?;
        let kind = object["kind"].as_str().ok_or("object has no kind")?;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| format!("the server does not serve {api_version} {kind}: {e}"))?;
        let mut object = object.clone();
        // Cluster-scoped objects are never stored (see `accepts`).
        let (api, dry_run): (Api<DynamicObject>, bool) = if capabilities.scope == Scope::Namespaced {
            object["metadata"]["namespace"] = json!(self.name);
            (
                Api::namespaced_with(self.client.clone(), &self.name, &resource),
                dry_run,
            )
        } else {
            (Api::all_with(self.client.clone(), &resource), true)
        };
        let params = PostParams {
            dry_run,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let mut request = Request::new(api.resource_url()).create(&params, serde_json::to_vec(&object)?)?;
        let uri = format!("{}&fieldValidation=Strict", request.uri());
        *request.uri_mut() = uri.parse()?;
        match self.client.request::<DynamicObject>(request).await {
            Ok(created) => Ok(Ok(created)),
            Err(kube::Error::Api(status)) => Ok(Err(status)),
            Err(other) => Err(other.into()),
        }
    }

    /// Prints every object of the namespace (all listable namespaced kinds, managed fields left
    /// out) and its events, oldest first, to stderr. Errors are printed, not returned: this runs
    /// when a test has already failed.
    pub async fn dump(&self) {
        eprintln!("\n===== namespace {} at the failure =====", self.name);
        if let Err(e) = self.dump_objects().await {
            eprintln!("(listing objects failed: {e})");
        }
        if let Err(e) = self.dump_events().await {
            eprintln!("(listing events failed: {e})");
        }
        eprintln!("===== end of namespace {} =====\n", self.name);
    }

    async fn dump_objects(&self) -> Result<()> {
        let discovery = Discovery::new(self.client.clone()).run().await?;
        for group in discovery.groups() {
            for (resource, capabilities) in group.recommended_resources() {
                if capabilities.scope != Scope::Namespaced
                    || !capabilities.supports_operation(verbs::LIST)
                    || resource.kind == "Event"
                {
                    continue;
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), &self.name, &resource);
                let list = match api.list(&ListParams::default()).await {
                    Ok(list) => list,
                    Err(e) => {
                        eprintln!("(cannot list {}: {e})", resource.plural);
                        continue;
                    }
                };
                for mut object in list.items {
                    object.metadata.managed_fields = None;
                    eprintln!(
                        "--- {} {}/{}",
                        resource.api_version,
                        resource.kind,
                        object.metadata.name.as_deref().unwrap_or("?")
                    );
                    match serde_yaml::to_string(&object) {
                        Ok(yaml) => eprint!("{yaml}"),
                        Err(e) => eprintln!("(cannot print: {e})"),
                    }
                }
            }
        }
        Ok(())
    }

    async fn dump_events(&self) -> Result<()> {
        let events: Api<Event> = self.api();
        let mut list = events.list(&ListParams::default()).await?.items;
        list.sort_by_key(|e| {
            e.last_timestamp
                .clone()
                .or_else(|| e.first_timestamp.clone())
                .map(|t| t.0)
        });
        eprintln!("--- events ({})", list.len());
        for event in list {
            eprintln!(
                "{} {} {} {}/{}: {}",
                event.last_timestamp.map(|t| t.0.to_string()).unwrap_or_default(),
                event.type_.unwrap_or_default(),
                event.reason.unwrap_or_default(),
                event.involved_object.kind.unwrap_or_default(),
                event.involved_object.name.unwrap_or_default(),
                event.message.unwrap_or_default()
            );
        }
        Ok(())
    }
}

/// `Kind name` of an object, for messages.
pub fn describe(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// `GET http://<addr><path>` over plain HTTP/1.0; the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", response.lines().next()))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
