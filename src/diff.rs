//! The JSON patch between a pod and its mutated copy, without converting all of both to JSON.
//!
//! The patch is `json_patch::diff` of the two documents, always. What this module saves is
//! the work around it: converting two whole pods to `serde_json::Value` and comparing them
//! node by node cost more than parsing the review. `json_patch::diff` gives no operation
//! for equal subtrees, visits object keys in the same order whatever else the object
//! holds, and pairs list elements by index. So the diff is the same when both documents
//! leave out an object key whose values are equal, and when a list element equal on both
//! sides becomes `null` on both (its index stays). Equality is decided on the typed values
//! (lists of containers) or on the JSON text each side serialises to (every other field),
//! and only what differs is converted to `Value`.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde::ser::{self, Impossible, Serialize};
use serde_json::{Map, Value};

/// The two container lists, compared element by element on the typed values.
const LISTS: [&str; 2] = ["containers", "initContainers"];

/// `{"metadata": {"annotations": ..}, "spec": ..}` of `before` and of `after`, with what is
/// equal on both sides left out. The caller has checked that nothing else differs.
pub fn annotations_and_spec(before: &Pod, after: &Pod) -> serde_json::Result<(Value, Value)> {
    let (mut b, mut a) = (Map::new(), Map::new());
    let (ba, aa) = (&before.metadata.annotations, &after.metadata.annotations);
    let (mut bm, mut am) = (Map::new(), Map::new());
    if ba != aa {
        if let Some(x) = ba {
            bm.insert("annotations".into(), serde_json::to_value(x)?);
        }
        if let Some(x) = aa {
            am.insert("annotations".into(), serde_json::to_value(x)?);
        }
    }
    b.insert("metadata".into(), Value::Object(bm));
    a.insert("metadata".into(), Value::Object(am));
    match (&before.spec, &after.spec) {
        (Some(bs), Some(as_)) => {
            if bs != as_ {
                let (x, y) = spec(bs, as_)?;
                b.insert("spec".into(), x);
                a.insert("spec".into(), y);
            }
        }
        (bs, as_) => {
            if let Some(s) = bs {
                b.insert("spec".into(), serde_json::to_value(s)?);
            }
            if let Some(s) = as_ {
                a.insert("spec".into(), serde_json::to_value(s)?);
            }
        }
    }
    Ok((Value::Object(b), Value::Object(a)))
}

fn spec(before: &PodSpec, after: &PodSpec) -> serde_json::Result<(Value, Value)> {
    let (bf, af) = (Fields::of(before, &LISTS)?, Fields::of(after, &LISTS)?);
    let (mut b, mut a) = prune(&bf, &af)?;
    let lists = [
        (
            LISTS[0],
            Some(before.containers.as_slice()),
            Some(after.containers.as_slice()),
        ),
        (
            LISTS[1],
            before.init_containers.as_deref(),
            after.init_containers.as_deref(),
        ),
    ];
    for (key, bl, al) in lists {
        // Present in the JSON exactly when the serialiser wrote the key.
        let bl = bl.filter(|_| bf.has(key));
        let al = al.filter(|_| af.has(key));
        if bl == al {
            continue;
        }
        let (x, y) = match (bl, al) {
            (Some(bl), Some(al)) => {
                let (x, y) = containers(bl, al)?;
                (Some(x), Some(y))
            }
            (bl, al) => (
                bl.map(serde_json::to_value).transpose()?,
                al.map(serde_json::to_value).transpose()?,
            ),
        };
        if let Some(x) = x {
            b.insert(key.into(), x);
        }
        if let Some(y) = y {
            a.insert(key.into(), y);
        }
    }
    Ok((Value::Object(b), Value::Object(a)))
}

fn containers(before: &[Container], after: &[Container]) -> serde_json::Result<(Value, Value)> {
    let n = before.len().max(after.len());
    let (mut b, mut a) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        match (before.get(i), after.get(i)) {
            (Some(x), Some(y)) if x == y => {
                b.push(Value::Null);
                a.push(Value::Null);
            }
            (Some(x), Some(y)) => {
                let (x, y) = prune(&Fields::of(x, &[])?, &Fields::of(y, &[])?)?;
                b.push(Value::Object(x));
                a.push(Value::Object(y));
            }
            // Removed: the diff names only the index.
            (Some(_), None) => b.push(Value::Null),
            (None, Some(y)) => a.push(serde_json::to_value(y)?),
            (None, None) => {}
        }
    }
    Ok((Value::Array(b), Value::Array(a)))
}

