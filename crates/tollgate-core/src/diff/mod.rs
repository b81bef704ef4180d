//! The JSON patch between a pod and its mutated self, without converting either to `Value`.
//!
//! The patch is what `json_patch::diff` of the two JSON documents gives: the same
//! operations, paths and values, in the same order (the tests hold it to that, over every
//! fixture pod changed in every field, one at a time and several at once). What this module
//! saves is the work around it: converting two whole pods to `serde_json::Value`, comparing
//! them node by node, cloning the values into operations and serialising those cost more
//! than parsing the review. Instead each pod is written once as JSON text, with an index of
//! where each object member and list element starts and ends ([`Snapshot`]). Two subtrees
//! with the same text are equal, so they are skipped with one comparison of bytes; the
//! walk descends only where the texts differ, and an operation's value is copied from the
//! mutated pod's text as it stands.
//!
//! The patch is written from the typed pod, whose JSON can differ from the object the
//! apiserver sent where the typed model reads an absent field as empty: [`anchor`] repairs
//! a patch so that it applies to the object as sent.

mod anchor;

pub(crate) use anchor::to_sent_object;

use std::fmt::Write as _;
use std::io::{self, Write};
use std::ops::Range;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// A value's JSON text (exactly what `serde_json::to_vec` writes) and an index of it.
pub(crate) struct Snapshot {
    text: Vec<u8>,
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Scalar,
    Object,
    Array,
}

/// One JSON value in the text. Children are linked rather than listed, so that indexing
/// allocates nothing per node.
#[derive(Debug, Clone)]
struct Node {
    span: Range<usize>,
    /// The member's key as written, quotes included (empty for list elements and the root).
    key: Range<usize>,
    kind: Kind,
    first_child: Option<u32>,
    next_sibling: Option<u32>,
}

impl Snapshot {
    pub(crate) fn of<T: Serialize>(value: &T) -> serde_json::Result<Snapshot> {
        let mut indexer = Indexer {
            text: Vec::with_capacity(4096),
            nodes: Vec::with_capacity(256),
            open: Vec::with_capacity(16),
            key: 0..0,
        };
        indexer.open_node();
        // The formatter writes into its own buffer, where it can see positions; the
        // serialiser's writer gets nothing.
        let mut ser = serde_json::Serializer::with_formatter(io::sink(), &mut indexer);
        value.serialize(&mut ser)?;
        indexer.close_node();
        Ok(Snapshot {
            text: indexer.text,
            nodes: indexer.nodes,
        })
    }

    #[cfg(test)]
    pub(crate) fn text(&self) -> &[u8] {
        &self.text
    }

    fn span(&self, n: usize) -> &[u8] {
        &self.text[self.nodes[n].span.clone()]
    }

    fn key(&self, n: usize) -> &[u8] {
        &self.text[self.nodes[n].key.clone()]
    }

    fn children(&self, n: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.nodes[n].first_child, move |&c| {
            self.nodes[c as usize].next_sibling
        })
        .map(|c| c as usize)
    }
}

/// The JSON patch from `before` to `after` as JSON text: the operations `json_patch::diff`
/// of the two documents gives, in its order, with each value copied from `after`'s text.
/// None when there are none.
///
/// The same walk as [`json_patch::diff`] (members in key order, then removals; list
/// elements by index, removals from the end shifting as there), over the two texts. A
/// value is `after`'s JSON as serialised, so its object keys may come in another order
/// than `Value` would write them; as JSON it is the same value.
pub(crate) fn patch_text(
    before: &Snapshot,
    after: &Snapshot,
) -> serde_json::Result<Option<Vec<u8>>> {
    if before.text == after.text {
        return Ok(None);
    }
    let mut w = OpWriter {
        out: Vec::with_capacity(512),
        path: String::with_capacity(64),
    };
    w.out.push(b'[');
    w.diff(before, 0, after, 0)?;
    w.out.push(b']');
    Ok((w.out.len() > 2).then_some(w.out))
}

struct OpWriter {
    out: Vec<u8>,
    /// The JSON pointer of the value being compared, unescaped for JSON.
    path: String,
}

