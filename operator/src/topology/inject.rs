//! What a resolved topology adds to pod templates: router env on the frontend; topology env, a
//! Downward API volume and the label-copy annotation on workers.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, ObjectFieldSelector,
        PodTemplateSpec, Volume, VolumeMount,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    DYNAMO_OWNED_ENV, ENV_DYN_KV_TRANSFER_DOMAIN, ENV_DYN_KV_TRANSFER_ENFORCEMENT,
    ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT, ENV_DYN_MOUNT_PATH, ENV_LEVEL, ENV_MISMATCH_POLICY,
    ENV_TOPOLOGY_ENABLED, ENV_WEIGHT, EnvContract, LABELS_ANNOTATION, MOUNT_PATH, OWNED_ENV,
    ResolvedTopology, VOLUME_NAME,
};
use planner_api::{ComponentType, Enforcement, MismatchPolicy};

fn var(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// Env of worker-class main containers. The released Dynamo runtime's contract (see
/// [`EnvContract::Dynamo`]): topology on, where the files are, the domain, `required` or
/// `preferred`, and the preferred weight when set. This operator's first contract: topology on,
/// and the level.
pub fn worker_env(topology: &ResolvedTopology) -> Vec<EnvVar> {
    match topology.contract {
        EnvContract::Planner => vec![
            var(ENV_TOPOLOGY_ENABLED, "true".into()),
            var(ENV_LEVEL, topology.level.clone()),
        ],
        EnvContract::Dynamo => {
            let preferred = topology.enforcement == Enforcement::Preferred;
            let mut env = vec![
                var(ENV_TOPOLOGY_ENABLED, "true".into()),
                var(ENV_DYN_MOUNT_PATH, topology.contract.mount_path().into()),
                var(ENV_DYN_KV_TRANSFER_DOMAIN, topology.level.clone()),
                var(
                    ENV_DYN_KV_TRANSFER_ENFORCEMENT,
                    topology.enforcement.as_str().into(),
                ),
            ];
            if let (true, Some(weight)) = (preferred, topology.weight) {
                env.push(var(ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT, weight.to_string()));
            }
            env
        }
    }
}

/// Env of the frontend's main container: the level, the mismatch policy and, when set, the
/// transfer weight. Empty in the released runtime's contract, whose router reads the policy the
/// workers publish.
pub fn frontend_env(topology: &ResolvedTopology) -> Vec<EnvVar> {
    if topology.contract == EnvContract::Dynamo {
        return Vec::new();
    }
    let mut env = vec![
        var(ENV_LEVEL, topology.level.clone()),
        var(
            ENV_MISMATCH_POLICY,
            MismatchPolicy::from(topology.enforcement).as_str().into(),
        ),
    ];
    if let Some(weight) = topology.weight {
        env.push(var(ENV_WEIGHT, weight.to_string()));
    }
    env
}

/// The Downward API volume of worker pods: one file per level, named by the domain, holding the
/// pod's value of the level's label (empty until the label is set).
pub fn volume(topology: &ResolvedTopology) -> Volume {
    Volume {
        name: VOLUME_NAME.into(),
        downward_api: Some(DownwardAPIVolumeSource {
            default_mode: None,
            items: Some(
                topology
                    .labels
                    .iter()
                    .map(|label| DownwardAPIVolumeFile {
                        path: label.domain.clone(),
                        field_ref: Some(ObjectFieldSelector {
                            api_version: Some("v1".into()),
                            field_path: format!("metadata.labels['{}']", label.pod_label),
                        }),
                        mode: None,
                        resource_field_ref: None,
                    })
                    .collect(),
            ),
        }),
        ..Volume::default()
    }
}

/// The read-only mount of [`volume`] in the worker's main container, at [`MOUNT_PATH`].
pub fn volume_mount() -> VolumeMount {
    volume_mount_at(MOUNT_PATH)
}

/// The read-only mount of [`volume`] at `path`.
pub fn volume_mount_at(path: &str) -> VolumeMount {
    VolumeMount {
        name: VOLUME_NAME.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// Value of [`LABELS_ANNOTATION`]: `<pod label>=<node label>` pairs, comma-separated.
pub fn labels_annotation(topology: &ResolvedTopology) -> String {
    topology
        .labels
        .iter()
        .map(|l| format!("{}={}", l.pod_label, l.node_label))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses [`LABELS_ANNOTATION`] into `(pod label, node label)` pairs; malformed entries are
/// skipped (label keys contain neither `=` nor `,`).
pub fn parse_labels_annotation(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(pod, node)| (pod.trim().to_string(), node.trim().to_string()))
        .filter(|(pod, node)| !pod.is_empty() && !node.is_empty())
        .collect()
}

/// Adds what a component of type `kind` needs to its pod template. Worker-class components get
/// the topology env, volume, mount and label annotation; the frontends that route by `topology`
/// get the router env (none under the released runtime's contract); others are left alone. In the components it injects into, user copies of
/// the operator's variables, a volume named [`VOLUME_NAME`] and mounts of that name or at the
/// contract's mount path are replaced. Does nothing when the template has no container
/// `main_name`.
pub fn inject(
    kind: Option<ComponentType>,
    component: &str,
    template: &mut PodTemplateSpec,
    main_name: &str,
    topology: &ResolvedTopology,
) {
    let is_worker = kind.is_some_and(ComponentType::is_worker);
    let is_frontend = kind == Some(ComponentType::Frontend) && topology.routes(component);
    if !is_worker && !is_frontend {
        return;
    }
    let Some(spec) = template.spec.as_mut() else {
        return;
    };
    let Some(main) = spec.containers.iter_mut().find(|c| c.name == main_name) else {
        return;
    };
    let env = if is_worker {
        worker_env(topology)
    } else {
        frontend_env(topology)
    };
    set_env(main, env, topology.contract);
    if !is_worker {
        return;
    }
    let path = topology.contract.mount_path();
    let mounts = main.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.name != VOLUME_NAME && m.mount_path.trim_end_matches('/') != path);
    mounts.push(volume_mount_at(path));
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != VOLUME_NAME);
    volumes.push(volume(topology));
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(LABELS_ANNOTATION.into(), labels_annotation(topology));
}

/// Removes every operator-owned variable from the container's env (in the released runtime's
/// contract, its variables too), then appends `env`.
fn set_env(container: &mut Container, env: Vec<EnvVar>, contract: EnvContract) {
    let list = container.env.get_or_insert_with(Vec::new);
    list.retain(|e| {
        let name = e.name.as_str();
        !OWNED_ENV.contains(&name) && (contract == EnvContract::Planner || !DYNAMO_OWNED_ENV.contains(&name))
    });
    list.extend(env);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::topology::{DYNAMO_MOUNT_PATH, LabelSource, TopologyLabel};

    fn topology() -> ResolvedTopology {
        ResolvedTopology {
            frontend: Some("frontend".into()),
            level: "zone".into(),
            enforcement: Enforcement::Preferred,
            weight: Some(50.0),
            source: LabelSource::ClusterTopology("gpu".into()),
            labels: vec![
                TopologyLabel {
                    domain: "zone".into(),
                    pod_label: "nvidia.com/dynamo-topology.zone".into(),
                    node_label: "topology.kubernetes.io/zone".into(),
                },
                TopologyLabel {
                    domain: "rack".into(),
                    pod_label: "nvidia.com/dynamo-topology.rack".into(),
                    node_label: "nvidia.com/rack".into(),
                },
            ],
            contract: EnvContract::Planner,
        }
    }

    fn template(env: &[(&str, &str)]) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "main".into(),
                        env: Some(env.iter().map(|(n, v)| var(n, (*v).into())).collect()),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "old".into(),
                            mount_path: "/etc/podinfo/topology/".into(),
                            ..VolumeMount::default()
                        }]),
                        ..Container::default()
                    },
                    Container {
                        name: "sidecar".into(),
                        ..Container::default()
                    },
                ],
                ..PodSpec::default()
            }),
        }
    }

    fn env_of(template: &PodTemplateSpec) -> Vec<(String, String)> {
        template.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn workers_get_env_volume_mount_and_annotation() {
        let mut t = template(&[("A", "1"), (ENV_LEVEL, "rack"), (ENV_TOPOLOGY_ENABLED, "false")]);
        inject(Some(ComponentType::Decode), "decode", &mut t, "main", &topology());
        assert_eq!(
            env_of(&t),
            [
                ("A".to_string(), "1".to_string()),
                (ENV_TOPOLOGY_ENABLED.into(), "true".into()),
                (ENV_LEVEL.into(), "zone".into()),
            ]
        );
        let spec = t.spec.as_ref().unwrap();
        assert_eq!(spec.containers[0].volume_mounts, Some(vec![volume_mount()]));
        assert!(spec.containers[1].env.is_none(), "sidecars are left alone");
        let volume = &spec.volumes.as_ref().unwrap()[0];
        let items = volume.downward_api.as_ref().unwrap().items.as_ref().unwrap();
        let items: Vec<(&str, &str)> = items
            .iter()
            .map(|i| (i.path.as_str(), i.field_ref.as_ref().unwrap().field_path.as_str()))
            .collect();
        assert_eq!(
            items,
            [
                ("zone", "metadata.labels['nvidia.com/dynamo-topology.zone']"),
                ("rack", "metadata.labels['nvidia.com/dynamo-topology.rack']"),
            ]
        );
        let annotations = t.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(
            annotations[LABELS_ANNOTATION],
            "nvidia.com/dynamo-topology.zone=topology.kubernetes.io/zone,nvidia.com/dynamo-topology.rack=nvidia.com/rack"
        );
        assert_eq!(
            parse_labels_annotation(&annotations[LABELS_ANNOTATION]),
            [
                (
                    "nvidia.com/dynamo-topology.zone".to_string(),
                    "topology.kubernetes.io/zone".to_string()
                ),
                ("nvidia.com/dynamo-topology.rack".into(), "nvidia.com/rack".into()),
            ]
        );
    }

    #[test]
    fn the_frontend_gets_router_env_and_user_copies_are_replaced() {
        let mut t = template(&[(ENV_MISMATCH_POLICY, "fail"), ("B", "2"), (ENV_WEIGHT, "1")]);
        inject(
            Some(ComponentType::Frontend),
            "frontend",
            &mut t,
            "main",
            &topology(),
        );
        assert_eq!(
            env_of(&t),
            [
                ("B".to_string(), "2".to_string()),
                (ENV_LEVEL.into(), "zone".into()),
                (ENV_MISMATCH_POLICY.into(), "fallback".into()),
                (ENV_WEIGHT.into(), "50".into()),
            ]
        );
        assert!(t.spec.as_ref().unwrap().volumes.is_none());
        assert!(t.metadata.is_none());
    }

    #[test]
    fn other_components_and_frontends_are_untouched() {
        for (kind, name) in [
            (Some(ComponentType::Planner), "planner"),
            (Some(ComponentType::Epp), "epp"),
            (None, "untyped"),
            (Some(ComponentType::Frontend), "another-frontend"),
        ] {
            let mut t = template(&[(ENV_LEVEL, "user")]);
            let before = t.clone();
            inject(kind, name, &mut t, "main", &topology());
            assert_eq!(t, before, "{name}");
        }
        let mut t = template(&[]);
        t.spec.as_mut().unwrap().containers[0].name = "engine".into();
        let before = t.clone();
        inject(
            Some(ComponentType::Prefill),
            "prefill",
            &mut t,
            "main",
            &topology(),
        );
        assert_eq!(t, before, "no main container, nothing to inject into");
    }

    #[test]
    fn weight_is_omitted_when_unset() {
        let mut topology = topology();
        topology.weight = None;
        assert!(frontend_env(&topology).iter().all(|e| e.name != ENV_WEIGHT));
        topology.weight = Some(0.25);
        assert_eq!(
            frontend_env(&topology).last().unwrap().value.as_deref(),
            Some("0.25")
        );
    }

    #[test]
    fn the_released_runtime_contract_uses_its_names_and_mount_path() {
        let mut topology = topology();
        topology.contract = EnvContract::Dynamo;
        let mut t = template(&[
            (ENV_LEVEL, "rack"),
            (ENV_DYN_KV_TRANSFER_DOMAIN, "host"),
            ("A", "1"),
        ]);
        inject(Some(ComponentType::Prefill), "prefill", &mut t, "main", &topology);
        assert_eq!(
            env_of(&t),
            [
                ("A".to_string(), "1".to_string()),
                (ENV_TOPOLOGY_ENABLED.into(), "true".into()),
                (ENV_DYN_MOUNT_PATH.into(), DYNAMO_MOUNT_PATH.into()),
                (ENV_DYN_KV_TRANSFER_DOMAIN.into(), "zone".into()),
                (ENV_DYN_KV_TRANSFER_ENFORCEMENT.into(), "preferred".into()),
                (ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT.into(), "50".into()),
            ]
        );
        let spec = t.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers[0].volume_mounts,
            Some(vec![
                VolumeMount {
                    name: "old".into(),
                    mount_path: "/etc/podinfo/topology/".into(),
                    ..VolumeMount::default()
                },
                volume_mount_at("/etc/dynamo/topology"),
            ])
        );
        assert_eq!(spec.volumes.as_ref().unwrap()[0].name, VOLUME_NAME);
        topology.enforcement = Enforcement::Required;
        let required = worker_env(&topology);
        assert_eq!(required[3].value.as_deref(), Some("required"));
        assert_eq!(required.len(), 4, "no weight when required");
        let mut frontend = template(&[("B", "2")]);
        let before = frontend.clone();
        inject(
            Some(ComponentType::Frontend),
            "frontend",
            &mut frontend,
            "main",
            &topology,
        );
        assert_eq!(frontend, before, "the released router reads what workers publish");
        let annotations: std::collections::BTreeMap<String, String> = [(
            crate::topology::ENV_CONTRACT_ANNOTATION.to_string(),
            "dynamo".to_string(),
        )]
        .into();
        assert_eq!(
            EnvContract::for_annotations(Some(&annotations), EnvContract::Planner),
            EnvContract::Dynamo
        );
        assert_eq!(
            EnvContract::for_annotations(None, EnvContract::Dynamo),
            EnvContract::Dynamo
        );
    }

    #[test]
    fn malformed_annotation_entries_are_skipped() {
        assert_eq!(
            parse_labels_annotation("a=b,,c, =d,e=f"),
            [("a".to_string(), "b".to_string()), ("e".into(), "f".into())]
        );
    }
}