/// The fields whose JSON differs, as objects of `Value`s.
fn prune(
    before: &Fields,
    after: &Fields,
) -> serde_json::Result<(Map<String, Value>, Map<String, Value>)> {
    let one = |mine: &Fields, theirs: &Fields| -> serde_json::Result<Map<String, Value>> {
        let mut out = Map::new();
        for (key, text) in mine.iter() {
            let Some(text) = text else { continue };
            if theirs.text(key) != Some(text) {
                out.insert(key.into(), serde_json::from_slice(text)?);
            }
        }
        Ok(out)
    };
    Ok((one(before, after)?, one(after, before)?))
}

/// A struct's fields in the order its `Serialize` writes them, each as JSON text (or
/// `None` for a key in the skip list, written but not serialised).
struct Fields {
    text: Vec<u8>,
    fields: Vec<(&'static str, Option<std::ops::Range<usize>>)>,
}

impl Fields {
    fn of<T: Serialize>(value: &T, skip: &[&'static str]) -> serde_json::Result<Fields> {
        let mut f = Fields {
            text: Vec::with_capacity(1024),
            fields: Vec::with_capacity(16),
        };
        value.serialize(Splitter { out: &mut f, skip })?;
        Ok(f)
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, Option<&[u8]>)> + '_ {
        self.fields
            .iter()
            .map(|(k, r)| (*k, r.clone().map(|r| &self.text[r])))
    }

    fn text(&self, key: &str) -> Option<&[u8]> {
        self.iter().find(|(k, _)| *k == key).and_then(|(_, t)| t)
    }

    fn has(&self, key: &str) -> bool {
        self.fields.iter().any(|(k, _)| *k == key)
    }
}

/// A serde serialiser for one struct: it records each field's JSON text.
struct Splitter<'a> {
    out: &'a mut Fields,
    skip: &'a [&'static str],
}

fn not_a_struct() -> serde_json::Error {
    ser::Error::custom("only a struct splits into fields")
}

impl ser::SerializeStruct for Splitter<'_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> serde_json::Result<()> {
        if self.skip.contains(&key) {
            self.out.fields.push((key, None));
            return Ok(());
        }
        let start = self.out.text.len();
        serde_json::to_writer(&mut self.out.text, value)?;
        self.out
            .fields
            .push((key, Some(start..self.out.text.len())));
        Ok(())
    }

    fn end(self) -> serde_json::Result<()> {
        Ok(())
    }
}

macro_rules! refuse {
    ($($name:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $arg),*) -> serde_json::Result<()> { Err(not_a_struct()) })*
    };
}

impl<'a> ser::Serializer for Splitter<'a> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Impossible<(), serde_json::Error>;
    type SerializeTuple = Impossible<(), serde_json::Error>;
    type SerializeTupleStruct = Impossible<(), serde_json::Error>;
    type SerializeTupleVariant = Impossible<(), serde_json::Error>;
    type SerializeMap = Impossible<(), serde_json::Error>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), serde_json::Error>;

    fn serialize_struct(self, _: &'static str, _: usize) -> serde_json::Result<Self> {
        Ok(self)
    }

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> serde_json::Result<()> {
        Err(not_a_struct())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> serde_json::Result<()> {
        Err(not_a_struct())
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> serde_json::Result<()> {
        Err(not_a_struct())
    }

    fn serialize_seq(self, _: Option<usize>) -> serde_json::Result<Self::SerializeSeq> {
        Err(not_a_struct())
    }

    fn serialize_tuple(self, _: usize) -> serde_json::Result<Self::SerializeTuple> {
        Err(not_a_struct())
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeTupleStruct> {
        Err(not_a_struct())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeTupleVariant> {
        Err(not_a_struct())
    }

    fn serialize_map(self, _: Option<usize>) -> serde_json::Result<Self::SerializeMap> {
        Err(not_a_struct())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeStructVariant> {
        Err(not_a_struct())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(before: &Pod, after: &Pod) -> json_patch::Patch {
        json_patch::diff(
            &serde_json::to_value(before).unwrap(),
            &serde_json::to_value(after).unwrap(),
        )
    }

    fn pruned(before: &Pod, after: &Pod) -> json_patch::Patch {
        let (b, a) = annotations_and_spec(before, after).unwrap();
        json_patch::diff(&b, &a)
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
        let mut variants: Vec<Box<dyn Fn(&mut Value)>> = vec![];
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

    #[test]
    fn only_a_struct_splits() {
        assert!(Fields::of(&5, &[]).is_err());
        assert!(Fields::of(&vec![1], &[]).is_err());
        let f = Fields::of(&Container::default(), &[]).unwrap();
        assert_eq!(f.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["name"]);
    }
}