impl OpWriter {
    fn diff(&mut self, b: &Snapshot, bn: usize, a: &Snapshot, an: usize) -> serde_json::Result<()> {
        match (b.nodes[bn].kind, a.nodes[an].kind) {
            (Kind::Object, Kind::Object) => {
                // Both sides in key order, joined in one pass: a map of thousands of
                // annotations costs a sort, not a search per key.
                let (bm, am) = (sorted_members(b, bn)?, sorted_members(a, an)?);
                let mut removed = vec![];
                let mut j = 0;
                for (key, ac) in &am {
                    while j < bm.len() && bm[j].0 < *key {
                        removed.push(j);
                        j += 1;
                    }
                    let len = self.push_key(key);
                    match bm.get(j).filter(|(k, _)| k == key) {
                        Some(&(_, bc)) => {
                            j += 1;
                            if b.span(bc) != a.span(*ac) {
                                self.diff(b, bc, a, *ac)?;
                            }
                        }
                        None => self.op("add", Some(a.span(*ac)))?,
                    }
                    self.path.truncate(len);
                }
                removed.extend(j..bm.len());
                for i in removed {
                    let len = self.push_key(&bm[i].0);
                    self.op("remove", None)?;
                    self.path.truncate(len);
                }
            }
            (Kind::Array, Kind::Array) => {
                let (mut bi, mut ai) = (b.children(bn), a.children(an));
                let mut shift = 0;
                for idx in 0.. {
                    let (x, y) = (bi.next(), ai.next());
                    if x.is_none() && y.is_none() {
                        break;
                    }
                    let len = self.path.len();
                    let _ = write!(self.path, "/{}", idx - shift);
                    match (x, y) {
                        (Some(x), Some(y)) if b.span(x) == a.span(y) => {}
                        (Some(x), Some(y)) => self.diff(b, x, a, y)?,
                        (Some(_), None) => {
                            shift += 1;
                            self.op("remove", None)?;
                        }
                        (None, Some(y)) => self.op("add", Some(a.span(y)))?,
                        (None, None) => {}
                    }
                    self.path.truncate(len);
                }
            }
            _ if b.span(bn) == a.span(an) => {}
            _ => self.op("replace", Some(a.span(an)))?,
        }
        Ok(())
    }

    /// Appends `/key`, escaped for a JSON pointer; returns the length to truncate back to.
    fn push_key(&mut self, key: &str) -> usize {
        let len = self.path.len();
        self.path.push('/');
        for ch in key.chars() {
            match ch {
                '~' => self.path.push_str("~0"),
                '/' => self.path.push_str("~1"),
                c => self.path.push(c),
            }
        }
        len
    }

    fn op(&mut self, name: &str, value: Option<&[u8]>) -> serde_json::Result<()> {
        // `out` holds `[` and the operations so far.
        if self.out.len() > 1 {
            self.out.push(b',');
        }
        self.out.extend_from_slice(b"{\"op\":\"");
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\",\"path\":");
        serde_json::to_writer(&mut self.out, self.path.as_str())?;
        if let Some(v) = value {
            self.out.extend_from_slice(b",\"value\":");
            self.out.extend_from_slice(v);
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// An object's members, decoded keys in `String` order (what a `serde_json::Map` iterates).
fn sorted_members(s: &Snapshot, n: usize) -> serde_json::Result<Vec<(String, usize)>> {
    let mut members = s
        .children(n)
        .map(|c| Ok((decode_key(s.key(c))?, c)))
        .collect::<serde_json::Result<Vec<_>>>()?;
    members.sort_unstable_by(|x, y| x.0.cmp(&y.0));
    Ok(members)
}

fn decode_key(raw: &[u8]) -> serde_json::Result<String> {
    match raw {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'\\') => {
            String::from_utf8(inner.to_vec()).map_err(serde::de::Error::custom)
        }
        _ => serde_json::from_slice(raw),
    }
}

/// A compact JSON formatter that writes into its own buffer and records where each value
/// starts and ends.
struct Indexer {
    text: Vec<u8>,
    nodes: Vec<Node>,
    /// The values being written, innermost last, each with its last child so far.
    open: Vec<(u32, Option<u32>)>,
    key: Range<usize>,
}

impl Indexer {
    fn open_node(&mut self) {
        let start = self.text.len();
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            span: start..start,
            key: std::mem::replace(&mut self.key, 0..0),
            kind: Kind::Scalar,
            first_child: None,
            next_sibling: None,
        });
        if let Some((parent, last)) = self.open.last_mut() {
            match *last {
                Some(prev) => self.nodes[prev as usize].next_sibling = Some(id),
                None => self.nodes[*parent as usize].first_child = Some(id),
            }
            *last = Some(id);
        }
        self.open.push((id, None));
    }

    fn close_node(&mut self) {
        if let Some((id, _)) = self.open.pop() {
            self.nodes[id as usize].span.end = self.text.len();
        }
    }

    fn set_kind(&mut self, kind: Kind) {
        if let Some((id, _)) = self.open.last() {
            self.nodes[*id as usize].kind = kind;
        }
    }
}

