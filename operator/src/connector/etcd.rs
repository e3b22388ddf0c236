//! A small etcd v3 client over etcd's JSON gRPC gateway (`POST /v3/kv/range`, `/v3/kv/put`,
//! `/v3/kv/txn`; <https://etcd.io/docs/v3.5/dev-guide/api_grpc_gateway/>), which every etcd
//! v3.4+ serves on its client port. The virtual connector needs a handful of reads and one
//! transaction per decision; speaking JSON through the HTTP client the operator already has
//! avoids a gRPC stack and a `protoc` at build time. Keys and values travel base64-encoded, and
//! 64-bit integers as decimal strings, as the gateway writes them.

use std::time::Duration;

use base64::{Engine, engine::general_purpose::STANDARD as B64};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Value, json};

/// Longest response body read from etcd (a range over a few keys is a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint was given.
    #[error("no etcd endpoints")]
    NoEndpoints,
    /// An endpoint is not an `http://` or `https://` URL.
    #[error("etcd endpoint {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    /// Every endpoint failed; the last error is kept.
    #[error("etcd at {endpoints} did not answer")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The last endpoint's error.
        #[source]
        source: reqwest::Error,
    },
    /// etcd answered with an error status.
    #[error("etcd at {endpoint} answered {path} with HTTP {status}: {message}")]
    Status {
        /// The endpoint.
        endpoint: String,
        /// The API path.
        path: &'static str,
        /// The HTTP status.
        status: u16,
        /// etcd's error message, shortened.
        message: String,
    },
    /// The response was not what the gateway sends.
    #[error("etcd at {endpoint} sent an unreadable {path} response: {reason}")]
    Decode {
        /// The endpoint.
        endpoint: String,
        /// The API path.
        path: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// One key and its value as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The value's bytes.
    pub value: Vec<u8>,
    /// Revision of the last change of the key (0: the key does not exist).
    pub mod_revision: i64,
}

/// A client for a set of endpoints of one etcd cluster; endpoints are tried in order.
#[derive(Clone, Debug)]
pub struct EtcdClient {
    http: reqwest::Client,
    endpoints: Vec<String>,
}

#[derive(Deserialize)]
struct RangeResponse {
    #[serde(default)]
    kvs: Vec<RawKeyValue>,
}

#[derive(Deserialize)]
struct RawKeyValue {
    #[serde(default)]
    value: String,
    #[serde(default)]
    mod_revision: Option<String>,
}

#[derive(Deserialize)]
struct TxnResponse {
    #[serde(default)]
    succeeded: bool,
}

