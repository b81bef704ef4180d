//! Lists read item by item as they arrive, never a page whole.
//!
//! kube's client reads a list's page as text whole and copies it before parsing it (and
//! kube's watcher holds the page's objects until they are all handed on): a page of 100
//! nodes as the apiserver sends them is 2.5 MB, held two or three times over for a moment.
//! Here a page is split into its items while its body is read ([`Splitter`]), each item is
//! parsed and handed on as soon as its last byte is in, and only its own bytes are ever
//! held: what a list costs is one item and one chunk of the body, however large the page.
//!
//! - [`PageReader`]: one page of a list, item by item, then its list metadata (the
//!   `continue` token, the resourceVersion).
//! - [`watch`]: what kube's `watcher` does (list, then watch from the list's
//!   resourceVersion with bookmarks, list again after a 410, an idle watch given up after
//!   its timeout), with the list read by [`PageReader`]; its events and errors are kube's
//!   own, so that `cache::drive` and kube's backoff take it as they take kube's.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use http_body_util::BodyExt as _;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::client::Body;
use kube::core::{ListMeta, Status};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// Splits the JSON text of a list (`{"metadata": {...}, "items": [{...}, ...]}`), fed in
/// chunks as it arrives, into its items, each handed over whole once its last byte is in,
/// and keeps its `metadata`. Only the bytes of the item being read are held.
#[derive(Debug, Default)]
pub struct Splitter {
    /// How deep in objects and arrays the next byte is: 1 inside the list's object.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// In the list's object, a member's key comes next (after `{` or `,`).
    expect_key: bool,
    /// Reading a key of the list's object, into `key`.
    reading_key: bool,
    key: Vec<u8>,
    /// Inside the value of the list's `items`.
    in_items: bool,
    /// Reading an item (depth 2) or the metadata (depth 1): it ends where the depth returns
    /// to this.
    capture: Option<(Captured, u32)>,
    /// The bytes of what is being read that earlier chunks held.
    held: Vec<u8>,
    metadata: Option<Vec<u8>>,
    /// The list's object has ended.
    done: bool,
}

/// What a [`Splitter`] is reading whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Captured {
    Item,
    Metadata,
}

