//! Watches: a stream of JSON lines from a resource's history (or its current state), with
//! bookmarks, a 410 for a resourceVersion older than the history kept, `sendInitialEvents`,
//! a clean end at `timeoutSeconds`, and a cut mid-stream when a test breaks it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::http::ApiError;
use crate::lists::{parse_rv, too_large, Query};
use crate::selectors::Filter;
use crate::store::{Change, ChangeKind, Obj, ResourceType, Shared, WatchItem};

enum Pending {
    Change(Arc<Change>),
    Added(Arc<Obj>),
    Bookmark { rv: u64, initial_end: bool },
    Compacted(u64),
    Error(Value),
}

struct WatchStream {
    shared: Arc<Shared>,
    ty: ResourceType,
    filter: Filter,
    pending: VecDeque<Pending>,
    rx: Option<mpsc::UnboundedReceiver<WatchItem>>,
    deadline: tokio::time::Instant,
    bookmarks: Option<tokio::time::Interval>,
    start_rv: u64,
    /// After a compaction, bookmarks claim no revision past it until a change after it
    /// passes: the revision the compaction took is not one this watcher would resume
    /// from after a real compaction, and a test that compacts then breaks watches must
    /// get its 410.
    bookmark_cap: Option<u64>,
    end_after_pending: bool,
    done: bool,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &Obj) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    obj.write_typed(out);
    out.extend_from_slice(b"}\n");
}

fn event_line_value(out: &mut Vec<u8>, kind: &str, obj: &Value) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut *out, obj).unwrap();
    out.extend_from_slice(b"}\n");
}

impl WatchStream {
    fn render(&mut self, p: Pending, out: &mut Vec<u8>) {
        match p {
            Pending::Added(o) => {
                if self.filter.matches(&o) {
                    event_line(out, "ADDED", &o);
                }
            }
            Pending::Change(c) => {
                if self.bookmark_cap.is_some_and(|cap| c.rv > cap) {
                    self.bookmark_cap = None;
                }
                let cur = self.filter.matches(&c.obj);
                let old = c.prev.as_ref().is_some_and(|p| self.filter.matches(p));
                match c.kind {
                    ChangeKind::Added if cur => event_line(out, "ADDED", &c.obj),
                    ChangeKind::Deleted if cur => event_line(out, "DELETED", &c.obj),
                    ChangeKind::Modified => match (cur, old) {
                        (true, true) => event_line(out, "MODIFIED", &c.obj),
                        (true, false) => event_line(out, "ADDED", &c.obj),
                        // Leaving the selection is a deletion for this watcher, as the
                        // watch cache tells it: the old object at the new revision.
                        (false, true) => {
                            let mut prev = c.prev.as_ref().unwrap().value();
                            prev["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                            event_line_value(out, "DELETED", &prev);
                        }
                        (false, false) => {}
                    },
                    _ => {}
                }
            }
            Pending::Compacted(rv) => self.bookmark_cap = Some(rv),
            Pending::Bookmark { rv, initial_end } => {
                let rv = self.bookmark_cap.map_or(rv, |cap| cap.min(rv));
                let mut meta = json!({"resourceVersion": rv.max(self.start_rv).to_string()});
                if initial_end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                event_line_value(
                    out,
                    "BOOKMARK",
                    &json!({"kind": self.ty.kind, "apiVersion": self.ty.api_version(), "metadata": meta}),
                );
            }
            Pending::Error(status) => event_line_value(out, "ERROR", &status),
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            if self.done {
                return None;
            }
            let mut buf = Vec::new();
            while buf.len() < 64 * 1024 {
                let Some(p) = self.pending.pop_front() else {
                    break;
                };
                self.render(p, &mut buf);
            }
            if !buf.is_empty() {
                return Some(Ok(Bytes::from(buf)));
            }
            if !self.pending.is_empty() {
                continue;
            }
            if self.end_after_pending {
                self.done = true;
                return None;
            }
            let rx = self.rx.as_mut()?;
            tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => {
                    // timeoutSeconds: a clean end of the response, as the real server's.
                    self.done = true;
                    return None;
                }
                _ = async { self.bookmarks.as_mut().unwrap().tick().await }, if self.bookmarks.is_some() => {
                    // Under the lock every change up to the current revision is already in
                    // the channel, so a bookmark after them never claims a revision this
                    // watcher has not been sent.
                    let mut aborted = false;
                    {
                        let st = self.shared.lock();
                        let rx = self.rx.as_mut().unwrap();
                        while let Ok(item) = rx.try_recv() {
                            match item {
                                WatchItem::Change(c) => self.pending.push_back(Pending::Change(c)),
                                WatchItem::Compacted(rv) => self.pending.push_back(Pending::Compacted(rv)),
                                WatchItem::Abort => aborted = true,
                            }
                        }
                        self.pending.push_back(Pending::Bookmark { rv: st.rv, initial_end: false });
                    }
                    if aborted {
                        return self.abort();
                    }
                }
                item = rx.recv() => match item {
                    Some(WatchItem::Change(c)) => self.pending.push_back(Pending::Change(c)),
                    Some(WatchItem::Compacted(rv)) => self.pending.push_back(Pending::Compacted(rv)),
                    Some(WatchItem::Abort) | None => return self.abort(),
                }
            }
        }
    }

