//! `Status` bodies: an error answer with the code, reason, message and details the real
//! server gives.

use serde_json::{json, Value};

use crate::store::ResourceType;

/// An error answer: a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    details: Option<Box<Value>>,
    pub(crate) continue_token: Option<String>,
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            details: None,
            continue_token: None,
            retry_after: None,
        }
    }
    pub(crate) fn details(mut self, details: Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub(crate) fn not_found_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .details(json!({}))
    }
    pub(crate) fn not_found(ty: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", ty.qualified()),
        )
        .details(name_details(ty, name))
    }
    pub(crate) fn already_exists(ty: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", ty.qualified()),
        )
        .details(name_details(ty, name))
    }
    pub(crate) fn conflict(ty: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                ty.qualified()
            ),
        )
        .details(name_details(ty, name))
    }
    pub(crate) fn stale(ty: &ResourceType, name: &str) -> Self {
        Self::conflict(
            ty,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub(crate) fn invalid(ty: &ResourceType, name: &str, message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", ty.kind),
        )
        .details(json!({"name": name, "group": ty.group, "kind": ty.kind}))
    }
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .details(json!({}))
    }
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn to_value(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = (**d).clone();
        }
        if let Some(secs) = self.retry_after {
            if v.get("details").is_none() {
                v["details"] = json!({});
            }
            v["details"]["retryAfterSeconds"] = json!(secs);
        }
        if let Some(c) = &self.continue_token {
            v["metadata"]["continue"] = json!(c);
        }
        if self.reason.is_empty() {
            v.as_object_mut().unwrap().remove("reason");
        }
        v
    }
}

fn name_details(ty: &ResourceType, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": ty.plural});
    if !ty.group.is_empty() {
        d["group"] = json!(ty.group);
    }
    d
}