/// Text that is not a list's JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the list is not JSON as the apiserver writes it: {0}")]
pub struct SplitError(&'static str);

impl Splitter {
    /// Feeds the next chunk of the list's text; `item` gets each item completed in it.
    pub fn feed<E: From<SplitError>>(
        &mut self,
        chunk: &[u8],
        mut item: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        // Where what is being captured starts in this chunk.
        let mut start = self.capture.map(|_| 0);
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.reading_key = false;
                } else if self.reading_key {
                    self.key.push(b);
                } else {
                    // The rest of a plain run of the string: nothing in it matters.
                    let run = chunk[i..]
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\')
                        .unwrap_or(chunk.len() - i);
                    i += run;
                    continue;
                }
                i += 1;
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.expect_key {
                        self.expect_key = false;
                        self.reading_key = true;
                        self.key.clear();
                    }
                }
                b'{' | b'[' => {
                    match self.depth {
                        0 if b == b'{' && !self.done => self.expect_key = true,
                        0 => return Err(SplitError("it is not an object").into()),
                        1 => {
                            if self.key == b"items" && b == b'[' {
                                self.in_items = true;
                            } else if self.key == b"metadata" && b == b'{' {
                                self.capture = Some((Captured::Metadata, 1));
                                start = Some(i);
                            }
                        }
                        2 if self.in_items && b == b'{' => {
                            self.capture = Some((Captured::Item, 2));
                            start = Some(i);
                        }
                        _ => {}
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    if self.depth == 0 {
                        return Err(SplitError("a bracket closes what was not open").into());
                    }
                    self.depth -= 1;
                    if let Some((what, depth)) = self.capture {
                        if depth == self.depth {
                            let from = start.unwrap_or(0);
                            let bytes = &chunk[from..=i];
                            match what {
                                Captured::Item if self.held.is_empty() => item(bytes)?,
                                Captured::Item => {
                                    self.held.extend_from_slice(bytes);
                                    item(&self.held)?;
                                    self.held.clear();
                                }
                                Captured::Metadata => {
                                    self.held.extend_from_slice(bytes);
                                    self.metadata = Some(std::mem::take(&mut self.held));
                                }
                            }
                            self.capture = None;
                            start = None;
                        }
                    }
                    match self.depth {
                        1 => self.in_items = false,
                        0 => self.done = true,
                        _ => {}
                    }
                }
                b',' if self.depth == 1 => {
                    self.expect_key = true;
                    self.key.clear();
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(from) = start {
            self.held.extend_from_slice(&chunk[from..]);
        }
        Ok(())
    }

    /// The list's metadata, once its text has ended.
    pub fn finish(self) -> Result<ListMeta, SplitError> {
        if !self.done {
            return Err(SplitError("it ended before the list did"));
        }
        Ok(self
            .metadata
            .and_then(|m| serde_json::from_slice(&m).ok())
            .unwrap_or_default())
    }
}

impl From<SplitError> for kube::Error {
    fn from(e: SplitError) -> kube::Error {
        kube::Error::SerdeError(serde::de::Error::custom(e))
    }
}

/// One page of a list, read item by item as its body arrives.
pub struct PageReader<K> {
    body: Body,
    splitter: Splitter,
    /// What an item's JSON is read as.
    decode: fn(&[u8]) -> serde_json::Result<K>,
    /// Items of the last chunk not handed on yet.
    ready: VecDeque<K>,
}

impl<K: DeserializeOwned> PageReader<K> {
    /// Asks for the page of `url` (a list's path, e.g. `/api/v1/nodes`) that `lp` names,
    /// its items parsed as `K`.
    pub async fn open(client: &Client, url: &str, lp: &ListParams) -> Result<Self, kube::Error> {
        Self::open_with(client, url, lp, |item| serde_json::from_slice(item)).await
    }
}

impl<K> PageReader<K> {
    /// [`PageReader::open`], each item read by `decode` (its JSON kept as it came, say).
    pub async fn open_with(
        client: &Client,
        url: &str,
        lp: &ListParams,
        decode: fn(&[u8]) -> serde_json::Result<K>,
    ) -> Result<Self, kube::Error> {
        let request = kube::core::Request::new(url)
            .list(lp)
            .map_err(kube::Error::BuildRequest)?;
        let response = client.send(request.map(Body::from)).await?;
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            // An error's body is a small Status, read whole as kube's client reads it.
            let text = response.into_body().collect().await?.to_bytes();
            let s = serde_json::from_slice::<Status>(&text).unwrap_or_else(|_| {
                Status::failure(
                    &String::from_utf8_lossy(&text),
                    "Failed to parse error data",
                )
                .with_code(status.as_u16())
            });
            return Err(kube::Error::Api(s.boxed()));
        }
        Ok(PageReader {
            body: response.into_body(),
            splitter: Splitter::default(),
            decode,
            ready: VecDeque::new(),
        })
    }

    /// The page's next item; None after its last.
    pub async fn next(&mut self) -> Result<Option<K>, kube::Error> {
        loop {
            if let Some(k) = self.ready.pop_front() {
                return Ok(Some(k));
            }
            let Some(frame) = self.body.frame().await else {
                return Ok(None);
            };
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            let (ready, decode) = (&mut self.ready, self.decode);
            self.splitter.feed(&data, |item| {
                ready.push_back(decode(item).map_err(kube::Error::SerdeError)?);
                Ok::<(), kube::Error>(())
            })?;
        }
    }

    /// The page's list metadata (its `continue` token and resourceVersion), once every item
    /// has been read.
    pub fn finish(self) -> Result<ListMeta, kube::Error> {
        Ok(self.splitter.finish()?)
    }
}

/// Lists `url` a page of `page_size` at a time, handing each item to `each` as it is read.
pub async fn list_all<K: DeserializeOwned>(
    client: &Client,
    url: &str,
    page_size: u32,
    mut each: impl FnMut(K),
) -> Result<ListMeta, kube::Error> {
    let mut lp = ListParams::default().limit(page_size);
    loop {
        let mut page = PageReader::open(client, url, &lp).await?;
        while let Some(k) = page.next().await? {
            each(k);
        }
        let meta = page.finish()?;
        match meta.continue_.as_deref().filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(c),
            None => return Ok(meta),
        }
    }
}

