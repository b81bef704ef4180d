//! HTTP: the accept loop (TLS, HTTP/1.1 and HTTP/2), routing a path to discovery or a
//! resource, authentication, the verbs (get, list, watch, create, update, patch, delete,
//! deletecollection) with their status codes, and JSON and `Status` bodies.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::faults::{self, fault_error, RequestRecord, Verb};
use crate::lists::{filter_of, list, percent_decode, write_list, Query};
use crate::store::{key_of, ChangeKind, Obj, Shared, State};
use crate::watches::watch;

mod discovery;
mod status;
pub(crate) mod tls;

pub use status::ApiError;

/// A response body: whole, or a watch's stream of chunks (an error in which cuts the
/// connection).
type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_response(code: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(CONTENT_TYPE, "application/json")
        .body(full(body))
        .unwrap()
}

fn value_response(code: u16, v: &Value) -> Response<Body> {
    json_response(code, serde_json::to_vec(v).unwrap())
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = value_response(e.code, &e.to_value());
    if let Some(secs) = e.retry_after {
        r.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from_str(&secs.to_string()).unwrap(),
        );
    }
    r
}

enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Resources {
        group: String,
        version: String,
    },
    Collection {
        ri: usize,
        ns: Option<String>,
    },
    Object {
        ri: usize,
        ns: Option<String>,
        name: String,
    },
}

fn route(state: &State, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s, false))
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["healthz" | "readyz" | "livez"] => return Ok(Route::Health),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::not_found_path()),
    };
    let find = |plural: &str| {
        state
            .resources
            .iter()
            .position(|r| r.ty.group == group && r.ty.version == version && r.ty.plural == plural)
    };
    let namespaced_at = |plural: &str| find(plural).filter(|&ri| state.resources[ri].ty.namespaced);
    match rest {
        [] => {
            if state
                .resources
                .iter()
                .any(|r| r.ty.group == group && r.ty.version == version)
            {
                Ok(Route::Resources {
                    group: group.to_owned(),
                    version: version.to_owned(),
                })
            } else {
                Err(ApiError::not_found_path())
            }
        }
        ["namespaces", ns, plural, tail @ ..] if namespaced_at(plural).is_some() => {
            let ri = namespaced_at(plural).unwrap();
            match tail {
                [] => Ok(Route::Collection {
                    ri,
                    ns: Some((*ns).to_owned()),
                }),
                [name] => Ok(Route::Object {
                    ri,
                    ns: Some((*ns).to_owned()),
                    name: (*name).to_owned(),
                }),
                _ => Err(ApiError::not_found_path()),
            }
        }
        [plural, tail @ ..] => {
            let ri = find(plural).ok_or_else(ApiError::not_found_path)?;
            match tail {
                [] => Ok(Route::Collection { ri, ns: None }),
                [name] if !state.resources[ri].ty.namespaced => Ok(Route::Object {
                    ri,
                    ns: None,
                    name: (*name).to_owned(),
                }),
                _ => Err(ApiError::not_found_path()),
            }
        }
    }
}

/// Accepts TLS connections on `listener` and serves each (HTTP/1.1 or HTTP/2) until `stop`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    // Dropping the set when the loop ends aborts every connection, watches included.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut record = RequestRecord {
        method: method.to_string(),
        verb: Verb::Other,
        path: path.clone(),
        query: query.clone(),
        resource: None,
        namespace: None,
        name: None,
        status: 0,
        token: req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned),
    };
    let mut logged = false;
    let response = respond(&shared, req, &mut record, &mut logged)
        .await
        .unwrap_or_else(|e| error_response(&e));
    if !logged {
        record.status = response.status().as_u16();
        shared.lock().log.push(record);
    }
    Ok(response)
}

/// Logs a write under the lock that makes its change visible, so that whoever sees the
/// change in the store also sees the request that made it (logged after the lock was let
/// go, a test that saw a report written could read a log without its writer yet).
fn log_write(
    st: &mut State,
    record: &RequestRecord,
    logged: &mut bool,
    result: Result<Response<Body>, ApiError>,
) -> Result<Response<Body>, ApiError> {
    let mut record = record.clone();
    record.status = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.code,
    };
    st.log.push(record);
    *logged = true;
    result
}

