//! Faults and the request log: what a test injects (a `Status` error, a delay) into the
//! requests that match a resource and a verb, and the record of every request answered.

use std::time::Duration;

use serde_json::json;

use crate::http::ApiError;
use crate::lists::parse_query;
use crate::store::ResourceType;

/// The Kubernetes verb a request is, as RBAC and audit logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// Discovery, `/version`, unknown paths.
    Other,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Other => "other",
        }
    }
}

/// A fault to inject: a `Status` error answer and/or a delay before answering, on requests
/// matching a resource and a verb, for a bounded count or until cleared.
#[derive(Clone, Debug)]
pub struct Fault {
    resource: Option<String>,
    verb: Option<Verb>,
    pub(crate) code: Option<u16>,
    retry_after: Option<u64>,
    pub(crate) delay: Option<Duration>,
    remaining: Option<usize>,
}

impl Fault {
    /// Answer with a `Status` of this HTTP code (403, 404, 409, 429, 500, 503, ...), with
    /// the reason and message the real server gives for it.
    pub fn status(code: u16) -> Self {
        Fault {
            resource: None,
            verb: None,
            code: Some(code),
            retry_after: None,
            delay: None,
            remaining: None,
        }
    }
    /// Wait this long before answering normally.
    pub fn delay(delay: Duration) -> Self {
        Fault {
            delay: Some(delay),
            code: None,
            ..Fault::status(0)
        }
    }
    /// Only requests for this resource (`pods`, or `leases.coordination.k8s.io`) and verb.
    pub fn on(self, resource: &str, verb: Verb) -> Self {
        self.resource(resource).verb(verb)
    }
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_owned());
        self
    }
    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }
    /// Only the next `n` matching requests; without it, until `clear_faults`.
    pub fn times(mut self, n: usize) -> Self {
        self.remaining = Some(n);
        self
    }
    /// A `Retry-After` header and `details.retryAfterSeconds`, as with 429 and 503.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

/// One request the stand-in answered.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub method: String,
    pub verb: Verb,
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The plural resource name, when the path named a registered resource.
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The HTTP status of the answer (200 for a watch that started streaming).
    pub status: u16,
    /// The bearer token the request carried: which client it was, where several share a
    /// stand-in (see `Builder::no_auth`).
    pub token: Option<String>,
}

impl RequestRecord {
    /// A query parameter, decoded.
    pub fn param(&self, key: &str) -> Option<String> {
        parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// The reason and message the real server gives with a code, for injected faults.
pub(crate) fn fault_error(
    fault: &Fault,
    code: u16,
    ty: Option<&ResourceType>,
    verb: Verb,
    ns: Option<&str>,
) -> ApiError {
    let resource = ty.map(|t| t.plural.as_str()).unwrap_or("");
    let group = ty.map(|t| t.group.as_str()).unwrap_or("");
    let (reason, default_message) = match code {
        400 => ("BadRequest", "the server rejected our request for an unknown reason".to_owned()),
        401 => ("Unauthorized", "Unauthorized".to_owned()),
        403 => {
            let scope = match ns {
                Some(ns) => format!("in the namespace \"{ns}\""),
                None => "at the cluster scope".to_owned(),
            };
            (
                "Forbidden",
                format!(
                    "{resource} is forbidden: User \"system:serviceaccount:tollgate:tollgate\" cannot {} resource \"{resource}\" in API group \"{group}\" {scope}",
                    verb.as_str()
                ),
            )
        }
        404 => ("NotFound", "the server could not find the requested resource".to_owned()),
        409 => ("Conflict", "the object has been modified; please apply your changes to the latest version and try again".to_owned()),
        410 => ("Expired", "too old resource version".to_owned()),
        429 => ("TooManyRequests", "the server has received too many requests and has asked us to try again later".to_owned()),
        500 => ("InternalError", "Internal error occurred: injected fault".to_owned()),
        503 => ("ServiceUnavailable", "the server is currently unable to handle the request".to_owned()),
        504 => ("Timeout", "the server was unable to return a response in the time allotted, but may still be processing the request".to_owned()),
        _ => ("", format!("injected fault {code}")),
    };
    let mut e = ApiError::new(code, reason, default_message);
    if let Some(ty) = ty {
        e = e.details(json!({"group": ty.group, "kind": ty.plural}));
    }
    e.retry_after = fault.retry_after;
    e
}

/// The first fault that matches a request, counted down (and gone once spent).
pub(crate) fn take(faults: &mut Vec<Fault>, verb: Verb, ty: &ResourceType) -> Option<Fault> {
    let i = faults.iter().position(|f| {
        f.verb.is_none_or(|v| v == verb)
            && f.resource
                .as_deref()
                .is_none_or(|r| r == ty.plural || r == ty.qualified())
    })?;
    let f = faults[i].clone();
    if let Some(n) = &mut faults[i].remaining {
        *n = n.saturating_sub(1);
        if *n == 0 {
            faults.remove(i);
        }
    }
    Some(f)
}
