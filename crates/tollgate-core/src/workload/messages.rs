//! The words both webhooks share for a workload: its subject before a message, a
//! template's name after it, and what is said when its templates cannot be judged.

use super::template::PodTemplate;
use super::Workload;
use crate::trainjob;

/// `tollgate: <subject>: <rest>` from a message that starts `tollgate: <rest>`.
pub(super) fn prefixed(subject: &str, message: &str) -> String {
    let rest = message.strip_prefix("tollgate: ").unwrap_or(message);
    format!("tollgate: {subject}: {rest}")
}

pub(super) fn with_template(subject: &str, t: &PodTemplate<'_>) -> String {
    match &t.label {
        Some(l) => format!("{subject}, {l}"),
        None => subject.to_owned(),
    }
}

pub(super) fn no_template_warning(w: &Workload<'_>, subject: &str) -> String {
    let paths: Vec<&str> = w.kind.templates.iter().map(|t| t.path.as_str()).collect();
    let within = if w.kind.from.is_some() {
        " of its runtime"
    } else {
        ""
    };
    format!(
        "tollgate: {subject}: no pod template at {}{within}; it was allowed, and its pods will be judged when they are created",
        paths.join(", ")
    )
}

/// The warning for a workload whose templates could not be built.
pub(super) fn missing_warning(subject: &str, m: &trainjob::Unbuilt) -> String {
    format!(
        "tollgate: {subject}: {}; it was allowed, and its pods will be judged when they are created",
        m.why
    )
}
