//! GPU nodes as a cluster of the NVIDIA GPU Operator keeps them, generated: one generator
//! for the scale measurements of the cluster context (tests/scale.rs, against the real
//! apiserver) and the summaries' benchmark (benches/nodes.rs), so that both measure the
//! same nodes.
//!
//! Each node is what a kubelet, Node Feature Discovery and the GPU Operator leave on it
//! (about 12 KB of JSON): the well-known and EKS labels, a zone of four, NFD's feature
//! labels, the GPU Operator's `nvidia.com/gpu.deploy.*` and GPU Feature Discovery's
//! `nvidia.com/*` labels (k8s-device-plugin's `internal/lm`: product, count, memory,
//! family, compute capability, CUDA driver and runtime versions, MIG and sharing, and
//! `nvidia.com/gfd.timestamp`, which GFD sets per node unless `--no-timestamp`), the
//! taint GPU pools carry, allocatable GPUs and EFA devices, NFD's annotations, and the
//! status a kubelet writes (conditions, addresses, node info, 25 images). Nodes come in
//! four pools (A100, H100, L40S, A10G); every label but the hostname and the GFD timestamp
//! is shared by the nodes of one pool and zone.

use serde_json::{json, Value};

/// The pools: instance type, GFD product, GPU memory (MiB), family, compute capability,
/// allocatable CPU and memory.
const POOLS: [(&str, &str, &str, &str, &str, &str, &str); 4] = [
    (
        "p4d.24xlarge",
        "NVIDIA-A100-SXM4-40GB",
        "40960",
        "ampere",
        "8.0",
        "95690m",
        "1119Gi",
    ),
    (
        "p5.48xlarge",
        "NVIDIA-H100-80GB-HBM3",
        "81559",
        "hopper",
        "9.0",
        "191450m",
        "1990Gi",
    ),
    (
        "g6e.48xlarge",
        "NVIDIA-L40S",
        "46068",
        "ampere",
        "8.9",
        "191450m",
        "1480Gi",
    ),
    (
        "g5.48xlarge",
        "NVIDIA-A10G",
        "23028",
        "ampere",
        "8.6",
        "191450m",
        "730Gi",
    ),
];

const ZONES: [&str; 4] = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"];

/// The name of node `i`, as EKS names them.
pub fn name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

