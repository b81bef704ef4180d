//! The DeviceClasses a pod's DRA claims name: a class the cluster does not have can never
//! be allocated.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

use super::{Obstacle, Outlook};
use crate::cluster::Cluster;
use crate::words::quote;

pub(super) fn check_device_classes(
    pod: &Pod,
    namespace: &str,
    cluster: &dyn Cluster,
    classes: &BTreeSet<String>,
    out: &mut Outlook,
) {
    for claim in pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        let spec = if let Some(n) = &claim.resource_claim_name {
            cluster
                .resource_claim(namespace, n)
                .found()
                .and_then(|c| c.spec.devices.clone())
        } else if let Some(n) = &claim.resource_claim_template_name {
            cluster
                .resource_claim_template(namespace, n)
                .found()
                .and_then(|t| t.spec.spec.devices.clone())
        } else {
            None
        };
        // A claim tollgate could not read was said so already; nothing to check here.
        let Some(devices) = spec else { continue };
        for r in devices.requests.iter().flatten() {
            let wanted: Vec<&str> = match (&r.exactly, &r.first_available) {
                (Some(e), _) => vec![e.device_class_name.as_str()],
                (None, Some(alts)) => alts.iter().map(|a| a.device_class_name.as_str()).collect(),
                (None, None) => vec![],
            };
            if wanted.is_empty() || wanted.iter().any(|c| classes.contains(*c)) {
                continue;
            }
            let known: Vec<&str> = classes.iter().map(String::as_str).collect();
            out.findings.push(Obstacle {
                never: true,
                in_turns: false,
                message: format!(
                    "claim {} asks for DeviceClass {}, which the cluster does not have: it can never be allocated. Use one of the cluster's classes ({})",
                    quote(&claim.name),
                    wanted
                        .iter()
                        .map(|c| quote(c))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    if known.is_empty() {
                        "it has none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        }
    }
}
