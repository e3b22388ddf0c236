//! The virtual connector against a real etcd (the one `make tools` builds), with this test
//! playing the external orchestrator: decisions are written under `v1/<ns>/planner/`, a new one
//! waits for `scaled_decision_id`, and the protocol state survives a reconnect.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use e2e::{Result, poll_until};
use planner_operator::connector::{
    etcd::EtcdClient,
    virtual_etcd::{Published, VirtualConnector, VirtualError},
};

struct Etcd {
    child: Child,
    endpoint: String,
    _data: tempdir::Dir,
}

mod tempdir {
    /// A temporary directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

async fn start_etcd() -> Result<Etcd> {
    let (client, peer) = (free_port(), free_port());
    let data = std::env::temp_dir().join(format!("e2e-etcd-{}-{client}", std::process::id()));
    start_etcd_at(client, peer, data).await
}

/// An etcd on these ports and data directory (a restart keeps its keys).
async fn start_etcd_at(client: u16, peer: u16, data: std::path::PathBuf) -> Result<Etcd> {
    let endpoint = format!("http://127.0.0.1:{client}");
    let child = Command::new("etcd")
        .args([
            "--name=e2e",
            &format!("--data-dir={}", data.display()),
            &format!("--listen-client-urls={endpoint}"),
            &format!("--advertise-client-urls={endpoint}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-cluster=e2e=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("cannot start etcd (is the tools bin on PATH? `eval \"$(make -s cluster-up)\"`): {e}")
        })?;
    let etcd = Etcd {
        child,
        endpoint: endpoint.clone(),
        _data: tempdir::Dir(data),
    };
    poll_until("etcd to answer", Duration::from_secs(30), || {
        let endpoint = endpoint.clone();
        async move {
            let Ok(client) = EtcdClient::new(&[endpoint], Duration::from_secs(2)) else {
                return Ok(false);
            };
            Ok(client.get("probe").await.is_ok())
        }
    })
    .await?;
    Ok(etcd)
}

/// A connector as a policy with `connector.dynamoNamespace: e2e-dynamo` and
/// `decisionTimeout: 3s` gets it.
async fn connect(endpoint: &str) -> Result<VirtualConnector> {
    Ok(VirtualConnector::connect(
        &[endpoint.to_string()],
        "e2e-dynamo",
        Duration::from_secs(3),
        Duration::from_secs(10),
    )
    .await?)
}

async fn read(client: &mut EtcdClient, key: &str) -> Result<Option<String>> {
    let value = client.get(&format!("v1/e2e-dynamo/planner/{key}")).await?;
    Ok(value.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_connector_publishes_decisions_and_waits_for_the_orchestrator() -> Result<()> {
    let etcd = start_etcd().await?;
    let mut orchestrator = EtcdClient::new(std::slice::from_ref(&etcd.endpoint), Duration::from_secs(10))?;

    let mut connector = connect(&etcd.endpoint).await?;
    assert_eq!(connector.prefix(), "v1/e2e-dynamo/planner/");
    assert_eq!(connector.publish(1, 2).await?, Published::Decision(0));
    assert_eq!(
        read(&mut orchestrator, "num_prefill_workers").await?.as_deref(),
        Some("1")
    );
    assert_eq!(
        read(&mut orchestrator, "num_decode_workers").await?.as_deref(),
        Some("2")
    );
    assert_eq!(
        read(&mut orchestrator, "decision_id").await?.as_deref(),
        Some("0")
    );

    // Same counts: nothing new. New counts before the acknowledgement: wait.
    assert_eq!(connector.publish(1, 2).await?, Published::Unchanged);
    assert_eq!(
        connector.publish(3, 2).await?,
        Published::Waiting { decision_id: 0 }
    );

    // The orchestrator carries decision 0 out; the next decision goes through with id 1.
    orchestrator
        .put("v1/e2e-dynamo/planner/scaled_decision_id", "0")
        .await?;
    assert_eq!(connector.publish(3, 2).await?, Published::Decision(1));
    assert_eq!(
        read(&mut orchestrator, "num_prefill_workers").await?.as_deref(),
        Some("3")
    );

    // A planner that restarts picks the protocol state up from etcd.
    let mut restarted = connect(&etcd.endpoint).await?;
    assert_eq!(restarted.publish(3, 2).await?, Published::Unchanged);
    // Unacknowledged decision 1: held back until the 3 s timeout, then published anyway.
    assert_eq!(
        restarted.publish(4, 4).await?,
        Published::Waiting { decision_id: 1 }
    );
    let held_since = std::time::Instant::now();
    let mut published = restarted.publish(4, 4).await?;
    while published == (Published::Waiting { decision_id: 1 })
        && held_since.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
        published = restarted.publish(4, 4).await?;
    }
    assert_eq!(published, Published::Decision(2));
    assert!(
        held_since.elapsed() >= Duration::from_secs(2),
        "published after {:?}, before the 3 s timeout",
        held_since.elapsed()
    );
    assert_eq!(
        read(&mut orchestrator, "decision_id").await?.as_deref(),
        Some("2")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_and_back_and_a_concurrent_writer() -> Result<()> {
    let (client_port, peer_port) = (free_port(), free_port());
    let data = std::env::temp_dir().join(format!("e2e-etcd-outage-{}-{client_port}", std::process::id()));
    let mut etcd = start_etcd_at(client_port, peer_port, data.clone()).await?;
    let endpoint = etcd.endpoint.clone();
    let orchestrator = EtcdClient::new(std::slice::from_ref(&endpoint), Duration::from_secs(10))?;
    let short = |endpoint: String| async move {
        VirtualConnector::connect(
            &[endpoint],
            "e2e-outage",
            Duration::from_secs(3600),
            Duration::from_secs(2),
        )
        .await
    };
    let mut connector = short(endpoint.clone()).await?;
    assert_eq!(connector.publish(1, 1).await?, Published::Decision(0));

    // etcd down: a bounded error, no panic, nothing half-written.
    let _ = etcd.child.kill();
    let _ = etcd.child.wait();
    let started = std::time::Instant::now();
    assert!(connector.publish(2, 2).await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    // Back, with its data: the protocol state is where it was.
    std::mem::forget(etcd); // its data directory must survive the restart
    let etcd = start_etcd_at(client_port, peer_port, data).await?;
    orchestrator
        .put("v1/e2e-outage/planner/scaled_decision_id", "0")
        .await?;
    let mut connector = short(endpoint.clone()).await?;
    assert_eq!(connector.publish(2, 2).await?, Published::Decision(1));

    // Two writers with the same view: the second's transaction fails (no lost update), and it
    // publishes after reloading what etcd holds.
    orchestrator
        .put("v1/e2e-outage/planner/scaled_decision_id", "1")
        .await?;
    let mut first = short(endpoint.clone()).await?;
    let mut second = short(endpoint.clone()).await?;
    assert_eq!(first.publish(4, 4).await?, Published::Decision(2));
    let conflict = second.publish(5, 5).await;
    assert!(
        matches!(conflict, Err(VirtualError::Conflict { .. })),
        "{conflict:?}"
    );
    orchestrator
        .put("v1/e2e-outage/planner/scaled_decision_id", "2")
        .await?;
    assert_eq!(second.publish(5, 5).await?, Published::Decision(3));
    let held = |key: &'static str| {
        let orchestrator = &orchestrator;
        async move {
            let kv = orchestrator.get(&format!("v1/e2e-outage/planner/{key}")).await?;
            Result::<Option<String>>::Ok(kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
        }
    };
    assert_eq!(held("decision_id").await?.as_deref(), Some("3"));
    assert_eq!(held("num_prefill_workers").await?.as_deref(), Some("5"));
    assert_eq!(held("num_decode_workers").await?.as_deref(), Some("5"));
    drop(etcd);
    Ok(())
}