async fn respond(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    record: &mut RequestRecord,
    logged: &mut bool,
) -> Result<Response<Body>, ApiError> {
    let route = route(&shared.lock(), &record.path)?;
    match route {
        Route::Version => return Ok(value_response(200, &discovery::version_info())),
        Route::Health => {
            return Ok(Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full("ok"))
                .unwrap())
        }
        _ => {}
    }
    if let Some(token) = &shared.token {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return Err(ApiError::new(401, "Unauthorized", "Unauthorized"));
        }
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    // The real server's limit on a request body.
    if body.len() > 3 * 1024 * 1024 {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        ));
    }
    let q = Query::parse(&record.query);
    let (ri, ns, name) = match route {
        Route::CoreVersions => {
            return Ok(value_response(200, &discovery::core_versions(shared.addr)))
        }
        Route::Groups => return Ok(value_response(200, &discovery::group_list(&shared.lock()))),
        Route::Resources { group, version } => {
            return Ok(value_response(
                200,
                &discovery::resource_list(&shared.lock(), &group, &version),
            ))
        }
        Route::Collection { ri, ns } => (ri, ns, None),
        Route::Object { ri, ns, name } => (ri, ns, Some(name)),
        Route::Version | Route::Health => unreachable!(),
    };
    let ty = shared.lock().resources[ri].ty.clone();
    let is_watch = q.flag("watch");
    let verb = match (&method, name.is_some()) {
        (&Method::GET, _) if is_watch => Verb::Watch,
        (&Method::GET, false) => Verb::List,
        (&Method::GET, true) => Verb::Get,
        (&Method::POST, false) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    };
    record.verb = verb;
    record.resource = Some(ty.plural.clone());
    record.namespace = ns.clone();
    record.name = name.clone();
    if verb == Verb::Create && ty.namespaced && ns.is_none() {
        return Err(ApiError::method_not_allowed());
    }

    // Faults: the first that matches, counted down.
    let fault = faults::take(&mut shared.lock().faults, verb, &ty);
    if let Some(f) = fault {
        if let Some(d) = f.delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = f.code {
            return Err(fault_error(&f, code, Some(&ty), verb, ns.as_deref()));
        }
    }

    let dry_run = q.get("dryRun") == Some("All");
    match verb {
        Verb::Get => {
            let st = shared.lock();
            let name = name.unwrap();
            let key = key_of(ns.as_deref().unwrap_or(""), &name);
            match st.resources[ri].objects.get(&key) {
                Some(o) => Ok(json_response(200, o.typed())),
                None => Err(ApiError::not_found(&ty, &name)),
            }
        }
        Verb::List => {
            let filter = filter_of(&q, &ty, ns, None)?;
            Ok(json_response(200, list(shared, ri, &filter, &q)?))
        }
        Verb::Watch => {
            let filter = filter_of(&q, &ty, ns, name.as_deref())?;
            let chunks = watch(shared, ri, filter, &q)?;
            Ok(Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "application/json")
                .body(StreamBody::new(chunks.map_ok(Frame::data)).boxed_unsync())
                .unwrap())
        }
        Verb::Create => {
            let body = parse_body(&content_type, &body)?;
            let mut st = shared.lock();
            let r = st
                .prepare_create(ri, ns.as_deref(), body, shared.uid_seed, false)
                .map(|value| {
                    if dry_run {
                        value_response(201, &value)
                    } else {
                        value_response(201, &st.commit(ri, ChangeKind::Added, value))
                    }
                });
            log_write(&mut st, record, logged, r)
        }
        Verb::Update => {
            let body = parse_body(&content_type, &body)?;
            let name = name.unwrap();
            let mut st = shared.lock();
            let r = st
                .prepare_update(ri, ns.as_deref(), &name, body, false)
                .map(|(new, old)| match new {
                    None => value_response(200, &old),
                    Some(v) if dry_run => value_response(200, &v),
                    Some(v) => value_response(200, &st.commit_update(ri, v)),
                });
            log_write(&mut st, record, logged, r)
        }
        Verb::Patch => {
            let name = name.unwrap();
            let mut st = shared.lock();
            let key = key_of(ns.as_deref().unwrap_or(""), &name);
            let r = st.resources[ri]
                .objects
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiError::not_found(&ty, &name))
                .and_then(|old| apply_patch(&content_type, &old.value(), &body))
                .and_then(|patched| st.prepare_update(ri, ns.as_deref(), &name, patched, false))
                .map(|(new, old)| match new {
                    None => value_response(200, &old),
                    Some(v) if dry_run => value_response(200, &v),
                    Some(v) => value_response(200, &st.commit_update(ri, v)),
                });
            log_write(&mut st, record, logged, r)
        }
        Verb::Delete => {
            let options = if body.is_empty() {
                json!({})
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
            };
            let name = name.unwrap();
            let mut st = shared.lock();
            let r = st
                .delete(
                    ri,
                    ns.as_deref().unwrap_or(""),
                    &name,
                    &options,
                    dry_run,
                    false,
                )
                .map(|v| value_response(200, &v));
            log_write(&mut st, record, logged, r)
        }
        Verb::DeleteCollection => {
            let filter = filter_of(&q, &ty, ns, None)?;
            let mut st = shared.lock();
            let targets: Vec<Arc<Obj>> = st.resources[ri]
                .objects
                .values()
                .filter(|o| filter.matches(o))
                .cloned()
                .collect();
            let prefix = st.resources[ri].type_prefix.clone();
            let mut items = Vec::new();
            for o in targets {
                if let Ok(v) = st.delete(ri, &o.namespace, &o.name, &json!({}), dry_run, false) {
                    items.push(Obj::new(&v, prefix.clone()));
                }
            }
            let rv = st.rv;
            let mut out = Vec::new();
            write_list(&mut out, &ty, rv, None, None, items.iter());
            log_write(&mut st, record, logged, Ok(json_response(200, out)))
        }
        Verb::Other => unreachable!(),
    }
}

fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if !content_type.is_empty() && content_type != "application/json" && content_type != "*/*" {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json (got {content_type})"),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the object provided is unrecognized: {e}")))
}

fn apply_patch(content_type: &str, old: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let decode = |e: serde_json::Error| ApiError::bad_request(format!("error decoding patch: {e}"));
    let mut doc = old.clone();
    match content_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let p: Value = serde_json::from_slice(body).map_err(decode)?;
            if !p.is_object() {
                return Err(ApiError::bad_request("patch is not a JSON object"));
            }
            json_patch::merge(&mut doc, &p);
        }
        "application/json-patch+json" => {
            let p: json_patch::Patch = serde_json::from_slice(body).map_err(decode)?;
            json_patch::patch(&mut doc, &p)
                .map_err(|e| ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}")))?;
        }
        _ => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (server-side apply is not supported by the stand-in; got {content_type})"),
            ))
        }
    }
    Ok(doc)
}