/// How long past its timeout a watch that says nothing is given before it is taken for
/// dead, as kube's watcher does.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The server-side timeout of each watch, kube's watcher's default.
const WATCH_TIMEOUT: u32 = 290;

/// Where [`watch`] is.
enum State<K> {
    /// A list is to begin.
    Empty,
    /// A page of the list is to be asked for.
    Paging { continue_token: Option<String> },
    /// A page is being read.
    Reading(PageReader<K>),
    /// Listed as of this resourceVersion: a watch is to begin from it.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    },
}

/// The events of `api`'s objects as kube's `watcher` gives them (`Init`, `InitApply` for
/// each object listed, `InitDone`, then `Apply` and `Delete`; errors between them, each
/// followed by a retry where it failed), the list read `page_size` objects a page, each
/// page item by item ([`PageReader`]).
pub fn watch<K>(
    api: Api<K>,
    page_size: u32,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let client = api.clone().into_client();
    let url = api.resource_url().to_owned();
    futures::stream::unfold(State::Empty, move |mut state| {
        let (api, client, url) = (api.clone(), client.clone(), url.clone());
        async move {
            loop {
                let (event, next) = step(&api, &client, &url, page_size, state).await;
                state = next;
                if let Some(event) = event {
                    return Some((event, state));
                }
            }
        }
    })
}

/// An object's change seen by a watch, and the watch going on from its resourceVersion (or
/// listing again, if it has none).
#[allow(clippy::type_complexity)]
fn watched<K>(
    resource_version: String,
    stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
    event: watcher::Event<K>,
) -> (Option<Result<watcher::Event<K>, watcher::Error>>, State<K>) {
    if resource_version.is_empty() {
        return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
    }
    let watching = State::Watching {
        resource_version,
        stream,
    };
    (Some(Ok(event)), watching)
}

