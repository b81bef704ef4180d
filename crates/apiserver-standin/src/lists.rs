//! Lists: a request's query string, the continue tokens the real server writes, and paged
//! lists read from one snapshot of a resource (with `limit`, `continue`,
//! `resourceVersion` and `resourceVersionMatch` as the real server reads them).

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::http::ApiError;
use crate::selectors::{parse_field_selector, parse_label_selector, Filter};
use crate::store::{Obj, ResourceType, Shared};

pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// A request's query parameters, decoded.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(q: &str) -> Query {
        Query(parse_query(q))
    }
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// A continue token as the real server writes one: base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"KEY\u0000"}`, where rv -1 means "the latest".
fn encode_continue(rv: i64, start: &str) -> String {
    let text = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

fn decode_continue(token: &str) -> Result<(i64, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = v["rv"].as_i64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?.to_owned();
    if rv == 0 || start.is_empty() {
        return Err(bad());
    }
    Ok((rv, start))
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// What a list, watch or deletecollection selects: the path's namespace, the query's
/// selectors, and (for a watch of one object) its name.
pub(crate) fn filter_of(
    q: &Query,
    ty: &ResourceType,
    namespace: Option<String>,
    name: Option<&str>,
) -> Result<Filter, ApiError> {
    let mut f = Filter {
        namespace,
        labels: parse_label_selector(q.get("labelSelector").unwrap_or(""))?,
        fields: parse_field_selector(q.get("fieldSelector").unwrap_or(""), ty)?,
    };
    if let Some(name) = name {
        f.fields
            .push(("metadata.name".into(), name.to_owned(), false));
    }
    Ok(f)
}

pub(crate) fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
}

/// A list (one page of it, with `limit`): its JSON body.
pub(crate) fn list(
    shared: &Arc<Shared>,
    ri: usize,
    filter: &Filter,
    q: &Query,
) -> Result<Vec<u8>, ApiError> {
    let limit = match q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let rv_param = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rv_match = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let continue_param = q.get("continue").filter(|s| !s.is_empty());

    let (items, list_rv, start) = {
        let mut st = shared.lock();
        match continue_param {
            Some(token) => {
                if rv_param.is_some() || rv_match.is_some() {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let (rv, start) = decode_continue(token)?;
                if rv == -1 {
                    let items = st.current_snapshot(ri);
                    (items, st.rv, Some(start))
                } else {
                    let rv = rv as u64;
                    let snap = if rv < st.token_floor {
                        None
                    } else {
                        st.snapshot_at(ri, rv)
                    };
                    match snap {
                        Some(items) => (items, rv, Some(start)),
                        None => {
                            let mut e = ApiError::expired(CONTINUE_EXPIRED);
                            e.continue_token = Some(encode_continue(-1, &start));
                            return Err(e);
                        }
                    }
                }
            }
            None => {
                let wanted = rv_param.map(parse_rv).transpose()?.unwrap_or(0);
                match rv_match {
                    Some("Exact") => {
                        if wanted == 0 {
                            return Err(ApiError::bad_request(
                                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                            ));
                        }
                        if wanted > st.rv {
                            return Err(too_large(wanted, st.rv));
                        }
                        let snap = if wanted == st.rv {
                            Some(st.current_snapshot(ri))
                        } else if wanted < st.token_floor {
                            None
                        } else {
                            st.snapshot_at(ri, wanted)
                        };
                        match snap {
                            Some(items) => (items, wanted, None),
                            None => {
                                return Err(ApiError::expired(format!(
                                    "too old resource version: {wanted} ({})",
                                    st.token_floor
                                )))
                            }
                        }
                    }
                    None | Some("NotOlderThan") => {
                        if wanted > st.rv {
                            return Err(too_large(wanted, st.rv));
                        }
                        let items = st.current_snapshot(ri);
                        (items, st.rv, None)
                    }
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                        )))
                    }
                }
            }
        }
    };

    // The keys of this list: one namespace's, or all.
    let (lo, hi) = match &filter.namespace {
        Some(ns) => {
            let prefix = format!("{ns}/");
            let lo = items.partition_point(|o| o.key.as_str() < prefix.as_str());
            let hi = lo + items[lo..].partition_point(|o| o.key.starts_with(&prefix));
            (lo, hi)
        }
        None => (0, items.len()),
    };
    let from = match &start {
        Some(s) => lo + items[lo..hi].partition_point(|o| o.key.as_str() < s.as_str()),
        None => lo,
    };
    let mut selected: Vec<&Obj> = Vec::new();
    let mut next = hi;
    for (i, o) in items[from..hi].iter().enumerate() {
        if limit > 0 && selected.len() == limit {
            next = from + i;
            break;
        }
        if filter.matches(o) {
            selected.push(&**o);
        }
    }
    let (token, remaining) = if next < hi {
        let last = &items[next - 1].key;
        let remaining = (!filter.has_selectors()).then_some(hi - next);
        (
            Some(encode_continue(list_rv as i64, &format!("{last}\u{0}"))),
            remaining,
        )
    } else {
        (None, None)
    };
    let ty = shared.lock().resources[ri].ty.clone();
    let mut out = Vec::with_capacity(selected.len() * 512 + 256);
    write_list(
        &mut out,
        &ty,
        list_rv,
        token.as_deref(),
        remaining,
        selected.into_iter(),
    );
    Ok(out)
}

pub(crate) fn too_large(wanted: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {wanted}, current: {current}"),
    )
    .details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}))
}

pub(crate) fn write_list<'a>(
    out: &mut Vec<u8>,
    ty: &ResourceType,
    rv: u64,
    token: Option<&str>,
    remaining: Option<usize>,
    items: impl Iterator<Item = &'a Obj>,
) {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(t) = token {
        meta["continue"] = json!(t);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    out.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut *out, &format!("{}List", ty.kind)).unwrap();
    out.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut *out, &ty.api_version()).unwrap();
    out.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut *out, &meta).unwrap();
    out.extend_from_slice(b",\"items\":[");
    for (i, v) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(v.untyped.as_bytes());
    }
    out.extend_from_slice(b"]}");
}