    fn abort(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        self.done = true;
        // An error from the body makes hyper drop the connection mid-response: what a
        // client sees when the apiserver or a load balancer goes away.
        Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "watch broken by the test",
        )))
    }
}

/// A watch: the chunks of its response body, or why not (before any is sent).
pub(crate) fn watch(
    shared: &Arc<Shared>,
    ri: usize,
    filter: Filter,
    q: &Query,
) -> Result<impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, ApiError> {
    let rv_param = q.get("resourceVersion").filter(|s| !s.is_empty());
    let start_rv = rv_param.map(parse_rv).transpose()?.unwrap_or(0);
    let send_initial = q.flag("sendInitialEvents");
    let bookmarks_allowed = q.flag("allowWatchBookmarks");
    if send_initial && (q.get("resourceVersionMatch") != Some("NotOlderThan") || !bookmarks_allowed)
    {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan and allowWatchBookmarks to true",
        ));
    }
    // Without timeoutSeconds the real server picks one between its --min-request-timeout
    // (1800 s) and twice that.
    let timeout = match q.get("timeoutSeconds") {
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        None => 1800,
    };

    let mut st = shared.lock();
    if !send_initial && start_rv > st.rv {
        return Err(too_large(start_rv, st.rv));
    }
    let ty = st.resources[ri].ty.clone();
    let mut pending = VecDeque::new();
    let mut rx = None;
    let mut end_after_pending = false;
    if send_initial || start_rv == 0 {
        // "Get state and start at most recent": synthetic ADDED events for what is there.
        for o in st.resources[ri].objects.values() {
            pending.push_back(Pending::Added(o.clone()));
        }
        if send_initial {
            pending.push_back(Pending::Bookmark {
                rv: st.rv,
                initial_end: true,
            });
        }
    } else if start_rv < st.resources[ri].floor {
        let floor = st.resources[ri].floor;
        pending.push_back(Pending::Error(
            ApiError::expired(format!("too old resource version: {start_rv} ({floor})")).to_value(),
        ));
        end_after_pending = true;
    } else {
        let res = &st.resources[ri];
        let first = res.history.partition_point(|c| c.rv <= start_rv);
        for c in res.history.range(first..) {
            pending.push_back(Pending::Change(c.clone()));
        }
    }
    if !end_after_pending {
        let (tx, r) = mpsc::unbounded_channel();
        st.resources[ri].watchers.push(tx);
        rx = Some(r);
    }
    let current = st.rv;
    drop(st);

    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    let period = shared.bookmark_interval;
    let stream = WatchStream {
        shared: shared.clone(),
        ty,
        filter,
        pending,
        rx,
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
        bookmarks: bookmarks_allowed
            .then(|| tokio::time::interval_at(tokio::time::Instant::now() + period, period)),
        start_rv: if send_initial {
            0
        } else {
            start_rv.min(current)
        },
        bookmark_cap: None,
        end_after_pending,
        done: false,
    };
    Ok(futures::stream::unfold(stream, |mut s| async move {
        s.next_chunk().await.map(|chunk| (chunk, s))
    }))
}