macro_rules! forward {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $name<W: ?Sized + Write>(&mut self, _: &mut W, $($arg: $ty),*) -> io::Result<()> {
            CompactFormatter.$name(&mut self.text, $($arg),*)
        })*
    };
}

impl Formatter for &mut Indexer {
    forward! {
        write_null();
        write_bool(v: bool);
        write_i8(v: i8);
        write_i16(v: i16);
        write_i32(v: i32);
        write_i64(v: i64);
        write_i128(v: i128);
        write_u8(v: u8);
        write_u16(v: u16);
        write_u32(v: u32);
        write_u64(v: u64);
        write_u128(v: u128);
        write_f32(v: f32);
        write_f64(v: f64);
        write_number_str(v: &str);
        begin_string();
        end_string();
        write_string_fragment(v: &str);
        write_char_escape(v: CharEscape);
        write_byte_array(v: &[u8]);
        write_raw_fragment(v: &str);
        end_array();
        end_object();
    }

    fn begin_array<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.set_kind(Kind::Array);
        CompactFormatter.begin_array(&mut self.text)
    }

    fn begin_object<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.set_kind(Kind::Object);
        CompactFormatter.begin_object(&mut self.text)
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, _: &mut W, first: bool) -> io::Result<()> {
        CompactFormatter.begin_array_value(&mut self.text, first)?;
        self.open_node();
        Ok(())
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.close_node();
        Ok(())
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, _: &mut W, first: bool) -> io::Result<()> {
        CompactFormatter.begin_object_key(&mut self.text, first)?;
        self.key = self.text.len()..self.text.len();
        Ok(())
    }

    fn end_object_key<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.key.end = self.text.len();
        Ok(())
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        CompactFormatter.begin_object_value(&mut self.text)?;
        self.open_node();
        Ok(())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.close_node();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::Value;

    fn full(before: &Pod, after: &Pod) -> json_patch::Patch {
        json_patch::diff(
            &serde_json::to_value(before).unwrap(),
            &serde_json::to_value(after).unwrap(),
        )
    }

    fn text_patch<T: Serialize>(before: &T, after: &T) -> json_patch::Patch {
        let (b, a) = (Snapshot::of(before).unwrap(), Snapshot::of(after).unwrap());
        assert_eq!(b.text(), serde_json::to_vec(before).unwrap());
        assert_eq!(a.text(), serde_json::to_vec(after).unwrap());
        match patch_text(&b, &a).unwrap() {
            Some(t) => serde_json::from_slice(&t).unwrap(),
            None => json_patch::Patch::default(),
        }
    }

    fn fixture_pods() -> Vec<Value> {
        let dir = crate::testdata::fixtures_dir();
        let mut out = vec![];
        for entry in std::fs::read_dir(dir).unwrap() {
            let body = std::fs::read(entry.unwrap().path()).unwrap();
            if !crate::testdata::is_pod_review(&body) {
                continue;
            }
            let v: Value = serde_json::from_slice(&body).unwrap();
            for key in ["/request/object", "/request/oldObject"] {
                if let Some(o) = v.pointer(key).filter(|o| !o.is_null()) {
                    let mut o = o.clone();
                    o["metadata"]
                        .as_object_mut()
                        .unwrap()
                        .remove("managedFields");
                    out.push(o);
                }
            }
        }
        out
    }

    /// Every way the after-pod can differ from the before-pod, one at a time and a few at
    /// once: each field of the spec and of each container removed, or replaced by that
    /// field of another pod or container; containers added, removed, reordered; the
    /// annotations changed. The patch from the texts is the plain diff each time.
    ///
    /// In two halves (the even and the odd pods), which run on two threads: ten seconds of
    /// a debug build in one test were the unit tests' tail.
    #[test]
    fn text_patch_is_the_full_diff_even_pods() {
        text_patch_is_the_full_diff(0);
    }

    #[test]
    fn text_patch_is_the_full_diff_odd_pods() {
        text_patch_is_the_full_diff(1);
    }

    fn text_patch_is_the_full_diff(half: usize) {
        let pods = fixture_pods();
        assert!(pods.len() >= 12);
        let mut donors: Vec<(String, Value)> = vec![];
        let mut container_donors: Vec<(String, Value)> = vec![];
        for p in &pods {
            for (k, v) in p["spec"].as_object().unwrap() {
                donors.push((k.clone(), v.clone()));
            }
            for c in p["spec"]["containers"].as_array().unwrap() {
                for (k, v) in c.as_object().unwrap() {
                    container_donors.push((k.clone(), v.clone()));
                }
            }
        }
        type Change = Box<dyn Fn(&mut Value)>;
        let mut variants: Vec<Change> = vec![];
        for (k, v) in donors {
            let k2 = k.clone();
            variants.push(Box::new(move |p| {
                p["spec"].as_object_mut().unwrap().remove(&k2);
            }));
            variants.push(Box::new(move |p| {
                p["spec"][&k] = v.clone();
            }));
        }
        for (k, v) in container_donors {
            for list in ["containers", "initContainers"] {
                let (k, v, k2) = (k.clone(), v.clone(), k.clone());
                variants.push(Box::new(move |p| {
                    if let Some(l) = p["spec"][list].as_array_mut() {
                        if let Some(c) = l.last_mut() {
                            c[&k] = v.clone();
                        }
                    }
                }));
                variants.push(Box::new(move |p| {
                    if let Some(l) = p["spec"][list].as_array_mut() {
                        if let Some(c) = l.first_mut() {
                            c.as_object_mut().unwrap().remove(&k2);
                        }
                    }
                }));
            }
        }
        variants.push(Box::new(|p| {
            let c = p["spec"]["containers"][0].clone();
            if let Some(l) = p["spec"]["containers"].as_array_mut() {
                l.push(c);
            }
        }));
        variants.push(Box::new(|p| {
            if let Some(l) = p["spec"]["containers"].as_array_mut() {
                l.reverse();
            }
        }));
        variants.push(Box::new(|p| {
            p["spec"]["initContainers"] = Value::Array(vec![]);
        }));
        variants.push(Box::new(|p| {
            let c = p["spec"]["containers"][0].clone();
            p["spec"]["initContainers"] = Value::Array(vec![c]);
        }));
        variants.push(Box::new(|p| {
            p["metadata"]["annotations"]["x/y"] = "z".into();
        }));
        variants.push(Box::new(|p| {
            p["metadata"].as_object_mut().unwrap().remove("annotations");
        }));
        let mut checked = 0;
        for (i, p) in pods.iter().enumerate().filter(|(i, _)| i % 2 == half) {
            let before: Pod = serde_json::from_value(p.clone()).unwrap();
            for (j, change) in variants.iter().enumerate() {
                let mut doc = p.clone();
                change(&mut doc);
                // A few at once, too.
                variants[(i * 7 + j * 13) % variants.len()](&mut doc);
                let Ok(after) = serde_json::from_value::<Pod>(doc) else {
                    continue;
                };
                let mut after = after;
                after.metadata.managed_fields = None;
                assert_eq!(
                    text_patch(&before, &after),
                    full(&before, &after),
                    "pod {i} variant {j}"
                );
                checked += 1;
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    /// Keys that need escaping in JSON or in a JSON pointer, values of other types,
    /// lists that grow and shrink.
    #[test]
    fn any_json() {
        let docs = [
            serde_json::json!({"a\"b": 1, "c\\d": [1, 2, 3], "e/f~g": {"h": null}, "ü": "x"}),
            serde_json::json!({"a\"b": 2, "c\\d": [1, 3], "e/f~g": {"h": [true]}, "ü": "y", "n": -1.5}),
            serde_json::json!({"c\\d": [1, 2, 3, 4, {"x": 1}], "e/f~g": "s", "ü": {"v": []}}),
            serde_json::json!([1, {"a": 1, "b": 2}, [3]]),
            serde_json::json!([1, {"a": 1, "b": 3}, [3, 4], 5]),
            serde_json::json!("text"),
            serde_json::json!(null),
            serde_json::json!({}),
            serde_json::json!([]),
        ];
        for x in &docs {
            for y in &docs {
                assert_eq!(text_patch(x, y), json_patch::diff(x, y), "{x} -> {y}");
            }
        }
    }

    /// Thousands of keys, some removed, some added, some changed, interleaved.
    #[test]
    fn large_maps() {
        let before: std::collections::BTreeMap<String, String> = (0..5000)
            .map(|i| (format!("k{i:05}"), format!("v{i}")))
            .collect();
        let mut after = before.clone();
        for i in (0..5000).step_by(7) {
            after.remove(&format!("k{i:05}"));
        }
        for i in (0..5000).step_by(11) {
            after.insert(format!("k{i:05}"), "changed".into());
        }
        for i in 0..50 {
            after.insert(format!("k{i:05}x"), "new".into());
        }
        let (b, a) = (
            serde_json::to_value(&before).unwrap(),
            serde_json::to_value(&after).unwrap(),
        );
        assert_eq!(text_patch(&before, &after), json_patch::diff(&b, &a));
    }
}