/// One step of [`watch`]: what it says (if anything) and where it is then.
async fn step<K>(
    api: &Api<K>,
    client: &Client,
    url: &str,
    page_size: u32,
    state: State<K>,
) -> (Option<Result<watcher::Event<K>, watcher::Error>>, State<K>)
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    use watcher::{Error, Event};
    match state {
        State::Empty => (
            Some(Ok(Event::Init)),
            State::Paging {
                continue_token: None,
            },
        ),
        State::Paging { continue_token } => {
            let mut lp = ListParams::default().limit(page_size);
            lp.continue_token = continue_token;
            match PageReader::open(client, url, &lp).await {
                Ok(page) => (None, State::Reading(page)),
                Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
            }
        }
        State::Reading(mut page) => match page.next().await {
            Ok(Some(k)) => (Some(Ok(Event::InitApply(k))), State::Reading(page)),
            Ok(None) => match page.finish() {
                Ok(meta) => {
                    let token = meta.continue_.filter(|c| !c.is_empty());
                    let version = meta.resource_version.filter(|v| !v.is_empty());
                    match (token, version) {
                        (Some(c), _) => (
                            None,
                            State::Paging {
                                continue_token: Some(c),
                            },
                        ),
                        (None, Some(resource_version)) => (
                            Some(Ok(Event::InitDone)),
                            State::Listed { resource_version },
                        ),
                        (None, None) => (Some(Err(Error::NoResourceVersion)), State::Empty),
                    }
                }
                Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
            },
            Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
        },
        State::Listed { resource_version } => {
            let wp = WatchParams::default().timeout(WATCH_TIMEOUT);
            match api.watch(&wp, &resource_version).await {
                Ok(stream) => (
                    None,
                    State::Watching {
                        resource_version,
                        stream: stream.boxed(),
                    },
                ),
                Err(e) => (
                    Some(Err(Error::WatchStartFailed(e))),
                    State::Listed { resource_version },
                ),
            }
        }
        State::Watching {
            resource_version,
            mut stream,
        } => {
            let idle = Duration::from_secs(WATCH_TIMEOUT.into()) + IDLE_MARGIN;
            let next = tokio::time::timeout(idle, stream.next())
                .await
                .ok()
                .flatten();
            let version = |k: &K| k.meta().resource_version.clone().unwrap_or_default();
            match next {
                Some(Ok(WatchEvent::Added(k) | WatchEvent::Modified(k))) => {
                    watched(version(&k), stream, Event::Apply(k))
                }
                Some(Ok(WatchEvent::Deleted(k))) => watched(version(&k), stream, Event::Delete(k)),
                Some(Ok(WatchEvent::Bookmark(b))) => (
                    None,
                    State::Watching {
                        resource_version: b.metadata.resource_version,
                        stream,
                    },
                ),
                // 410: the resourceVersion is gone; list again.
                Some(Ok(WatchEvent::Error(s))) if s.code == 410 => {
                    (Some(Err(Error::WatchError(s.boxed()))), State::Empty)
                }
                Some(Ok(WatchEvent::Error(s))) => (
                    Some(Err(Error::WatchError(s.boxed()))),
                    State::Watching {
                        resource_version,
                        stream,
                    },
                ),
                Some(Err(e)) => (
                    Some(Err(Error::WatchFailed(e))),
                    State::Watching {
                        resource_version,
                        stream,
                    },
                ),
                // Ended (its timeout) or idle too long: watch again from where it was.
                None => (None, State::Listed { resource_version }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Splits `text` fed in chunks of `size`: the items and the metadata.
    fn split(text: &[u8], size: usize) -> (Vec<Value>, ListMeta) {
        let mut s = Splitter::default();
        let mut items = vec![];
        for chunk in text.chunks(size.max(1)) {
            s.feed(chunk, |item| {
                items.push(serde_json::from_slice(item).unwrap());
                Ok::<(), SplitError>(())
            })
            .unwrap();
        }
        (items, s.finish().unwrap())
    }

    /// Whatever the chunks, the items and metadata are what parsing the whole text finds:
    /// strings with escaped quotes, backslashes and brackets, nested arrays, members before
    /// and after the items, pretty-printed or compact.
    #[test]
    fn a_list_is_split_into_its_items_whatever_its_chunks() {
        let list = json!({
            "kind": "NodeList", "apiVersion": "v1",
            "note": {"items": [1, 2], "metadata": "not the list's"},
            "items": [
                {"metadata": {"name": "a\"]}", "labels": {"k": "\\\\"}}, "spec": {"taints": [{"key": "x"}]}},
                {"metadata": {"name": "b,{["}, "status": {"items": [[], {}, "]"]}},
                {}
            ],
            "metadata": {"resourceVersion": "42", "continue": "tok\"en"},
            "tail": [{"items": "x"}]
        });
        for text in [
            serde_json::to_vec(&list).unwrap(),
            serde_json::to_vec_pretty(&list).unwrap(),
        ] {
            for size in [1, 2, 3, 7, 16, 64, 4096] {
                let (items, meta) = split(&text, size);
                assert_eq!(Value::Array(items), list["items"], "chunks of {size}");
                assert_eq!(meta.resource_version.as_deref(), Some("42"));
                assert_eq!(meta.continue_.as_deref(), Some("tok\"en"));
            }
        }
    }

    #[test]
    fn an_empty_or_cut_list_is_told_apart() {
        let (items, meta) = split(br#"{"kind":"NodeList","items":null,"metadata":{}}"#, 5);
        assert!(items.is_empty() && meta.continue_.is_none());
        let (items, _) = split(br#"{"items":[],"metadata":{"resourceVersion":"1"}}"#, 5);
        assert!(items.is_empty());
        let mut s = Splitter::default();
        let mut n = 0;
        s.feed(br#"{"items":[{"a":1},{"b":"#, |_| {
            n += 1;
            Ok::<(), SplitError>(())
        })
        .unwrap();
        assert_eq!(n, 1);
        assert!(s.finish().is_err(), "a list cut short is an error");
        let mut s = Splitter::default();
        assert!(s.feed(b"[1]", |_| Ok::<(), SplitError>(())).is_err());
        let mut s = Splitter::default();
        assert!(s.feed(b"}", |_| Ok::<(), SplitError>(())).is_err());
    }
}
