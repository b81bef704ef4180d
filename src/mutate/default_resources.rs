//! TODO: this step is being written.

use k8s_openapi::api::core::v1::Pod;

use crate::policy::Policy;

pub fn ensure(_policy: &Policy, _pod: &mut Pod, _warnings: &mut Vec<String>) -> bool {
    false
}
