//! The JSON patch between a pod and its mutated self, without converting either to `Value`.
//!
//! The patch is `json_patch::diff` of the two documents, always. What this module saves is
//! the work around it: converting two whole pods to `serde_json::Value` and comparing them
//! node by node cost more than parsing the review. Instead each pod is written once as JSON
//! text, with an index of where each object member and list element starts and ends
//! ([`Snapshot`]). Two subtrees with the same text are equal, so `json_patch::diff` would
//! give no operation for them. It also visits object keys in the same order whatever else
//! the object holds, pairs list elements by index, and names only the path of what it
//! removes. So the diff is the same over two smaller documents: where a member is equal on
//! both sides it is left out of both, where a list element is equal it becomes `null` on
//! both (its index stays), and what is removed becomes `null`. Only what differs is parsed
//! back into `Value`, and `json_patch::diff` runs over that.

use std::io::{self, Write};
use std::ops::Range;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use serde_json::{Map, Value};

/// A value's JSON text (exactly what `serde_json::to_vec` writes) and an index of it.
pub struct Snapshot {
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
    pub fn of<T: Serialize>(value: &T) -> serde_json::Result<Snapshot> {
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

    pub fn text(&self) -> &[u8] {
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

    fn member(&self, n: usize, key: &[u8]) -> Option<usize> {
        self.children(n).find(|&c| self.key(c) == key)
    }

    fn value(&self, n: usize) -> serde_json::Result<Value> {
        serde_json::from_slice(self.span(n))
    }
}

/// The JSON patch from `before` to `after`: `json_patch::diff` of their documents.
pub fn patch(before: &Snapshot, after: &Snapshot) -> serde_json::Result<json_patch::Patch> {
    if before.text == after.text {
        return Ok(json_patch::Patch::default());
    }
    let (b, a) = prune(before, 0, after, 0)?;
    Ok(json_patch::diff(&b, &a))
}

/// The two values at `bn` and `an` (whose texts differ), with what is equal left out.
fn prune(b: &Snapshot, bn: usize, a: &Snapshot, an: usize) -> serde_json::Result<(Value, Value)> {
    match (b.nodes[bn].kind, a.nodes[an].kind) {
        (Kind::Object, Kind::Object) => {
            let (mut bm, mut am) = (Map::new(), Map::new());
            for ac in a.children(an) {
                let key = a.key(ac);
                match b.member(bn, key) {
                    Some(bc) if b.span(bc) == a.span(ac) => {}
                    Some(bc) => {
                        let (x, y) = prune(b, bc, a, ac)?;
                        let key = decode_key(key)?;
                        bm.insert(key.clone(), x);
                        am.insert(key, y);
                    }
                    None => {
                        am.insert(decode_key(key)?, a.value(ac)?);
                    }
                }
            }
            for bc in b.children(bn) {
                if a.member(an, b.key(bc)).is_none() {
                    bm.insert(decode_key(b.key(bc))?, Value::Null);
                }
            }
            Ok((Value::Object(bm), Value::Object(am)))
        }
        (Kind::Array, Kind::Array) => {
            let (mut bl, mut al) = (vec![], vec![]);
            let (mut bi, mut ai) = (b.children(bn), a.children(an));
            loop {
                match (bi.next(), ai.next()) {
                    (Some(x), Some(y)) if b.span(x) == a.span(y) => {
                        bl.push(Value::Null);
                        al.push(Value::Null);
                    }
                    (Some(x), Some(y)) => {
                        let (x, y) = prune(b, x, a, y)?;
                        bl.push(x);
                        al.push(y);
                    }
                    (Some(_), None) => bl.push(Value::Null),
                    (None, Some(y)) => al.push(a.value(y)?),
                    (None, None) => break,
                }
            }
            Ok((Value::Array(bl), Value::Array(al)))
        }
        _ => Ok((b.value(bn)?, a.value(an)?)),
    }
}

/// The patch as JSON text: the bytes `serde_json::to_vec(patch)` writes, without going
/// through serde's internally tagged enum, which cost as much as the diff.
pub fn patch_json(patch: &json_patch::Patch) -> serde_json::Result<Vec<u8>> {
    use json_patch::PatchOperation as Op;
    let mut out = Vec::with_capacity(256);
    out.push(b'[');
    for (i, op) in patch.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let (name, value) = match op {
            Op::Add(o) => ("add", Some(&o.value)),
            Op::Remove(_) => ("remove", None),
            Op::Replace(o) => ("replace", Some(&o.value)),
            other => {
                serde_json::to_writer(&mut out, other)?;
                continue;
            }
        };
        out.extend_from_slice(b"{\"op\":\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",\"path\":");
        serde_json::to_writer(&mut out, op.path().as_str())?;
        if let Some(v) = value {
            out.extend_from_slice(b",\"value\":");
            serde_json::to_writer(&mut out, v)?;
        }
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
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

    fn full(before: &Pod, after: &Pod) -> json_patch::Patch {
        json_patch::diff(
            &serde_json::to_value(before).unwrap(),
            &serde_json::to_value(after).unwrap(),
        )
    }

    fn pruned<T: Serialize>(before: &T, after: &T) -> json_patch::Patch {
        let (b, a) = (Snapshot::of(before).unwrap(), Snapshot::of(after).unwrap());
        assert_eq!(b.text(), serde_json::to_vec(before).unwrap());
        assert_eq!(a.text(), serde_json::to_vec(after).unwrap());
        let p = patch(&b, &a).unwrap();
        assert_eq!(patch_json(&p).unwrap(), serde_json::to_vec(&p).unwrap());
        p
    }

    #[test]
    fn patch_json_is_serdes() {
        let p: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/a~1b/~0c/0", "value": {"x": [1, "\u{1}"]}},
            {"op": "remove", "path": "/é"},
            {"op": "replace", "path": "", "value": null},
            {"op": "move", "from": "/a", "path": "/b"},
            {"op": "copy", "from": "/a", "path": "/b"},
            {"op": "test", "path": "/a", "value": 1},
        ]))
        .unwrap();
        assert_eq!(patch_json(&p).unwrap(), serde_json::to_vec(&p).unwrap());
        let empty = json_patch::Patch::default();
        assert_eq!(patch_json(&empty).unwrap(), b"[]");
    }

    fn fixture_pods() -> Vec<Value> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/apiserver-v1.36");
        let mut out = vec![];
        for entry in std::fs::read_dir(dir).unwrap() {
            let v: Value =
                serde_json::from_slice(&std::fs::read(entry.unwrap().path()).unwrap()).unwrap();
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
    /// annotations changed. The pruned diff is the plain diff each time.
    #[test]
    fn pruned_diff_is_the_full_diff() {
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
        for (i, p) in pods.iter().enumerate() {
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
                    pruned(&before, &after),
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
                assert_eq!(pruned(x, y), json_patch::diff(x, y), "{x} -> {y}");
            }
        }
    }
}