/// Node `i` as the apiserver would hold it (less the managedFields it adds).
pub fn gpu_node(i: usize) -> Value {
    let (instance, product, memory, family, compute, cpu, mem) = POOLS[i % POOLS.len()];
    let zone = ZONES[(i / POOLS.len()) % ZONES.len()];
    let pool = instance.split('.').next().unwrap_or(instance);
    let name = name(i);
    let (major, minor) = compute.split_once('.').unwrap_or((compute, "0"));
    let mig = if product.contains("A100") {
        "true"
    } else {
        "false"
    };
    // GFD labels each node when it starts there: a value of its own per node.
    let timestamp = (1_767_225_600 + 37 * i).to_string();
    let zone_id = format!("use1-az{}", (i / POOLS.len()) % ZONES.len() + 1);
    let nodegroup = format!("{pool}-gpu");
    let pairs: &[(&str, &str)] = &[
        ("kubernetes.io/hostname", &name),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/instance-type", instance),
        ("node.kubernetes.io/instance-type", instance),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("topology.kubernetes.io/zone", zone),
        ("failure-domain.beta.kubernetes.io/region", "us-east-1"),
        ("failure-domain.beta.kubernetes.io/zone", zone),
        ("topology.k8s.aws/zone-id", &zone_id),
        ("eks.amazonaws.com/nodegroup", &nodegroup),
        ("eks.amazonaws.com/nodegroup-image", "ami-0a1b2c3d4e5f60718"),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
        (
            "k8s.io/cloud-provider-aws",
            "a8c4e1f2b3d4c5e6f7a8b9c0d1e2f3a4",
        ),
        ("feature.node.kubernetes.io/cpu-cpuid.AVX512F", "true"),
        ("feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI", "true"),
        (
            "feature.node.kubernetes.io/cpu-hardware_multithreading",
            "true",
        ),
        ("feature.node.kubernetes.io/cpu-model.vendor_id", "Intel"),
        (
            "feature.node.kubernetes.io/kernel-version.full",
            "6.1.119-129.201.amzn2023.x86_64",
        ),
        ("feature.node.kubernetes.io/kernel-version.major", "6"),
        ("feature.node.kubernetes.io/kernel-version.minor", "1"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/pci-1d0f.present", "true"),
        ("feature.node.kubernetes.io/system-os_release.ID", "amzn"),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID",
            "2023",
        ),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID.major",
            "2023",
        ),
        ("nvidia.com/gpu.deploy.container-toolkit", "true"),
        ("nvidia.com/gpu.deploy.dcgm", "true"),
        ("nvidia.com/gpu.deploy.dcgm-exporter", "true"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("nvidia.com/gpu.deploy.driver", "true"),
        ("nvidia.com/gpu.deploy.gpu-feature-discovery", "true"),
        ("nvidia.com/gpu.deploy.mig-manager", "true"),
        ("nvidia.com/gpu.deploy.node-status-exporter", "true"),
        ("nvidia.com/gpu.deploy.operator-validator", "true"),
        ("nvidia.com/gpu-driver-upgrade-state", "upgrade-done"),
        ("nvidia.com/cuda.driver.major", "570"),
        ("nvidia.com/cuda.driver.minor", "124"),
        ("nvidia.com/cuda.driver.rev", "06"),
        ("nvidia.com/cuda.driver-version.full", "570.124.06"),
        ("nvidia.com/cuda.driver-version.major", "570"),
        ("nvidia.com/cuda.driver-version.minor", "124"),
        ("nvidia.com/cuda.driver-version.revision", "06"),
        ("nvidia.com/cuda.runtime.major", "12"),
        ("nvidia.com/cuda.runtime.minor", "8"),
        ("nvidia.com/cuda.runtime-version.full", "12.8"),
        ("nvidia.com/cuda.runtime-version.major", "12"),
        ("nvidia.com/cuda.runtime-version.minor", "8"),
        ("nvidia.com/gfd.timestamp", &timestamp),
        ("nvidia.com/gpu.compute.major", major),
        ("nvidia.com/gpu.compute.minor", minor),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.family", family),
        ("nvidia.com/gpu.machine", instance),
        ("nvidia.com/gpu.memory", memory),
        ("nvidia.com/gpu.mode", "compute"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.product", product),
        ("nvidia.com/gpu.replicas", "1"),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("nvidia.com/mig.capable", mig),
        ("nvidia.com/mig.strategy", "single"),
        ("nvidia.com/mps.capable", "false"),
        ("nvidia.com/vgpu.present", "false"),
    ];
    let labels: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let feature_labels: Vec<&str> = labels
        .keys()
        .filter_map(|k| k.strip_prefix("feature.node.kubernetes.io/"))
        .collect();
    let feature_labels = feature_labels.join(",");
    let allocatable = json!({"cpu": cpu, "memory": mem, "ephemeral-storage": "1844225542888",
        "hugepages-1Gi": "0", "hugepages-2Mi": "0", "pods": "737",
        "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"});
    let images: Vec<Value> = (0..25)
        .map(|k| {
            json!({"names": [
                format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/image-{k}@sha256:{:064x}", k * 7919 + i),
                format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/image-{k}:v1.{k}.0-eksbuild.1")
            ], "sizeBytes": 100_000_000 + k})
        })
        .collect();
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| {
            json!({"type": t, "status": if *t == "Ready" { "True" } else { "False" },
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t}")})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
            "annotations": {"alpha.kubernetes.io/provided-node-ip": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "nfd.node.kubernetes.io/feature-labels": feature_labels,
                "nfd.node.kubernetes.io/extended-resources": "",
                "nvidia.com/gpu-driver-upgrade-enabled": "true"}},
        "spec": {"providerID": format!("aws:///{zone}/i-{i:017x}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": allocatable.clone(), "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)},
                {"type": "Hostname", "address": name}, {"type": "InternalDNS", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                "bootID": format!("{i:036x}"), "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.6.20241212", "containerRuntimeVersion": "containerd://1.7.23",
                "kubeletVersion": "v1.36.0-eks-0000000", "kubeProxyVersion": "v1.36.0-eks-0000000",
                "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}