impl EtcdClient {
    /// A client for `endpoints` (`http://host:port`), each request bounded by `timeout`.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        let mut cleaned = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let trimmed = endpoint.trim_end_matches('/');
            if !(trimmed.starts_with("http://") || trimmed.starts_with("https://")) {
                return Err(EtcdError::BadEndpoint(endpoint.clone()));
            }
            cleaned.push(trimmed.to_string());
        }
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(EtcdError::Client)?;
        Ok(Self {
            http,
            endpoints: cleaned,
        })
    }

    /// The endpoints, comma-separated, for messages.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// Reads one key; `None` when it does not exist.
    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let (endpoint, response): (String, RangeResponse) = self
            .call("/v3/kv/range", &json!({ "key": B64.encode(key) }))
            .await?;
        let Some(raw) = response.kvs.into_iter().next() else {
            return Ok(None);
        };
        let decode = |reason: String| EtcdError::Decode {
            endpoint: endpoint.clone(),
            path: "/v3/kv/range",
            reason,
        };
        let value = B64
            .decode(raw.value.as_bytes())
            .map_err(|e| decode(format!("value is not base64: {e}")))?;
        let mod_revision = match raw.mod_revision {
            Some(text) => text
                .parse()
                .map_err(|_| decode(format!("mod_revision {text:?} is not a number")))?,
            None => 0,
        };
        Ok(Some(KeyValue { value, mod_revision }))
    }

    /// Writes one key.
    pub async fn put(&self, key: &str, value: &str) -> Result<(), EtcdError> {
        let _: (String, Value) = self
            .call(
                "/v3/kv/put",
                &json!({ "key": B64.encode(key), "value": B64.encode(value) }),
            )
            .await?;
        Ok(())
    }

    /// Writes every pair in one transaction if `guard`'s last change is still at `mod_revision`
    /// (0: the key must not exist); returns whether the transaction applied.
    pub async fn put_all_if_unchanged(
        &self,
        guard: &str,
        mod_revision: i64,
        pairs: &[(String, String)],
    ) -> Result<bool, EtcdError> {
        let puts: Vec<Value> = pairs
            .iter()
            .map(|(key, value)| json!({ "request_put": { "key": B64.encode(key), "value": B64.encode(value) } }))
            .collect();
        let body = json!({
            "compare": [{
                "key": B64.encode(guard),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": mod_revision.to_string(),
            }],
            "success": puts,
        });
        let (_, response): (String, TxnResponse) = self.call("/v3/kv/txn", &body).await?;
        Ok(response.succeeded)
    }

    /// POSTs `body` to `path` on the first endpoint that answers; returns that endpoint and the
    /// decoded response.
    async fn call<T: DeserializeOwned>(
        &self,
        path: &'static str,
        body: &Value,
    ) -> Result<(String, T), EtcdError> {
        let mut last = None;
        for endpoint in &self.endpoints {
            let response = match self
                .http
                .post(format!("{endpoint}{path}"))
                .json(body)
                .send()
                .await
            {
                Ok(response) => response,
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            let status = response.status();
            let bytes = read_capped(response).await.map_err(|error| EtcdError::Decode {
                endpoint: endpoint.clone(),
                path,
                reason: error.to_string(),
            })?;
            if !status.is_success() {
                let message: String = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned())
                    .chars()
                    .take(200)
                    .collect();
                return Err(EtcdError::Status {
                    endpoint: endpoint.clone(),
                    path,
                    status: status.as_u16(),
                    message,
                });
            }
            let decoded = serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
                endpoint: endpoint.clone(),
                path,
                reason: e.to_string(),
            })?;
            return Ok((endpoint.clone(), decoded));
        }
        match last {
            Some(source) => Err(EtcdError::Unreachable {
                endpoints: self.endpoints(),
                source,
            }),
            None => Err(EtcdError::NoEndpoints),
        }
    }
}

/// Why a response body was not read whole.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    /// The connection failed.
    #[error("{0}")]
    Read(reqwest::Error),
    /// Longer than [`MAX_BODY`].
    #[error("response larger than {MAX_BODY} bytes")]
    TooLarge,
}

/// Reads a response body up to [`MAX_BODY`] bytes.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn endpoints_must_be_http_urls() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let timeout = Duration::from_secs(1);
        assert!(matches!(
            EtcdClient::new(&[], timeout),
            Err(EtcdError::NoEndpoints)
        ));
        assert!(matches!(
            EtcdClient::new(&["127.0.0.1:2379".into()], timeout),
            Err(EtcdError::BadEndpoint(_))
        ));
        let client = EtcdClient::new(&["http://a:2379/".into(), "https://b:2379".into()], timeout).unwrap();
        assert_eq!(client.endpoints(), "http://a:2379,https://b:2379");
    }

    #[test]
    fn range_responses_decode_as_the_gateway_writes_them() {
        let text = r#"{"header":{"revision":"7"},"kvs":[{"key":"YQ==","value":"NDI=","mod_revision":"5","create_revision":"3","version":"2"}],"count":"1"}"#;
        let response: RangeResponse = serde_json::from_str(text).unwrap();
        assert_eq!(response.kvs.len(), 1);
        assert_eq!(B64.decode(&response.kvs[0].value).unwrap(), b"42");
        assert_eq!(response.kvs[0].mod_revision.as_deref(), Some("5"));
        let empty: RangeResponse = serde_json::from_str(r#"{"header":{}}"#).unwrap();
        assert!(empty.kvs.is_empty());
        let txn: TxnResponse =
            serde_json::from_str(r#"{"header":{},"succeeded":true,"responses":[]}"#).unwrap();
        assert!(txn.succeeded);
        let failed: TxnResponse = serde_json::from_str(r#"{"header":{},"responses":[]}"#).unwrap();
        assert!(!failed.succeeded);
    }
}
